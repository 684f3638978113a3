"""The decoding step in C in parts of the rows, each part's whole step on one thread (``decode_step`` with parts > 1,
dsh.llm.kernel_engine), against the same step over all rows (the library's threads in each product) and the step in
Python: the same tokens, log-probabilities and stops on every row; a row count whose products' parts do not give the
product's bits (dsh.llm.products.parts_agree) steps over all rows."""

import pytest
import torch
from tiny_llamas import gqa_llama_own_norms

from dsh.llm import blas, kernel_engine, kernels, models, products
from dsh.llm.engine import Engine
from dsh.llm.products import Products
from dsh.training.laptop_base import SHIPPED_BASE

needs_c = pytest.mark.skipif(kernels.load() is None or blas.address() is None,
                             reason="no C kernels or no sgemm_ in this torch library")


@pytest.fixture
def two_threads():
    """torch on two threads inside (the parts are one a thread), the thread count before restored after."""
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(was)


@pytest.fixture(scope="module")
def gqa():
    return gqa_llama_own_norms()


_STEP_IN_C, _STEP = kernel_engine.KernelDecoder._step_in_c, kernel_engine.KernelDecoder._step


def _run(eng, prompts, monkeypatch, c_step=True, c_parts=True, temperature=1.0, max_new=40, c_panels=True):
    """The engine's completions, each with the number of steps the whole run took (a row left out of a step is taken
    at a later one, the same tokens, so only the count shows it), and the parts of each C step (one entry a C step)."""
    parts: list = []
    steps = [0]

    def spy(self, s, inv_temp, greedy, stop_tok, stop_n, n_parts, packed):
        parts.append(n_parts)
        return _STEP_IN_C(self, s, inv_temp, greedy, stop_tok, stop_n, n_parts, packed)

    def count(self, *a):
        steps[0] += 1
        return _STEP(self, *a)

    monkeypatch.setattr(kernel_engine.KernelDecoder, "_step_in_c", spy)
    monkeypatch.setattr(kernel_engine.KernelDecoder, "_step", count)
    eng._cpu.c_step, eng._cpu.c_parts, eng._cpu.c_panels = c_step, c_parts, c_panels
    eng._cpu.c_loop = False           # a return to Python every step, so that each is counted
    out = eng.generate(prompts, max_new, temperature=temperature, seed=7)
    return [(g.tokens, g.logprobs, g.stopped) for g in out] + [("steps", steps[0])], parts


@needs_c
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_step_in_parts_equals_the_step_over_all_rows_and_in_python(gqa, kv_cache, temperature, two_threads,
                                                                         monkeypatch):
    """120 prompts through 32 slots (rows refilled and compacted, row counts 1-32): every row's tokens,
    log-probabilities and stop bit for bit, most steps in two parts. Fails for a part that reads another part's rows
    (an offset of the step's buffers, the rows' state, the streams or the caches left out) or writes over them."""
    if kv_cache == "float16" and not kernels.half_cache(kernels.load()):
        pytest.skip("no float16 cache on this CPU")
    prompts = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(120)]
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels", kv_cache=kv_cache)
    in_parts, parts = _run(eng, prompts, monkeypatch, temperature=temperature)
    all_rows, one = _run(eng, prompts, monkeypatch, c_parts=False, temperature=temperature)
    python, none = _run(eng, prompts, monkeypatch, c_step=False, temperature=temperature)
    assert in_parts == all_rows == python
    assert parts.count(2) > 0.5 * len(parts) and set(one) == {1} and not none
    assert sum(len(t) for t, _, _ in in_parts[:-1]) > 600


@needs_c
def test_the_step_in_parts_on_the_shipped_base(two_threads, monkeypatch):
    """The same at the laptop base's shapes (hidden 128, 4 heads of 32), 256 slots, T = 1, float16 cache where the CPU
    has it: the completions of the step in parts equal those over all rows, and most steps run in parts."""
    m, tok = models.load(str(SHIPPED_BASE))
    prompts = [tok(f"Calculate {3 + i % 90} * {7 + i % 13}.", add_special_tokens=False)["input_ids"] for i in range(300)]
    kv = "float16" if kernels.half_cache(kernels.load()) else "float32"
    eng = Engine(m.eval(), [tok.eos_token_id], slots=256, max_len=64, attention="kernels", kv_cache=kv)
    got, parts = _run(eng, prompts, monkeypatch)
    want, _ = _run(eng, prompts, monkeypatch, c_parts=False)
    assert got == want and parts.count(2) > 0.5 * len(parts)


@needs_c
@pytest.mark.parametrize("start", [2.0, 32768.0])
def test_parts_cut_to_equal_costs_give_the_same_completions(start, two_threads, monkeypatch):
    """Where every product of the step is the panel product (any cut of its rows gives its bits), the parts are cut to
    equal costs (a row's products, in attended positions, plus its positions), the cost learnt as the steps run: from
    a row cost far too low (the cuts by positions alone) or far too high (by rows alone), the completions equal those
    of equal row counts, and the learnt cost has moved. The starts lie inside the bounds the cost is held to (1 ..
    65536), so every balanced step moves it, whichever part the host's timing calls the slower (from a bound, a step
    pushing it out leaves it there: under load, every step of a run can). Fails for a cut that drops or repeats a row,
    or for balanced cuts that never run."""
    if not kernels.has_panels(kernels.load()):
        pytest.skip("no panel product on this CPU (the parts keep equal row counts)")
    m, tok = models.load(str(SHIPPED_BASE))
    prompts = [tok(f"Calculate {3 + i % 90} * {7 + i % 13}.", add_special_tokens=False)["input_ids"] for i in range(300)]
    eng = Engine(m.eval(), [tok.eos_token_id], slots=256, max_len=64, attention="kernels")
    eng._cpu.c_balance = False
    want, _ = _run(eng, prompts, monkeypatch)
    eng._cpu.c_balance = True
    eng._cpu.row_cost.fill_(start)
    got, parts = _run(eng, prompts, monkeypatch)
    assert got == want and parts.count(2) > 0.5 * len(parts)
    assert eng._cpu.row_cost.item() != start


@needs_c
def test_a_row_count_whose_parts_are_not_the_products_bits_steps_over_all_rows(gqa, two_threads, monkeypatch):
    """Where a product's parts do not give its bits at a row count (Products.in_parts false: here every odd row
    count), that step runs in C over all rows; the completions stay the same. The library's products (the panel
    product's rows need no check)."""
    prompts = [[1 + i % 9, 2 + i % 7] for i in range(60)]
    eng = Engine(gqa, [11], slots=16, max_len=48, attention="kernels")
    want, _ = _run(eng, prompts, monkeypatch, c_parts=False, c_panels=False)
    in_parts = Products.in_parts
    monkeypatch.setattr(Products, "in_parts", lambda self, kind, w, n, *a: n % 2 == 0 and in_parts(self, kind, w, n, *a))
    rows = []
    spy = kernel_engine.KernelDecoder.way_in_c

    def in_c(self, A):
        rows.append((A, spy(self, A)))
        return rows[-1][1]

    monkeypatch.setattr(kernel_engine.KernelDecoder, "way_in_c", in_c)
    got, parts = _run(eng, prompts, monkeypatch, c_panels=False)
    assert got == want and 1 in parts and 2 in parts
    assert all(way[0] == 1 for A, way in rows if way is not None and A % 2)


@needs_c
def test_one_thread_steps_over_all_rows(gqa, monkeypatch):
    """On one thread there is nothing to cut: every step in C in one part."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng = Engine(gqa, [11], slots=16, max_len=48, attention="kernels")
        _, parts = _run(eng, [[1 + i % 9, 2 + i % 7] for i in range(40)], monkeypatch)
    finally:
        torch.set_num_threads(was)
    assert parts and set(parts) == {1}


def test_the_parts_cover_the_rows_once_in_order():
    for parts in range(1, 5):
        for n in range(0, 41):
            cut = products.parts_of(n, parts)
            assert [r for a, b in cut for r in range(a, b)] == list(range(n))
            assert max(b - a for a, b in cut) - min(b - a for a, b in cut) <= 1


@needs_c
@pytest.mark.parametrize("kind", ["linear", "addmm"])
def test_parts_agree_sees_a_part_that_differs(kind, tmp_path, monkeypatch):
    """parts_agree holds for the laptop base's q/k/v shape at 256 rows in two parts on this machine (MKL's rows are
    independent of the rows beside them there), and fails when one part's product is off by one unit in the last
    place (the check compares the parts' products themselves)."""
    monkeypatch.setenv("DSH_CACHE", str(tmp_path))
    monkeypatch.setattr(products, "_PARTS", {})
    assert products.parts_agree(kind, 384, 128, 256, 256, 2, False)
    assert products.sgemm_agrees(kind, 384, 128, 200, 256)        # decided before the parts' products go off
    product = blas.product

    def off(x, w, out, beta=0.0):
        y = product(x, w, out, beta)
        y[0, 0] = torch.nextafter(y[0, 0], torch.tensor(float("inf")))
        return y

    monkeypatch.setattr(blas, "product", off)
    assert not products.parts_agree(kind, 384, 128, 200, 256, 2, False)


@needs_c
def test_more_parts_than_threads_gives_the_same_completions(gqa, two_threads, monkeypatch):
    """Three parts on two threads (a thread takes two parts, each with its own attention): the same completions as
    over all rows. Fails for a part left out or taken twice."""
    prompts = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(80)]
    eng = Engine(gqa, [11], slots=32, max_len=48, attention="kernels")
    want, _ = _run(eng, prompts, monkeypatch, c_parts=False)
    got, parts = _run(eng, prompts, monkeypatch, c_parts=3)
    assert got == want and parts.count(3) > 0.5 * len(parts)


_NESTED = """
import sys, torch
sys.path.insert(0, "tests")
from tiny_llamas import gqa_llama_own_norms
from dsh.llm.engine import Engine
torch.set_num_threads(2)
eng = Engine(gqa_llama_own_norms(), [11], slots=32, max_len=48, attention="kernels")
prompts = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(120)]
out = {}
for parts in (True, False):
    eng._cpu.c_parts = parts
    out[parts] = [(g.tokens, g.logprobs) for g in eng.generate(prompts, 40, seed=7)]
print("same" if out[True] == out[False] else "different")
"""


@needs_c
@pytest.mark.slow
def test_the_parts_under_settings_that_let_mkl_nest_threads(tmp_path):
    """With MKL_DYNAMIC=FALSE and nested parallelism allowed (OMP_MAX_ACTIVE_LEVELS=2), MKL could give each part's
    products a second thread of their own; the C step asks MKL for one thread on each part's thread
    (``MKL_Set_Num_Threads_Local``, as the parts were checked), and the completions equal those over all rows."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MKL_DYNAMIC": "FALSE", "OMP_MAX_ACTIVE_LEVELS": "2", "DSH_CACHE": str(tmp_path),
           "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", _NESTED], env=env, cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "same"
