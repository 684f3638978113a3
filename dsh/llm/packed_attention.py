"""Causal attention over packed sequences on the CPU, forward and backward in C (:mod:`dsh.llm.kernels`).

Training and scoring pack the sequences of a step into one row (:mod:`dsh.llm.packing`); each query attends to the
keys of its own sequence up to its own position. torch has no such call on the CPU: one causal
``scaled_dot_product_attention`` per sequence runs at about a tenth of the matmul peak at the tiny model's head size
(32; ~28 GFLOP/s forward and backward for 32 sequences of 150-250 tokens on the 2-core machine).
:func:`packed_causal_attention` computes every (sequence, head) in one call, in the flash-attention form (scores
recomputed in the backward pass from the stored log-sum-exp, no ``T x T`` matrix kept), over OpenMP threads, one task
per (sequence, head): the same values whatever the thread count. The results equal the per-sequence torch call up to
float rounding (a test compares values and gradients). It is 2-4x the per-sequence calls there; a training step
spends most of its time in the matrix products, so the step gains less (README, "Performance on two CPU cores").
"""

from __future__ import annotations

import torch

from ..core import validate
from . import kernels

PRODUCTS = ("float32", "bfloat16")   # the attention's products (packed_causal_attention)


def bfloat16_products(head_dim: int) -> bool:
    """Whether the attention takes bfloat16 products at this head size: the kernels were built with
    AVX512_BF16 (``has_attention_bf16``), the CPU has it, and the head size is 32 (the tiny model's)."""
    lib = kernels.load()
    return bool(lib is not None and head_dim == 32 and lib.has_attention_bf16() and kernels.bf16_dot_products())


class _PackedCausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, scale: float, products: str):
        lib = kernels.load()
        H, T, D = q.shape
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty(T, H, D, dtype=torch.float32)
        lse = torch.empty(H, T, dtype=torch.float32)
        products = "bfloat16" if products == "bfloat16" and bfloat16_products(D) else "float32"
        forward = lib.varlen_attention_bf16 if products == "bfloat16" else lib.varlen_attention
        forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), cu.data_ptr(), cu.numel() - 1, H, T, D, float(scale),
                out.data_ptr(), lse.data_ptr())
        ctx.save_for_backward(q, k, v, cu, out, lse)
        ctx.scale, ctx.products = scale, products
        return out

    @staticmethod
    def backward(ctx, dout):
        lib = kernels.load()
        q, k, v, cu, out, lse = ctx.saved_tensors
        H, T, D = q.shape
        dout = dout.contiguous()
        delta = (dout * out).sum(-1).T.contiguous()          # [H, T]: dout_i . out_i
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bf16 = ctx.products == "bfloat16"           # as the forward ran
        backward = lib.varlen_attention_backward_bf16 if bf16 else lib.varlen_attention_backward
        backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), cu.data_ptr(), cu.numel() - 1, H, T, D, float(ctx.scale),
                 dout.data_ptr(), lse.data_ptr(), delta.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
        return dq, dk, dv, None, None, None


def packed_causal_attention(q, k, v, cu, scale: float, products: str = "float32"):
    """``q, k, v [H, T, D]`` (float32, CPU; as many key/value heads as query heads) of sequences packed one after
    another, sequence ``s`` at rows ``cu[s] .. cu[s + 1] - 1`` (``cu`` int64, from 0 to ``T``) -> ``[T, H, D]``:
    softmax(scale * q . k) . v over the keys of the query's own sequence up to its position. Differentiable in
    ``q``, ``k`` and ``v``. ``products``: the attention's products in float32, or in bfloat16 where
    :func:`bfloat16_products` holds (float32 elsewhere): both passes read q, k, v, dout, the probabilities and the
    score gradients rounded to bfloat16, multiply them in pairs and sum in float32, the backward pass recomputing the
    forward's scores bit for bit; the softmax in float32. Output and gradients are then off float64's by about what
    rounding the inputs to bfloat16 costs, as torch's bfloat16 attention is (a test compares the three); GRPO's update
    under bfloat16 autocast (:mod:`dsh.llm.fused_layers`) takes them."""
    validate.choice("products", products, PRODUCTS)
    why = kernels.unavailable()
    if why:
        raise RuntimeError(f"packed_causal_attention needs the C kernels: {why}")
    if ({t.dtype for t in (q, k, v)} != {torch.float32} or {t.device.type for t in (q, k, v)} != {"cpu"}
            or k.shape != q.shape or v.shape != q.shape):
        raise ValueError(f"q, k, v must be float32 CPU tensors of one shape [H, T, D]; got {tuple(q.shape)} "
                         f"{q.dtype} on {q.device}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    cu = cu.to(dtype=torch.int64, device="cpu").contiguous()
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != q.shape[1] or bool((cu.diff() < 0).any()):
        raise ValueError(f"cu must rise from 0 to T={q.shape[1]}; got {cu.tolist()[:8]}...")
    return _PackedCausal.apply(q, k, v, cu, float(scale), products)
