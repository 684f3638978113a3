"""The decoding step's products (dsh.llm.products): oneDNN only where its result is torch's bit for bit, so the choice
never changes a sample; the products' log that dsh bench reads."""

import pytest
import torch
from tiny_llamas import gqa_llama
from transformers import LlamaForCausalLM

from dsh.llm import products
from dsh.llm.engine import Engine

F = torch.nn.functional


@pytest.mark.parametrize("shape", [(384, 128), (768, 128), (128, 384), (68, 128)])
def test_every_row_count_gives_torchs_product_bit_for_bit(shape):
    """The engine's shapes (the laptop base's fused q/k/v and gate/up, down, LM head) at every row count up to the
    slots: fails if oneDNN were used where it rounds otherwise (on an AMD Zen 4, below 8 rows and at an inner
    dimension of 384)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g)
    p = products.Products(48)
    p.prepare(w)
    x = torch.randn(48, shape[1], generator=g)
    was = torch.get_num_threads()
    splits = products.thread_splits("linear", *shape, 48)
    try:
        for r in range(1, 49):          # torch's two-thread product (a split row count gives it on any threads), or
            torch.set_num_threads(1 if splits.get(r) == products.ONE_THREAD else 2)    # its one-thread one
            want = F.linear(x[:r], w)
            torch.set_num_threads(2)
            assert torch.equal(p.linear(x[:r], w), want), r
    finally:
        torch.set_num_threads(was)
    assert products.plan(*shape, 48) <= set(range(1, 49))


@pytest.mark.parametrize("shape", [(384, 128), (128, 384), (68, 128)])
def test_a_product_written_into_a_buffer_is_the_fresh_products_bits(shape):
    """The engine's products land in buffers it keeps (``out``) and its residual sums in the residual itself: at every
    row count, the same bits as the fresh result (fails if ``out`` took another product path)."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(*shape, generator=g)
    x, r = torch.randn(48, shape[1], generator=g), torch.randn(48, shape[0], generator=g)
    p = products.Products(48)
    p.prepare(w)
    buf = torch.full((48, shape[0]), float("nan"))
    for n in range(1, 49):
        assert torch.equal(p.linear(x[:n], w, out=buf[:n]), p.linear(x[:n], w)), n
        fresh = products._pieces("addmm", x[:n], w, r[:n], h) if (h := products.split_at(
            "addmm", *shape, n, 48)) is not None else torch.addmm(r[:n], x[:n], w.t())
        assert torch.equal(p.add_linear(r[:n].clone(), x[:n], w), fresh), n


def test_a_plan_holds_only_row_counts_where_onednn_agrees():
    """plan's rows, checked again here one by one against oneDNN's own product."""
    if not products.onednn_available():
        assert products.plan(384, 128, 64) == frozenset()
        return
    ops = torch.ops.mkldnn
    g = torch.Generator().manual_seed(2)
    w = torch.randn(384, 128, generator=g)
    packed = ops._reorder_linear_weight(w)
    for r in products.plan(384, 128, 64):
        x = torch.randn(r, 128, generator=g)
        assert torch.equal(ops._linear_pointwise(x, packed, None, "none", [], ""), F.linear(x, w))


@pytest.mark.parametrize("c_step", [True, False])
def test_the_engine_logs_every_product_of_a_step(c_step):
    """Rows, FLOPs and seconds of every product of every step, in the step's order, whether the step runs in C (its
    products timed there) or in Python; and of each C step's attention, its rows, cache bytes read (every row's
    attended keys and values in every layer, float32 here) and seconds."""
    m = gqa_llama()
    eng = Engine(m, [11], slots=4, max_len=32, attention="kernels")
    eng._cpu.c_step = c_step
    log: list = []
    attention: list = []
    eng.log_products(log, attention)
    eng.generate([[1, 2, 3]] * 3, 5, temperature=0)
    per_step = 1 + 4 * 2                                      # q/k/v, output, gate/up, down a layer, and the head
    assert log and len(log) % per_step == 0
    macs = [24 * (24 + 2 * 12), 24 * 24, 24 * 80, 40 * 24] * 2 + [24 * 12]   # one step's products, in order
    for i, (rows, flops, secs) in enumerate(log):
        assert rows == 3 and flops == 2 * rows * macs[i % per_step] and secs > 0
    if c_step:         # the attention of each C step: 3 rows attending 1, 2, ... positions (prompt and completion)
        kv, d = eng._cpu.KV, eng._cpu.D
        assert [(r, b) for r, b, _ in attention] == [(3, 3 * p * 2 * 2 * kv * d * 4) for p in range(1, 3 + 5)]
        assert all(secs > 0 for _, _, secs in attention)
    else:
        assert attention == []
    n = len(log)
    eng.log_products(None)
    eng.generate([[1, 2, 3]], 2, temperature=0)
    assert len(log) == n
    with pytest.raises(ValueError, match="a list or None"):
        eng.log_products(())
    with pytest.raises(ValueError, match="a list or None"):
        eng.log_products([], ())
    with pytest.raises(ValueError, match="CPU path"):
        Engine(m, [11], slots=4, max_len=32, attention="torch").log_products([])


def _torch_product(kind, x, w, r):
    return F.linear(x, w) if kind == "linear" else torch.addmm(r, x, w.t())


@pytest.mark.parametrize("kind", ["linear", "addmm"])
@pytest.mark.parametrize("shape", [(384, 128), (128, 384), (68, 128)])
def test_the_products_are_the_same_on_one_thread_as_on_two(kind, shape):
    """Where torch's own product gives other bits on one thread than on two (MKL, on an AMD Zen 4: 5-7 and 9-11
    rows; on an Intel Xeon: 4-5 or 4-15), the engine takes it in two pieces that give the two-thread result on either
    thread count, or on one thread where no split does; everywhere else it is torch's. Fails if a row count that
    differs is left as it is, or the engine's product differs between thread counts or from torch's."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(*shape, generator=g)
    x, r = torch.randn(48, shape[1], generator=g), torch.randn(48, shape[0], generator=g)
    p = products.Products(48)
    p.prepare(w)
    mine = (lambda n: p.linear(x[:n], w)) if kind == "linear" else (lambda n: p.add_linear(r[:n].clone(), x[:n], w))
    was, got, ref = torch.get_num_threads(), {}, {}
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            got[t] = [mine(n) for n in range(1, 49)]
            ref[t] = [_torch_product(kind, x[:n], w, r[:n]) for n in range(1, 49)]
    finally:
        torch.set_num_threads(was)
    differ = {n for n in range(1, 49) if not torch.equal(ref[1][n - 1], ref[2][n - 1])}
    splits = products.thread_splits(kind, *shape, 48)
    assert differ == set(splits)
    for n in range(1, 49):
        want = ref[1 if splits.get(n) == products.ONE_THREAD else 2][n - 1]
        assert torch.equal(got[1][n - 1], got[2][n - 1]) and torch.equal(got[2][n - 1], want), n


def test_the_engine_samples_the_same_tokens_and_log_probabilities_on_one_thread_as_on_two():
    """The shipped graded base, 64 prompts through 16 slots at T = 1: rows finish at different steps, so the steps run
    at every row count up to 16 (the ones where MKL's product depends on the threads included)."""
    from dsh.llm.models import GRADED_BASE, resolve_model

    m = LlamaForCausalLM.from_pretrained(resolve_model(GRADED_BASE)).eval()
    prompts = [[1] + [3 + (7 * i + j) % 40 for j in range(4 + i % 9)] for i in range(64)]
    was, out = torch.get_num_threads(), {}
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            gens = Engine(m, [m.config.eos_token_id], slots=16, max_len=256).generate(prompts, 120, temperature=1.0)
            out[t] = [(g.tokens, [float(v) for v in g.logprobs]) for g in gens]
    finally:
        torch.set_num_threads(was)
    assert out[1] == out[2]


def test_a_row_count_is_decided_when_it_first_comes(tmp_path, monkeypatch):
    """A product's way (pieces, oneDNN or torch) at a row count is decided at that row count's first product, and
    only there: a generate that meets a few row counts does not probe the others. (A shape no other test uses and a
    cache folder of its own: the decisions are kept per process and on disk.)"""
    monkeypatch.setenv("DSH_CACHE", str(tmp_path))
    g = torch.Generator().manual_seed(4)
    w = torch.randn(37, 23, generator=g)
    p = products.Products(64)
    p.prepare(w)
    split = lambda: {k[3] for k in products._SPLITS if k[1:3] == (37, 23) and k[4] == 64}  # noqa: E731
    timed = lambda: {k[2] for k in products._FASTER if k[:2] == (37, 23)}  # noqa: E731
    assert split() == set() and timed() == set()
    for n in (7, 7, 30):
        assert p.linear(torch.randn(n, 23, generator=g), w).shape == (n, 37)
    assert split() == {7, 30}
    if products.onednn_available():   # oneDNN timed at the probe row count of each row count met that is not split
        unsplit = [n for n in (7, 30) if products._SPLITS[("linear", 37, 23, n, 64)] is None]
        assert timed() == {{7: 8, 30: 32}[n] for n in unsplit}


def test_clearly_faster_needs_the_margin(monkeypatch):
    """On a clock that only the two functions move (f: 1 unit a call, g: 10): f is clearly faster than g, g not than f,
    and f not than itself plus 4 % (inside the 5 % margin)."""
    now = [0.0]
    monkeypatch.setattr(products.time, "perf_counter", lambda: now[0])

    def takes(units):
        def run():
            now[0] += units
        return run

    assert products.clearly_faster(takes(1), takes(10))
    assert not products.clearly_faster(takes(10), takes(1))
    assert not products.clearly_faster(takes(1), takes(1.04))
    assert products.clearly_faster(takes(1), takes(1.06))
