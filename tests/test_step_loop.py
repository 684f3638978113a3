"""The CPU path's generate loop in C (dsh.llm.step_loop: steps, retirements and admissions in ``decode_run``) against
the same loop in Python (``c_loop = False``, a return from C every step): the same completions bit for bit, handed on
in the same order; row counts not in C stepped by the host inside the loop; decisions kept across generates only
while what they depend on stays the same. Its progress: tests/test_engine.py."""

import pytest
import torch
from tiny_llamas import gqa_llama_own_norms

from dsh.llm import blas, kernel_engine, kernels, models, step_loop
from dsh.llm.engine import Engine
from dsh.llm.products import Products
from dsh.training.laptop_base import SHIPPED_BASE

pytestmark = pytest.mark.skipif(kernels.load() is None or blas.address() is None,
                                reason="no C kernels or no sgemm_ in this torch library")


@pytest.fixture(scope="module")
def gqa():
    return gqa_llama_own_norms()


_LOGITS = kernel_engine.KernelDecoder._logits
_DECODE_RUN = kernels.load().decode_run if kernels.load() is not None else None
PROMPTS = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(120)]


def _run(eng, prompts, c_loop: bool, monkeypatch, **kw):
    """Every completion in prompt order, the order the rows were handed on, and how often the loop in C returned
    and the host stepped (``decode_run`` calls, ``_logits`` calls)."""
    counts = {"runs": 0, "python": 0}
    order = []

    def counted_run(*a):
        counts["runs"] += 1
        return _DECODE_RUN(*a)

    def spy_py(self, s, *a):
        counts["python"] += 1
        return _LOGITS(self, s, *a)

    monkeypatch.setattr(eng._cpu.lib, "decode_run", counted_run)
    monkeypatch.setattr(kernel_engine.KernelDecoder, "_logits", spy_py)
    eng._cpu.c_loop = c_loop
    out = eng.generate(prompts, kw.pop("max_new", 40), seed=7, callback=lambda i, g: order.append(i), **kw)
    return [(g.tokens, g.logprobs, g.stopped, g.capped) for g in out], order, counts


@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_loop_in_c_equals_the_loop_in_python(gqa, kv_cache, temperature, monkeypatch):
    """120 prompts through 32 slots (rows retired and slots refilled at most steps, every row count down to 1): every
    row's tokens, log-probabilities, stop and cap bit for bit, handed on in the same order. Fails for a row dropped,
    repeated or moved out of its order, a slot freed or taken in another order, a prompt started with another key or
    limit, or results copied from the wrong slot."""
    if kv_cache == "float16" and not kernels.half_cache(kernels.load()):
        pytest.skip("no float16 cache on this CPU")
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels", kv_cache=kv_cache)
    eng.plan()                    # every row count decided ahead: the loop returns only to hand rows on
    monkeypatch.setattr(step_loop, "SECONDS", 1e9)   # and never for the clock: the count below holds on a slow host
    c, c_order, c_counts = _run(eng, PROMPTS, True, monkeypatch, temperature=temperature)
    py, py_order, py_counts = _run(eng, PROMPTS, False, monkeypatch, temperature=temperature)
    assert c == py and c_order == py_order
    assert sorted(c_order) == list(range(len(PROMPTS))) and sum(len(t) for t, *_ in c) > 600
    # far fewer returns than the ~150 steps: besides the steps the host takes (row counts not in C), a few to hand on
    assert py_counts["runs"] == 0 and 0 < c_counts["runs"] - c_counts["python"] < 10
    assert c_counts["python"] == py_counts["python"]              # the same steps taken by the host
    assert sum(s for _, _, s, _ in c) > 0                             # end tokens met, not only the limit


def test_the_loop_in_c_caps_rows_as_the_loop_in_python(gqa, monkeypatch):
    """``stop_after`` (the second 3 a row writes ends it, capped): the same rows capped, the same tokens."""
    eng = Engine(gqa, [11], slots=16, max_len=48, attention="kernels")
    c, c_order, _ = _run(eng, PROMPTS[:60], True, monkeypatch, temperature=1.0, stop_after=(3, 2))
    py, py_order, _ = _run(eng, PROMPTS[:60], False, monkeypatch, temperature=1.0, stop_after=(3, 2))
    assert c == py and c_order == py_order and sum(cap for *_, cap in c) > 5


def test_handing_on_after_every_step_gives_the_same(gqa, monkeypatch):
    """The host taking the finished rows after every step (no time between returns): the same completions and order,
    one return a step."""
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels")
    eng.plan()
    monkeypatch.setattr(step_loop, "SECONDS", 1e9)   # returns for the result rows alone, whatever the host's speed
    want, want_order, few = _run(eng, PROMPTS, True, monkeypatch, temperature=1.0)
    monkeypatch.setattr(step_loop, "SECONDS", 0.0)
    got, order, many = _run(eng, PROMPTS, True, monkeypatch, temperature=1.0)
    assert got == want and order == want_order          # returns besides the host's own steps: a few, then ~60
    assert few["runs"] - few["python"] < 10 and many["runs"] - many["python"] > 40


def test_results_held_in_as_many_rows_as_slots_give_the_same(gqa, monkeypatch):
    """The finished rows held for the host in one slot's worth of result rows (written round, the loop returning
    whenever a step's done rows might overwrite rows not yet taken), however long between returns: the same
    completions and order as the loop in Python. Fails for a result row overwritten before the host took it."""
    eng = Engine(gqa, [11], slots=8, max_len=48, attention="kernels")
    eng.plan()
    want, want_order, _ = _run(eng, PROMPTS, False, monkeypatch, temperature=1.0)
    monkeypatch.setattr(step_loop, "SECONDS", 1e9)
    monkeypatch.setattr(step_loop, "RESULT_ROWS", 1)
    got, order, counts = _run(eng, PROMPTS, True, monkeypatch, temperature=1.0)
    assert got == want and order == want_order and counts["runs"] - counts["python"] > len(PROMPTS) // 8


def test_row_counts_not_in_c_are_stepped_by_the_host_inside_the_loop(gqa, monkeypatch):
    """Where a row count's products are not all one sgemm_ call (here: odd row counts), the loop in C returns and the
    host takes that step in Python on the rows as C holds them; the completions stay those of the loop in Python."""
    eng = Engine(gqa, [11], slots=16, max_len=48, attention="kernels")
    in_c = Products.in_c
    monkeypatch.setattr(Products, "in_c", lambda self, kind, w, n: n % 2 == 0 and in_c(self, kind, w, n))
    want, want_order, _ = _run(eng, PROMPTS[:40], False, monkeypatch, temperature=1.0)
    got, order, counts = _run(eng, PROMPTS[:40], True, monkeypatch, temperature=1.0)
    assert got == want and order == want_order and counts["python"] > 0 and counts["runs"] > counts["python"]
    assert set(eng._cpu.ways[1::2, 0].tolist()) <= {-1, 0} and (eng._cpu.ways[2::2, 0] > 0).any()


def test_decisions_are_kept_across_generates_only_while_their_settings_hold(gqa, monkeypatch):
    """The same generate again decides nothing (each row count's ways kept); turning the parts off between generates
    is seen (the row counts decided again, none in parts), and so is another thread count."""
    asked = [0]
    in_c = Products.in_c

    def count(self, *a):
        asked[0] += 1
        return in_c(self, *a)

    monkeypatch.setattr(Products, "in_c", count)
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels")
    eng.generate(PROMPTS, 20, seed=1)
    decided, first = eng._cpu.ways.copy(), asked[0]
    assert (decided[:, 0] >= 0).sum() > 10 and first > 0
    eng.generate(PROMPTS, 20, seed=1)
    assert asked[0] == first and (eng._cpu.ways == decided).all()
    eng._cpu.c_parts = False
    eng.generate(PROMPTS, 20, seed=1)
    assert asked[0] > first and set(eng._cpu.ways[:, 0].tolist()) <= {-1, 0, 1}
    if torch.get_num_threads() > 1 and (decided[:, 0] > 1).any():
        eng._cpu.c_parts = True
        was = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            eng.generate(PROMPTS, 20, seed=1)
        finally:
            torch.set_num_threads(was)
        assert set(eng._cpu.ways[:, 0].tolist()) <= {-1, 0, 1}


def test_the_loop_in_c_equals_the_loop_in_python_on_the_shipped_base(monkeypatch):
    """The laptop base's shapes, 256 slots, 300 prompts at T = 1, float16 cache where the CPU has it."""
    m, tok = models.load(str(SHIPPED_BASE))
    prompts = [tok(f"Calculate {3 + i % 90} * {7 + i % 13}.", add_special_tokens=False)["input_ids"] for i in range(300)]
    kv = "float16" if kernels.half_cache(kernels.load()) else "float32"
    eng = Engine(m.eval(), [tok.eos_token_id], slots=256, max_len=64, attention="kernels", kv_cache=kv)
    c, c_order, counts = _run(eng, prompts, True, monkeypatch, temperature=1.0)
    py, py_order, _ = _run(eng, prompts, False, monkeypatch, temperature=1.0)
    assert c == py and c_order == py_order and counts["runs"] > 0
