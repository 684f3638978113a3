"""The decoder layers' element-wise work in C (dsh.llm.fused_layers): each function's values and gradients against
torch's own computation, the same bits on one thread or two, a whole model's loss and gradients against
transformers' layers, the fallbacks, and the modules put back."""

import pytest
import torch

from dsh.llm import fused_layers as fl
from dsh.llm import kernels, packing

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C compiler for dsh's kernels")


def _close(a, b, tol=1e-5):
    return torch.allclose(a, b, atol=tol * max(1.0, b.abs().max().item()), rtol=tol)


def _rms_reference(x, w, eps):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * h


def _rope_reference(qkv, cos, sin, H, KV):
    """transformers' apply_rotary_pos_emb on the heads of qkv [T, (H + 2 KV) D], as [heads, T, D]."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    T, D = qkv.shape[0], cos.shape[1]
    q, k, v = qkv.view(T, H + 2 * KV, D).transpose(0, 1).split([H, KV, KV])
    q, k = apply_rotary_pos_emb(q[None], k[None], cos[None], sin[None])
    return q[0], k[0], v


def _tables(T, D, seed):
    pos = torch.randint(0, 300, (T,), generator=torch.Generator().manual_seed(seed)).float()
    ang = pos[:, None] * (10000.0 ** (-torch.arange(0, D, 2).float() / D))[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("rows", [1, 63, 64, 200])       # whole blocks of the weight gradient's sums and not
def test_rms_norm_values_and_gradients(rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g, requires_grad=True)
    w = (torch.rand(96, generator=g) + 0.5).requires_grad_()
    dy = torch.randn(rows, 96, generator=g)
    ref, got = _rms_reference(x, w, 1e-6), fl.rms_norm(x, w, 1e-6)
    assert _close(got, ref)
    for a, b in zip(torch.autograd.grad((got * dy).sum(), (x, w)), torch.autograd.grad((ref * dy).sum(), (x, w))):
        assert _close(a, b, 1e-4)


def test_silu_mul_values_and_gradients():
    g = torch.Generator().manual_seed(1)
    gu = (3 * torch.randn(50, 2 * 40, generator=g)).requires_grad_()
    da = torch.randn(50, 40, generator=g)
    gate, up = gu.chunk(2, -1)
    ref, got = torch.nn.functional.silu(gate) * up, fl.silu_mul(gu)
    assert _close(got, ref)
    assert _close(torch.autograd.grad((got * da).sum(), gu)[0], torch.autograd.grad((ref * da).sum(), gu)[0], 1e-4)


@pytest.mark.parametrize("F", [384, 40, 37])      # whole vectors of 16 and not
def test_silu_mul_in_bfloat16_is_the_float32_call_between_two_roundings(F):
    """bfloat16 rows: the value and the gradient equal the float32 kernel's on the widened values, rounded to
    bfloat16 (torch's rounding), bit for bit: what the update's bfloat16 path computed with a conversion each side."""
    g = torch.Generator().manual_seed(F)
    gu = (3 * torch.randn(70, 2 * F, generator=g)).bfloat16().requires_grad_()
    da = torch.randn(70, F, generator=g).bfloat16()
    gu32 = gu.detach().float().requires_grad_()
    got, want = fl.silu_mul(gu), fl.silu_mul(gu32)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())
    (dgot,) = torch.autograd.grad(got, gu, da)
    (dwant,) = torch.autograd.grad(want, gu32, da.float())
    assert dgot.dtype == torch.bfloat16 and torch.equal(dgot, dwant.bfloat16())
    with pytest.raises(ValueError, match="^gate_up must be float32 or bfloat16; got torch.float16"):
        fl.silu_mul(gu.detach().half())


@pytest.mark.parametrize("H,KV", [(4, 4), (4, 2)])
def test_rope_split_values_and_gradients(H, KV):
    T, D = 37, 32
    g = torch.Generator().manual_seed(H + KV)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=g, requires_grad=True)
    cos, sin = _tables(T, D, 2)
    ref, got = _rope_reference(qkv, cos, sin, H, KV), fl.rope_split(qkv, cos, sin, H, KV)
    assert [t.shape for t in got] == [(H, T, D), (KV, T, D), (KV, T, D)]
    ws = [torch.randn(t.shape, generator=g) for t in ref]
    for a, b in zip(got, ref):
        assert _close(a, b)
    loss = lambda ts: sum((t * w).sum() for t, w in zip(ts, ws))  # noqa: E731
    assert _close(torch.autograd.grad(loss(got), qkv)[0], torch.autograd.grad(loss(ref), qkv)[0], 1e-4)


@pytest.mark.parametrize("H,KV", [(4, 4), (4, 2)])
def test_rope_split_of_bfloat16_rows_is_the_float32_call_between_two_roundings(H, KV):
    """bfloat16 q/k/v rows: q, k, v equal the float32 call's on the widened rows, the gradient its gradient rounded to
    bfloat16, bit for bit."""
    T, D = 37, 32
    g = torch.Generator().manual_seed(10 + H + KV)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=g).bfloat16().requires_grad_()
    qkv32 = qkv.detach().float().requires_grad_()
    cos, sin = _tables(T, D, 3)
    got, want = fl.rope_split(qkv, cos, sin, H, KV), fl.rope_split(qkv32, cos, sin, H, KV)
    assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(got, want))
    ws = [torch.randn(t.shape, generator=g) for t in want]
    (dgot,) = torch.autograd.grad(got, qkv, ws)
    (dwant,) = torch.autograd.grad(want, qkv32, ws)
    assert dgot.dtype == torch.bfloat16 and torch.equal(dgot, dwant.bfloat16())
    with pytest.raises(ValueError, match="^qkv must be float32 or bfloat16; got torch.float16"):
        fl.rope_split(qkv.detach().half(), cos, sin, H, KV)


def test_same_bits_with_one_thread_or_two():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(700, 128, generator=g, requires_grad=True)
    w = torch.rand(128, generator=g).requires_grad_()
    gu = torch.randn(700, 768, generator=g, requires_grad=True)
    qkv = torch.randn(700, 384, generator=g, requires_grad=True)
    cos, sin = _tables(700, 32, 3)
    outs, before = [], torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y, a, (q, k, v) = fl.rms_norm(x, w, 1e-6), fl.silu_mul(gu), fl.rope_split(qkv, cos, sin, 4, 4)
            loss = (y * y).sum() + (a * a).sum() + (q * q).sum() + (k * v).sum()
            outs.append((y, a, q, k, v, *torch.autograd.grad(loss, (x, w, gu, qkv))))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def _packed_row(seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(20, 90, (6,), generator=g).tolist()
    ids = torch.randint(3, 60, (1, sum(lens)), generator=g)
    return ids, torch.cat([torch.arange(n) for n in lens])[None]


def _loss_and_grads(m, ids, pos, fused: bool, **kw):
    with fl.fused_layers(m) if fused else torch.autocast("cpu", enabled=False):
        loss = m(input_ids=ids, position_ids=pos, labels=ids, **kw).loss
    loss.backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.slow   # loads the shipped base
def test_a_model_gives_transformers_loss_and_gradients_and_is_put_back():
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    m, _ = load(str(SHIPPED_BASE))
    m.set_attn_implementation(packing.register("fused"))
    m.train()
    ids, pos = _packed_row()
    for kw in ({}, {"use_cache": False}):               # a training pass with and without an (empty) cache
        ref_loss, ref = _loss_and_grads(m, ids, pos, False, **kw)
        loss, got = _loss_and_grads(m, ids, pos, True, **kw)
        assert torch.allclose(loss, ref_loss, rtol=1e-5)
        assert all(_close(got[k], ref[k], 1e-4) for k in ref)
    calls, apply = [], fl._RopeSplit.apply
    fl._RopeSplit.apply = lambda *a: calls.append(1) or apply(*a)
    try:
        with fl.fused_layers(m) as n:
            m(input_ids=ids, position_ids=pos)
    finally:
        fl._RopeSplit.apply = apply
    layers = len(m.model.layers)
    assert n == 2 * layers + 1 + 2 * layers and calls == [1] * layers   # norms (+ the final one), attention, MLPs
    assert not any("forward" in vars(mod) for mod in m.modules())       # the class's forward again


@pytest.mark.slow   # loads the shipped base
def test_what_the_swap_does_not_fit_runs_its_own_forward():
    from dsh.llm.models import load
    from dsh.training.laptop_base import SHIPPED_BASE

    m, _ = load(str(SHIPPED_BASE))
    m.set_attn_implementation(packing.register("fused"))
    ids = torch.randint(3, 60, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0                                      # a padded batch: no packed row, transformers' attention
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=mask).logits
        with fl.fused_layers(m):
            got = m(input_ids=ids, attention_mask=mask).logits
    assert _close(got[mask.bool()], ref[mask.bool()])

    ids_p, pos = _packed_row(2)                          # bfloat16 weights: every module its own forward
    half = load(str(SHIPPED_BASE))[0].to(torch.bfloat16)
    half.set_attn_implementation(packing.register("fused"))
    with torch.no_grad():
        ref = half(input_ids=ids_p, position_ids=pos).logits
        with fl.fused_layers(half):
            assert torch.equal(half(input_ids=ids_p, position_ids=pos).logits, ref)

    class Adapted(torch.nn.Linear):                      # as a LoRA layer would be: its weight is not all it computes
        pass

    attn = m.model.layers[0].self_attn
    q = attn.q_proj
    attn.q_proj = Adapted(q.in_features, q.out_features, bias=False)
    m.model.layers[1].self_attn.q_norm = torch.nn.Identity()   # a query norm, as some llama-family attentions have
    with fl.fused_layers(m) as n:
        assert "forward" not in vars(attn) and "forward" not in vars(m.model.layers[1].self_attn)
        assert n == 4 * len(m.model.layers) - 1
