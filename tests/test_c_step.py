"""The decoding step in one C call (dsh.llm.kernel_engine's C step, its products through torch's sgemm_,
dsh.llm.blas) against the same step in Python: the same tokens, log-probabilities and stops on every row; row counts
with a split product (or a product whose sgemm_ call does not give torch's bits) step in Python (the products' log of
either step: tests/test_products.py)."""

import pytest
import torch
from tiny_llamas import gqa_llama_own_norms

from dsh.llm import blas, kernel_engine, kernels, models
from dsh.llm.engine import Engine
from dsh.llm.products import Products
from dsh.training.laptop_base import SHIPPED_BASE

needs_c = pytest.mark.skipif(kernels.load() is None or blas.address() is None,
                             reason="no C kernels or no sgemm_ in this torch library")


@pytest.fixture(scope="module")
def gqa():
    return gqa_llama_own_norms()


_ORIGINAL = (kernel_engine.KernelDecoder._step_in_c, kernel_engine.KernelDecoder._logits)


def _run(eng, prompts, c_step: bool, temperature: float, monkeypatch):
    """The engine's completions with whole steps in C (or none) and how many steps ran in C and in Python."""
    counts = {"c": 0, "python": 0, "packed": 0, "panels": 0, "c_rows": set(), "python_rows": set()}
    in_c, logits = _ORIGINAL

    def spy_c(self, s, *a):
        counts["c"] += 1
        counts["c_rows"].add(s.tok.shape[0])
        counts["packed"] += int((a[-1] == 1).sum())  # the products taken from MKL's packed weights in this step
        counts["panels"] += int((a[-1] >= 2).sum())  # and by the step's own panel product
        return in_c(self, s, *a)

    def spy_py(self, s, *a):
        counts["python"] += 1
        counts["python_rows"].add(s.tok.shape[0])
        return logits(self, s, *a)

    monkeypatch.setattr(kernel_engine.KernelDecoder, "_step_in_c", spy_c)
    monkeypatch.setattr(kernel_engine.KernelDecoder, "_logits", spy_py)
    eng._cpu.c_step, eng._cpu.c_loop = c_step, False      # a return to Python every step (the loop in C:
    out = eng.generate(prompts, 40, temperature=temperature, seed=7)  # tests/test_step_loop.py)
    if c_step:        # per row count met, whether the C step may take every product there (Products.in_c)
        counts["in_c"] = {n: all(eng._cpu.products.in_c(k, w, n) for k, w in eng._cpu.c_products)
                          for n in counts["c_rows"] | counts["python_rows"]}
    return [(g.tokens, g.logprobs, g.stopped) for g in out], counts


@needs_c
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_c_step_equals_the_python_step(gqa, kv_cache, temperature, monkeypatch):
    """Every row's tokens, log-probabilities and stop, bit for bit, with 120 prompts through 32 slots (rows refilled
    and compacted). Fails for a field of the C step's model out of place, a product with other arguments than
    torch's, a norm, activation, sampling or bookkeeping that differs, or a step that does not run in C at all."""
    if kv_cache == "float16" and not kernels.half_cache(kernels.load()):
        pytest.skip("no float16 cache on this CPU")
    prompts = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(120)]
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels", kv_cache=kv_cache)
    c, c_counts = _run(eng, prompts, True, temperature, monkeypatch)
    py, py_counts = _run(eng, prompts, False, temperature, monkeypatch)
    assert c == py
    assert c_counts["c"] > 0.5 * (c_counts["c"] + c_counts["python"]) and py_counts["c"] == 0
    # a row count steps in Python only where one of its products is split or not sgemm_'s (which row counts those are
    # depends on the CPU and its library), every other row count in C
    assert c_counts["c_rows"] == {n for n, ok in c_counts["in_c"].items() if ok}
    assert c_counts["python_rows"] == {n for n, ok in c_counts["in_c"].items() if not ok}
    assert sum(len(t) for t, _, _ in c) > 600
    if blas.packed_addresses() is not None or kernels.has_panels(kernels.load()):
        # most products from packed weights or panels (not below 6-8 rows here)
        assert c_counts["packed"] + c_counts["panels"] > 0.5 * 9 * c_counts["c"]


@needs_c
def test_the_c_step_without_packed_weights_gives_the_same_completions(gqa, monkeypatch):
    """Every product through sgemm_ (no packed weights, as where MKL's packing is missing, and no panel product, as
    without AVX-512): the same completions."""
    prompts = [[1 + i % 9, 2 + i % 7] for i in range(60)]
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels")
    want, _ = _run(eng, prompts, True, 1.0, monkeypatch)
    monkeypatch.setattr(blas, "packed_addresses", lambda: None)
    monkeypatch.setattr(kernels, "has_panels", lambda lib: False)
    got, counts = _run(eng, prompts, True, 1.0, monkeypatch)
    assert got == want and counts["c"] > 0 and counts["packed"] == 0 and counts["panels"] == 0


@needs_c
def test_the_c_step_equals_the_python_step_on_the_shipped_base(monkeypatch):
    """The same at the laptop base's shapes (hidden 128, 4 heads of 32), 256 slots, sampled at T = 1."""
    m, tok = models.load(str(SHIPPED_BASE))
    prompts = [tok(f"Calculate {3 + i % 90} * {7 + i % 13}.", add_special_tokens=False)["input_ids"] for i in range(300)]
    eng = Engine(m.eval(), [tok.eos_token_id], slots=256, max_len=64, attention="kernels", kv_cache="float32")
    c, counts = _run(eng, prompts, True, 1.0, monkeypatch)
    assert c == _run(eng, prompts, False, 1.0, monkeypatch)[0] and counts["c"] > 0


@needs_c
def test_the_c_step_takes_the_row_counts_where_the_python_step_takes_onednn(tmp_path, monkeypatch):
    """oneDNN taken wherever its product equals torch's bit for bit (its timing left out; decisions kept in a folder of
    their own): the Python step takes oneDNN at those row counts, the C step sgemm_ (torch's product) at the same row
    counts, and the completions are the same. Shipped base, 256 slots, T = 1."""
    from dsh.llm import products

    if not products.onednn_available():
        pytest.skip("no oneDNN in this torch")
    monkeypatch.setenv("DSH_CACHE", str(tmp_path))
    monkeypatch.setattr(products, "_FASTER", {})
    monkeypatch.setattr(products, "clearly_faster", lambda *a, **k: True)
    m, tok = models.load(str(SHIPPED_BASE))
    prompts = [tok(f"Calculate {3 + i % 90} * {7 + i % 13}.", add_special_tokens=False)["input_ids"] for i in range(300)]
    eng = Engine(m.eval(), [tok.eos_token_id], slots=256, max_len=64, attention="kernels", kv_cache="float32")
    py, _ = _run(eng, prompts, False, 1.0, monkeypatch)
    onednn = {n for (kind, _, n), way in eng._cpu.products._ways.items() if way[0] == "onednn"}
    if not onednn:
        pytest.skip("oneDNN's product equals torch's at no row count of this run on this CPU")
    c, counts = _run(eng, prompts, True, 1.0, monkeypatch)
    assert c == py and onednn & counts["c_rows"]


@needs_c
def test_a_row_count_whose_products_are_not_one_sgemm_call_steps_in_python(gqa, monkeypatch):
    """Where a product at a row count is split or not sgemm_'s (Products.in_c false), that step
    runs in Python; the completions stay those of an all-Python run."""
    prompts = [[1 + i % 9, 2 + i % 7] for i in range(40)]
    eng = Engine(gqa, [11], slots=16, max_len=48, attention="kernels")
    want, _ = _run(eng, prompts, False, 1.0, monkeypatch)
    in_c = Products.in_c
    monkeypatch.setattr(Products, "in_c", lambda self, kind, w, n: n % 2 == 0 and in_c(self, kind, w, n))
    got, counts = _run(eng, prompts, True, 1.0, monkeypatch)
    assert got == want and counts["c"] > 0 and counts["python"] > 0


@needs_c
@pytest.mark.parametrize("shape", [(384, 128), (128, 384), (68, 128), (13, 7)])
def test_blas_product_is_torchs(shape):
    """blas.product equals torch.mm and addmm_ bit for bit at row counts 1-40 and 256 (it is torch's own sgemm_ call)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g)
    x, r = torch.randn(256, shape[1], generator=g), torch.randn(256, shape[0], generator=g)
    for n in [*range(1, 41), 256]:
        assert torch.equal(blas.product(x[:n], w, torch.empty(n, shape[0])), torch.mm(x[:n], w.t())), n
        assert torch.equal(blas.product(x[:n], w, r[:n].clone(), 1.0), r[:n].clone().addmm_(x[:n], w.t())), n


@needs_c
@pytest.mark.parametrize("shape", [(384, 128), (128, 384), (68, 128)])
def test_packed_products_are_torchs_where_the_check_says_so(shape):
    """blas.packed_product equals torch's product at every row count 1-64 where products.packed_agrees holds, and the
    check holds at most of them (MKL: from 6 rows on)."""
    from dsh.llm import products

    if blas.packed_addresses() is None:
        pytest.skip("no MKL packing in this torch library")
    g = torch.Generator().manual_seed(4)
    w = torch.randn(*shape, generator=g)
    x, r = torch.randn(64, shape[1], generator=g), torch.randn(64, shape[0], generator=g)
    packed, agreed = blas.pack(w, 64), 0
    for n in range(1, 65):
        if products.packed_agrees("linear", *shape, n, 64):
            agreed += 1
            assert torch.equal(blas.packed_product(x[:n], packed, torch.empty(n, shape[0])), torch.mm(x[:n], w.t()))
        if products.packed_agrees("addmm", *shape, n, 64):
            assert torch.equal(blas.packed_product(x[:n], packed, r[:n].clone(), 1.0), r[:n].clone().addmm_(x[:n], w.t()))
    assert agreed >= 48


@needs_c
def test_blas_product_refuses_bad_tensors():
    w, x = torch.randn(8, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match="x must be a contiguous 2-d float32"):
        blas.product(x.double(), w, torch.empty(3, 8))
    with pytest.raises(ValueError, match="out must be a contiguous 2-d float32"):
        blas.product(x, w, torch.empty(8, 3).t())
    with pytest.raises(ValueError, match=r"shapes must be x \[A, I\], w \[O, I\], out \[A, O\]"):
        blas.product(x, w, torch.empty(3, 7))
    if blas.packed_addresses() is not None:
        with pytest.raises(ValueError, match="w must be a contiguous 2-d float32"):
            blas.pack(w.t(), 4)
        with pytest.raises(ValueError, match="x and out must have the same rows"):
            blas.packed_product(x, blas.pack(w, 4), torch.empty(2, 8))
