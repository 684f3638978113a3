"""Causal attention over packed sequences in C (dsh.llm.packed_attention): the per-sequence torch call's values and
gradients, the same bits whatever the thread count, one-line errors."""

import pytest
import torch
import torch.nn.functional as F

from dsh.llm import kernels, packing
from dsh.llm.packed_attention import bfloat16_products, packed_causal_attention

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C compiler for dsh's kernels")


def _reference(q, k, v, lens, scale):
    """One causal torch call per sequence: [H, T, D] -> [T, H, D]."""
    parts = [F.scaled_dot_product_attention(a, b, c, is_causal=True, scale=scale)
             for a, b, c in zip(q.split(lens, 1), k.split(lens, 1), v.split(lens, 1))]
    return torch.cat(parts, 1).transpose(0, 1)


def _inputs(lens, H, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q, k, v = (torch.randn(H, T, D, generator=g, requires_grad=True) for _ in range(3))
    w = torch.randn(T, H, D, generator=g)             # a loss that weighs every output differently
    return q, k, v, w, torch.tensor([0, *lens]).cumsum(0)


@pytest.mark.parametrize("D", [32, 64, 24])          # the two inlined head sizes and the general loop
@pytest.mark.parametrize("lens", [[1, 7, 16, 17, 40], [130, 3, 64, 9], [1]])
def test_values_and_gradients_equal_per_sequence_attention(lens, D):
    q, k, v, w, cu = _inputs(lens, 3, D)
    scale = D ** -0.5
    ref = _reference(q, k, v, lens, scale)
    got = packed_causal_attention(q, k, v, cu, scale)
    assert got.shape == ref.shape and torch.allclose(got, ref, atol=2e-6, rtol=1e-5)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_ref):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4)


def test_attention_stays_inside_each_sequence():
    """The packed row read as one sequence is another result: a kernel that crossed boundaries would equal it."""
    q, k, v, _, cu = _inputs([20, 30], 2, 32)
    got = packed_causal_attention(q, k, v, cu, 0.2)
    crossing = _reference(q, k, v, [50], 0.2)
    assert torch.allclose(got[:20], crossing[:20], atol=2e-6)        # the first sequence sees nothing else anyway
    assert (got[20:] - crossing[20:]).abs().max() > 1e-2


def _gradients(q, k, v, w, cu, scale, products="float32"):
    out = packed_causal_attention(q, k, v, cu, scale, products)
    return out, torch.autograd.grad((out * w).sum(), (q, k, v))


@pytest.mark.parametrize("products", ["float32", "bfloat16"])
def test_same_bits_with_one_thread_or_two(products):
    q, k, v, w, cu = _inputs([50, 33, 70, 5], 4, 32, seed=3)
    outs = []
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out, grads = _gradients(q, k, v, w, cu, 0.17, products)
            outs.append((out, *grads))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def _exact(q, k, v, w, lens, scale, dtype=torch.float64):
    """The per-sequence torch call's output and gradients with q, k, v and the loss's weights in ``dtype`` (float64:
    the exact reference; bfloat16: torch's own bfloat16 attention, forward and backward)."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    out = _reference(q, k, v, lens, scale)
    return (out.detach(), *torch.autograd.grad((out * w.to(dtype)).sum(), (q, k, v)))


@pytest.mark.parametrize("lens", [[1, 7, 16, 17, 40, 130, 3, 64, 9], [306, 306], [33, 250, 5]])
def test_bfloat16_products_are_as_close_as_torchs_bfloat16_attention(lens):
    """products="bfloat16" (head size 32, where the CPU has bfloat16 dot products): the output and gradients off
    float64's by about what rounding the inputs to bfloat16 costs (1.1-1.3x of it here) and by about torch's own
    bfloat16 attention's error (0.9-1.15x); elsewhere the float32 passes' bits."""
    q, k, v, w, cu = _inputs(lens, 3, 32, seed=len(lens))
    scale = 32 ** -0.5
    out32, g32 = _gradients(q, k, v, w, cu, scale)
    out16, g16 = _gradients(q, k, v, w, cu, scale, "bfloat16")
    if not bfloat16_products(32):
        assert all(torch.equal(a, b) for a, b in zip((out16, *g16), (out32, *g32)))
        return
    exact = _exact(q, k, v, w, lens, scale)
    rounded = [x.bfloat16().double() for x in (q, k, v, w)]
    floor = _exact(*rounded[:3], rounded[3], lens, scale)  # the inputs' rounding alone
    torch16 = _exact(q, k, v, w, lens, scale, torch.bfloat16)
    for got, want, lo, theirs, f32 in zip((out16, *g16), exact, floor, torch16, (out32, *g32)):
        e = [float((x.detach().double() - want).norm() / want.norm()) for x in (got, lo, theirs, f32)]
        assert 1e-3 < e[0] < 1.5 * e[1] and e[0] < 1.5 * e[2] and e[3] < 1e-6, e


def test_bfloat16_products_are_the_float32_passes_at_other_head_sizes():
    q, k, v, w, cu = _inputs([50, 33], 2, 64, seed=5)       # head size 64: the float32 passes
    out16, g16 = _gradients(q, k, v, w, cu, 0.125, "bfloat16")
    out32, g32 = _gradients(q, k, v, w, cu, 0.125)
    assert all(torch.equal(a, b) for a, b in zip((out16, *g16), (out32, *g32)))


def test_bad_input_is_one_line():
    q = torch.randn(2, 10, 32)
    with pytest.raises(ValueError, match=r"^cu must rise from 0 to T=10"):
        packed_causal_attention(q, q, q, torch.tensor([0, 4, 9]), 1.0)
    with pytest.raises(ValueError, match=r"^q, k, v must be float32 CPU tensors of one shape"):
        packed_causal_attention(q.double(), q, q, torch.tensor([0, 10]), 1.0)
    with pytest.raises(ValueError, match=r"^products must be one of float32, bfloat16; got 'float16'"):
        packed_causal_attention(q, q, q, torch.tensor([0, 10]), 1.0, "float16")
    with pytest.raises(ValueError, match=r"^packed_attention must be one of torch, kernels, fused; got 'fast'"):
        packing.register("fast")


@pytest.mark.slow     # imports transformers
def test_tiny_model_packed_training_loss_is_the_torch_paths():
    """The tiny model (head size 32) trained on a packed row: the kernels' loss and gradients are the torch path's."""
    from dsh.llm.tiny import TinyConfig, build_tokenizer, make_model

    tok = build_tokenizer()
    model = make_model(tok, TinyConfig(d_model=64, layers=2, heads=2, ffn=128), seed=0)
    seqs = [tok(f"{a} * {b} = {a * b}\n" * r)["input_ids"] for a, b, r in ((12, 34, 1), (5, 678, 3), (90, 1, 2))]
    ids = torch.tensor([sum(seqs, [])])
    pos = torch.cat([torch.arange(len(x)) for x in seqs])[None]
    results = []
    for path in ("torch", "kernels"):
        model.set_attn_implementation(packing.register(path))
        model.zero_grad()
        loss = model(input_ids=ids, position_ids=pos, labels=ids).loss
        loss.backward()
        results.append((loss.item(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    model.set_attn_implementation("sdpa")
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)
