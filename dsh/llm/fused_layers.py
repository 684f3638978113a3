"""The decoder layers' element-wise work in C for training on packed rows: RMS norms, the rotary embedding and the
gated activation, forward and backward (:mod:`dsh.llm.kernels`).

transformers' llama layers spend a training step's non-product time in element-wise torch calls: an RMS norm is
five of them forward (square, mean, rsqrt, two products) and more backward; the rotary embedding slices, negates,
concatenates and multiplies queries and keys; SwiGLU is three; the attention's inputs are transposed and copied into
the packed attention's layout. On the tiny model at ~10,000 tokens a step these calls take about a third of the
forward and backward passes on two CPU cores (README, "Performance on two CPU cores"). :func:`fused_layers` swaps,
for the duration of a ``with`` block, each llama-family layer's

- RMS norm for one C pass forward (keeping each row's ``1 / rms``) and one backward;
- attention, on a packed row (:mod:`dsh.llm.packing`: one sequence after another, positions restarting at 0), for
  one product of the concatenated q/k/v weights, one C pass that rotates queries and keys and writes the three in
  :func:`dsh.llm.packed_attention.packed_causal_attention`'s layout (its backward the inverse rotation), that
  attention, and the output projection;
- gated MLP (SiLU) for one product of the concatenated gate/up weights, one C pass for silu(gate) * up (and one
  back), and the down projection.

The same function in real arithmetic; in float32 the values and gradients equal transformers' to rounding (a test
compares them), and do not depend on the thread count. Under CPU autocast to bfloat16 (GRPO's
``update_precision="bfloat16"``) the q/k/v and gate/up products come out in bfloat16: the rotation and SiLU read them
as they are and SiLU writes bfloat16 for the down product, the same bits as converting to float32 and back around
the float32 calls, without those conversions (on an AMD Zen 4, an update step 1.18x faster); the attention then
takes bfloat16 products too (``packed_causal_attention(..., products="bfloat16")`` where the CPU has them: a GRPO
round's update 1.08x, 0.99-1.14x over 6 alternations on the Zen 4).

A module the swap does not fit (another activation, key/value heads shared by several query heads, a sliding window,
a query/key norm or any other submodule, LoRA-wrapped projections, a batch with padding, a float type other than
float32 in the weights or a norm's input) runs its own forward.
"""

from __future__ import annotations

import contextlib

import torch

from . import kernels
from .packed_attention import packed_causal_attention
from .packing import boundaries

F = torch.nn.functional
NORM_BLOCK = 64     # rows whose weight-gradient terms an RMS norm's backward sums together, the blocks then in order


def _lib():
    why = kernels.unavailable()
    if why:
        raise RuntimeError(f"fused_layers needs the C kernels: {why}")
    return kernels.load()


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps: float):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out, rstd = torch.empty_like(x2), torch.empty(x2.shape[0])
        _lib().rms_norm_rstd(x2.data_ptr(), w.data_ptr(), float(eps), out.data_ptr(), rstd.data_ptr(), *x2.shape)
        ctx.save_for_backward(x2, w, rstd)
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, rstd = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape).contiguous()
        dx, dwp = torch.empty_like(x2), torch.empty(-(-x2.shape[0] // NORM_BLOCK), x2.shape[1])
        _lib().rms_norm_backward(x2.data_ptr(), w.data_ptr(), rstd.data_ptr(), dy2.data_ptr(), dx.data_ptr(),
                                 dwp.data_ptr(), *x2.shape, NORM_BLOCK)
        return dx.view(dy.shape), dwp.sum(0), None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu):
        gu = gu.contiguous()
        out = torch.empty(gu.shape[0], gu.shape[1] // 2, dtype=gu.dtype)
        f = _lib().silu_mul_bf16 if gu.dtype == torch.bfloat16 else _lib().silu_mul
        f(gu.data_ptr(), out.data_ptr(), *out.shape)
        ctx.save_for_backward(gu)
        return out

    @staticmethod
    def backward(ctx, da):
        (gu,) = ctx.saved_tensors
        da = da.to(gu.dtype).contiguous()
        dgu = torch.empty_like(gu)
        f = _lib().silu_mul_bf16_backward if gu.dtype == torch.bfloat16 else _lib().silu_mul_backward
        f(gu.data_ptr(), da.data_ptr(), dgu.data_ptr(), *da.shape)
        return dgu


class _RopeSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, H: int, KV: int):
        T, D = qkv.shape[0], cos.shape[1]
        qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
        q, k, v = torch.empty(H, T, D), torch.empty(KV, T, D), torch.empty(KV, T, D)
        f = _lib().rope_split_bf16 if qkv.dtype == torch.bfloat16 else _lib().rope_split
        f(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), T, H, KV, D)
        ctx.save_for_backward(cos, sin)
        ctx.shape, ctx.dtype = (T, H, KV, D), qkv.dtype
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        T, H, KV, D = ctx.shape
        dq, dk, dv = (torch.zeros(n, T, D) if g is None else g.contiguous() for g, n in ((dq, H), (dk, KV), (dv, KV)))
        dqkv = torch.empty(T, (H + 2 * KV) * D, dtype=ctx.dtype)
        f = _lib().rope_split_bf16_backward if ctx.dtype == torch.bfloat16 else _lib().rope_split_backward
        f(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), cos.data_ptr(), sin.data_ptr(), dqkv.data_ptr(), T, H, KV, D)
        return dqkv, None, None, None, None


def rms_norm(x, weight, eps: float):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension (transformers' LlamaRMSNorm), float32, in C."""
    return _RMSNorm.apply(x, weight, eps)


def silu_mul(gate_up):
    """``silu(gate) * up`` of ``gate_up [N, 2F]`` (the gate then the up projection), in C: float32, or bfloat16 (the
    float32 arithmetic on the widened values, the result and the gradient rounded to bfloat16, as the float32 call
    between two conversions gives them)."""
    if gate_up.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"gate_up must be float32 or bfloat16; got {gate_up.dtype}")
    return _SiluMul.apply(gate_up)


def rope_split(qkv, cos, sin, heads: int, kv_heads: int):
    """``qkv [T, (H + 2 KV) D]`` -> ``q [H, T, D]``, ``k [KV, T, D]`` rotated by each token's ``cos, sin [T, D]``
    (transformers' rotate_half convention), ``v [KV, T, D]``; float32, in C. ``qkv`` float32 or bfloat16 (widened as
    it is read; its gradient then bfloat16, rounded as torch rounds)."""
    if qkv.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"qkv must be float32 or bfloat16; got {qkv.dtype}")
    return _RopeSplit.apply(qkv, cos, sin, heads, kv_heads)


def _cat(mods):
    """The weights (and biases, or None) of linear layers that read one input, as one layer's."""
    w = torch.cat([m.weight for m in mods])
    if all(m.bias is None for m in mods):
        return w, None
    return w, torch.cat([m.bias if m.bias is not None else torch.zeros(m.weight.shape[0]) for m in mods])


def _norm_forward(mod, own):
    def forward(x):
        if x.dtype != torch.float32 or mod.weight.dtype != torch.float32 or x.device.type != "cpu":
            return own(x)
        return rms_norm(x, mod.weight, mod.variance_epsilon)
    return forward


def _mlp_forward(mod, own):
    def forward(x):
        if x.device.type != "cpu" or mod.down_proj.weight.dtype != torch.float32:
            return own(x)
        gu = F.linear(x, *_cat([mod.gate_proj, mod.up_proj]))
        # under bfloat16 autocast (GRPO's update_precision) the product is bfloat16: the activation reads and writes
        # bfloat16, the down product's input as autocast would round it, without the two conversions between
        gu = gu if gu.dtype == torch.bfloat16 else gu.float()
        return mod.down_proj(silu_mul(gu.reshape(-1, gu.shape[-1])).view(*x.shape[:-1], -1))
    return forward


def _attention_forward(mod, own, heads: int, kv_heads: int, head_dim: int):
    def forward(hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kwargs):
        T = hidden_states.shape[1]
        cu = None
        # a cache that already holds keys would need attention over them too: transformers' path
        empty = past_key_values is None or past_key_values.get_seq_length(mod.layer_idx) == 0
        if (hidden_states.shape[0] == 1 and empty and hidden_states.device.type == "cpu"
                and mod.o_proj.weight.dtype == torch.float32):
            cu, _ = boundaries(kwargs, T, hidden_states.device)
        if cu is None or position_embeddings is None:
            return own(hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask,
                       past_key_values=past_key_values, **kwargs)
        qkv = F.linear(hidden_states[0], *_cat([mod.q_proj, mod.k_proj, mod.v_proj]))
        qkv = qkv if qkv.dtype == torch.bfloat16 else qkv.float()      # bfloat16 under autocast: widened in C
        cos, sin = (t[0].float() for t in position_embeddings)
        q, k, v = rope_split(qkv, cos, sin, heads, kv_heads)
        if past_key_values is not None:                 # stored as transformers stores them: [1, KV, T, D]
            past_key_values.update(k[None], v[None], mod.layer_idx)
        # under bfloat16 autocast the attention takes bfloat16 products too, both passes (where the CPU has them)
        o = packed_causal_attention(q, k, v, cu, mod.scaling, "bfloat16" if qkv.dtype == torch.bfloat16 else "float32")
        return mod.o_proj(o.reshape(1, T, heads * head_dim)), None
    return forward


def _plain(mod, names, others=()) -> bool:
    """Whether ``mod``'s submodules are the linear layers ``names``, each a plain ``torch.nn.Linear`` (not a
    LoRA-wrapped one, whose adapters the concatenated weights would leave out), and ``others``, nothing more (a
    query/key norm, as some llama-family attentions have, is work the swap would leave out)."""
    children = dict(mod.named_children())
    return set(children) == set(names) | set(others) and all(type(children[n]) is torch.nn.Linear for n in names)


@contextlib.contextmanager
def fused_layers(model):
    """Inside it, the RMS norms, attention and gated MLPs of ``model`` (a llama-family model) run the C paths of the
    module docstring where they fit; on leaving, the modules are as before. Yields the number of modules swapped."""
    _lib()
    cfg = model.config
    swapped = []
    for mod in model.modules():
        name = type(mod).__name__
        if name.endswith("RMSNorm") and hasattr(mod, "variance_epsilon"):
            mod.forward = _norm_forward(mod, mod.forward)
        elif name.endswith("MLP") and _plain(mod, ("gate_proj", "up_proj", "down_proj"), ("act_fn",)):
            if getattr(getattr(mod, "config", cfg), "hidden_act", None) != "silu":
                continue
            mod.forward = _mlp_forward(mod, mod.forward)
        elif name.endswith("Attention") and _plain(mod, ("q_proj", "k_proj", "v_proj", "o_proj")):
            heads = cfg.num_attention_heads
            kv = getattr(cfg, "num_key_value_heads", None) or heads
            if kv != heads or getattr(mod, "is_causal", True) is not True or getattr(mod, "sliding_window", None):
                continue
            mod.forward = _attention_forward(mod, mod.forward, heads, kv, mod.head_dim)
        else:
            continue
        swapped.append(mod)
    try:
        yield len(swapped)
    finally:
        for mod in swapped:
            del mod.forward
