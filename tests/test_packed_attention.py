"""Causal attention over packed sequences in C (dsh.llm.packed_attention): the per-sequence torch call's values and
gradients, the same bits whatever the thread count, one-line errors."""

import pytest
import torch
import torch.nn.functional as F

from dsh.llm import kernels, packing
from dsh.llm.packed_attention import packed_causal_attention

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


def test_same_bits_with_one_thread_or_two():
    q, k, v, w, cu = _inputs([50, 33, 70, 5], 4, 32, seed=3)
    outs = []
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = packed_causal_attention(q, k, v, cu, 0.17)
            outs.append((out, *torch.autograd.grad((out * w).sum(), (q, k, v))))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_bad_input_is_one_line():
    q = torch.randn(2, 10, 32)
    with pytest.raises(ValueError, match=r"^cu must rise from 0 to T=10"):
        packed_causal_attention(q, q, q, torch.tensor([0, 4, 9]), 1.0)
    with pytest.raises(ValueError, match=r"^q, k, v must be float32 CPU tensors of one shape"):
        packed_causal_attention(q.double(), q, q, torch.tensor([0, 10]), 1.0)
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
