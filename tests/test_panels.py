"""The decoding step's own matrix product (``panel_product`` in cpu_kernels.c, dsh.llm.kernels): its results against
torch's product (close everywhere, the same bits where dsh.llm.products.panels_agree says so), a row's result from its
own row alone, ``beta`` 1 into the residual, no write beyond the outputs; the check that picks it sees a product that
differs; and the engine's completions with it equal those without it."""

import pytest
import torch
from tiny_llamas import gqa_llama_own_norms

from dsh.llm import blas, kernel_engine, kernels, products
from dsh.llm.engine import Engine

needs_panels = pytest.mark.skipif(not kernels.has_panels(kernels.load()),
                                  reason="no panel product in these kernels (built without AVX-512)")

SHAPES = [(384, 128), (128, 128), (768, 128), (128, 384), (68, 128), (40, 24)]   # [O, I]: the laptop base's, and odd ones


@pytest.fixture
def own_decisions(tmp_path, monkeypatch):
    """Decisions in a folder of their own, none in this process's tables."""
    monkeypatch.setenv("DSH_CACHE", str(tmp_path))
    monkeypatch.setattr(products, "_PANELS", {})
    monkeypatch.setattr(products, "_TAKEN", set())


def _inputs(shape, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g), torch.randn(n, shape[1], generator=g),
            torch.randn(n, shape[0], generator=g))


@needs_panels
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk", [0, 8, 100])
def test_the_panel_product_is_the_product(shape, chunk):
    """Close to torch's product in float64 (the float32 rounding of a sum of I terms) at every chunk, with and without
    the residual; a row's result is the same bits whatever rows it is taken with (every count of rows left after the
    whole blocks of eight, taken as one block of that count, included)."""
    lib = kernels.load()
    w, x, r = _inputs(shape, 37)
    panels = kernels.panel_pack(lib, w)
    want = x.double() @ w.double().t()
    got = kernels.panel_product(lib, x, panels, torch.empty(37, shape[0]), 0.0, chunk)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)
    added = kernels.panel_product(lib, x, panels, r.clone(), 1.0, chunk)
    assert torch.allclose(added.double(), want + r.double(), rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)
    for a, b in ((0, 1), (3, 11), (5, 37), (8, 16), *((1, 1 + n) for n in range(2, 16))):
        part = kernels.panel_product(lib, x[a:b].contiguous(), panels, torch.empty(b - a, shape[0]), 0.0, chunk)
        assert torch.equal(part, got[a:b])


@needs_panels
def test_the_panel_product_writes_its_outputs_only():
    """Outputs that are not a whole number of panels (68 = 2 x 32 + 4): nothing beyond each row's 68 is written."""
    lib = kernels.load()
    w, x, _ = _inputs((68, 128), 9)
    buf = torch.full((9 * 68 + 64,), 7.0)
    out = buf[: 9 * 68].view(9, 68)
    kernels.panel_product(lib, x, kernels.panel_pack(lib, w), out)
    assert torch.equal(buf[9 * 68:], torch.full((64,), 7.0))
    assert torch.allclose(out, x @ w.t(), rtol=1e-5, atol=1e-4)


@needs_panels
@pytest.mark.parametrize("kind", ["linear", "addmm"])
def test_where_the_check_finds_a_chunk_the_panel_product_gives_torchs_bits(kind, own_decisions):
    """panels_agree's chunk gives torch's product bit for bit on other inputs too, at each row count it finds one."""
    lib = kernels.load()
    for shape in SHAPES[:4]:
        w, x, r = _inputs(shape, 64, seed=5)
        panels = kernels.panel_pack(lib, w)
        for n in (1, 8, 9, 31, 64):
            chunk = products.panels_agree(kind, *shape, n, 64)
            if chunk:
                want = torch.mm(x[:n], w.t()) if kind == "linear" else r[:n].clone().addmm_(x[:n], w.t())
                got = kernels.panel_product(lib, x[:n], panels, torch.empty(n, shape[0]) if kind == "linear"
                                            else r[:n].clone(), 0.0 if kind == "linear" else 1.0, chunk)
                assert torch.equal(got, want), (shape, n, chunk)


@needs_panels
def test_panels_agree_sees_a_product_that_differs(own_decisions, monkeypatch):
    """A panel product off by one unit in the last place of one entry is not taken at any chunk."""
    real = kernels.panel_product

    def off(lib, x, panels, out, beta=0.0, chunk=0):
        real(lib, x, panels, out, beta, chunk)
        out.view(-1)[0] = torch.nextafter(out.view(-1)[0], torch.tensor(float("inf")))
        return out

    monkeypatch.setattr(kernels, "panel_product", off)
    assert products.panels_agree("linear", 384, 128, 64, 64) == 0


def test_panels_agree_is_0_without_the_panel_product(own_decisions, monkeypatch):
    monkeypatch.setattr(kernels, "has_panels", lambda lib: False)
    assert products.panels_agree("linear", 384, 128, 64, 64) == 0


@needs_panels
@pytest.mark.skipif(blas.address() is None, reason="no sgemm_ in this torch library")
@pytest.mark.parametrize("kv_cache", ["float32", "float16"])
def test_the_engine_with_the_panel_product_gives_the_same_completions(kv_cache, monkeypatch):
    """Every row's tokens, log-probabilities and stop with the C step's panel products equal those with the library's
    products, at T = 1 with 120 prompts through 32 slots (rows refilled, every row count down to 1); the panel product
    is taken at most steps."""
    if kv_cache == "float16" and not kernels.half_cache(kernels.load()):
        pytest.skip("no float16 cache on this CPU")
    model = gqa_llama_own_norms()
    prompts = [[1 + i % 9, 2 + i % 7, 3 + i % 5][: 1 + i % 3] for i in range(120)]
    eng = Engine(model, [11], slots=32, max_len=48, attention="kernels", kv_cache=kv_cache)
    eng._cpu.c_loop = False           # a return to Python every step, so that each is seen
    ways = []
    step_in_c = kernel_engine.KernelDecoder._step_in_c

    def spy(self, s, *a):
        ways.append(int((a[-1] >= 2).sum()))
        return step_in_c(self, s, *a)

    monkeypatch.setattr(kernel_engine.KernelDecoder, "_step_in_c", spy)
    runs = {}
    for panels in (False, True):
        eng._cpu.c_panels = panels
        ways.clear()
        runs[panels] = [(g.tokens, g.logprobs, g.stopped) for g in eng.generate(prompts, 40, temperature=1.0, seed=3)]
        runs[panels, "ways"] = list(ways)
    assert runs[True] == runs[False]
    assert sum(runs[False, "ways"]) == 0 and sum(w > 0 for w in runs[True, "ways"]) > 0.5 * len(runs[True, "ways"])
