"""SFT without paying for padding: attention over packed examples that never crosses their boundaries.

With TRL's ``padding_free=True`` the collator concatenates the examples of a micro-batch into one row
of ``sum(lengths)`` tokens, restarts ``position_ids`` at 0 for each example and passes the example
boundaries as ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (cumulative lengths). Attention must then be
causal *within* each example only. transformers' ``sdpa`` is no answer: on an H100 packed
training with it ran at 0.9 % MFU (a dense ``tokens x tokens`` mask; README, "Which engine runs
where"), and with transformers 5.23 on CPU its loss on a packed row of three examples was 1.25
where the padded batch gives 1.84.
:data:`VARLEN` is an attention implementation registered with transformers' ``AttentionInterface``
that uses the boundaries directly:

- on CUDA, torch's ``varlen_attn`` (flash attention over cumulative lengths, in PyTorch itself);
- on the CPU, :data:`VARLEN` runs causal ``scaled_dot_product_attention`` on each example in turn, and
  :data:`VARLEN_KERNELS` every example and head in one call of :func:`dsh.llm.packed_attention.packed_causal_attention`
  (C, forward and backward; the same values up to float rounding, 2-4x faster at the tiny model's head size; the
  per-example path where the kernels cannot be built or the tensors are not float32).

A batch without boundaries (evaluation, generation with a cache) goes to the ordinary ``sdpa`` path.
Select it with ``model.set_attn_implementation(dsh.llm.packing.register())`` (``register("kernels")`` for
:data:`VARLEN_KERNELS`); :func:`dsh.training.train.train` does so when ``TrainConfig.padding_free`` is on (the path
``TrainConfig.packed_attention`` names), and restores ``sdpa`` before saving the model.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .kernels import unavailable as kernels_unavailable

VARLEN = "dsh_varlen"
VARLEN_KERNELS = "dsh_varlen_kernels"
# TrainConfig.packed_attention -> attention implementation (fused: the kernels' attention, the layers' other
# element-wise work in C as well, dsh.llm.fused_layers)
PATHS = {"torch": VARLEN, "kernels": VARLEN_KERNELS, "fused": VARLEN_KERNELS}


def boundaries(kwargs, n_tokens: int, device):
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        return cu.to(device=device, dtype=torch.int32), int(kwargs.get("max_length_q") or cu.diff().max())
    pos = kwargs.get("position_ids")
    if pos is None or pos.shape[0] != 1:
        return None, 0
    starts = (pos[0] == 0).nonzero().flatten()
    if starts.numel() <= 1:
        return None, 0
    cu = torch.cat([starts, torch.tensor([n_tokens], device=starts.device)]).to(device=device, dtype=torch.int32)
    return cu, int(cu.diff().max())


def _varlen_cuda(q, k, v, cu, max_len, scale):  # pragma: no cover - CUDA only
    """q [T, H, D], k/v [T, KV, D] -> [T, H, D] with torch's varlen_attn (signature differs by release)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw = {"scale": scale}
    if "window_size" in params:
        kw["window_size"] = (-1, 0)
    else:
        kw["is_causal"] = True
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)


def varlen_cuda_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, kernels: bool = False, **kwargs):
    """transformers attention function: ``query [1, H, T, D]``, ``key``/``value [1, KV, T, D]`` of
    packed examples -> ``([1, T, H, D], None)``, causal within each example; on the CPU through the C kernels when
    ``kernels`` (and they are available), else one torch call per example."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    T = query.shape[2]
    cu, max_len = boundaries(kwargs, T, query.device) if query.shape[0] == 1 and key.shape[2] == T else (None, 0)
    if cu is None:
        if attention_mask is not None and attention_mask.dim() == 2:  # a padding mask (flash style): make it 4-D
            q_len, k_len = query.shape[2], key.shape[2]
            i = torch.arange(q_len, device=query.device)[:, None] + (k_len - q_len)
            j = torch.arange(k_len, device=query.device)[None]
            # causal and not padding; a padding query sees itself, so no row is empty (no NaN)
            attention_mask = ((j <= i)[None, None] & attention_mask[:, None, None, -k_len:].bool()) | (j == i)[None, None]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout:
        raise ValueError(f"attention dropout must be 0 with {VARLEN} attention, got {dropout}")
    if query.is_cuda and varlen_cuda_available():  # pragma: no cover - CUDA only
        out = _varlen_cuda(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                           cu, max_len, scaling)
        return out[None], None
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    if len({query.dtype, key.dtype, value.dtype}) > 1 or (kernels and query.dtype == torch.bfloat16):
        # under autocast (TrainConfig.update_precision) the projections come out bfloat16 and the rotary embedding
        # turns queries and keys back to float32: attention is computed in float32
        query, key, value = query.float(), key.float(), value.float()
    if kernels and query.dtype == torch.float32 and query.device.type == "cpu":
        from .packed_attention import packed_causal_attention

        if kernels_unavailable() is None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return packed_causal_attention(query[0], key[0], value[0], cu, scale)[None], None
    lens = [n for n in cu.diff().tolist() if n > 0]
    # torch.split, not slicing: one backward that joins the parts' gradients (a slice's backward writes a
    # zero-filled gradient of the whole row for every part)
    parts = [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
             for q, k, v in zip(query.split(lens, 2), key.split(lens, 2), value.split(lens, 2))]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def register(path: str = "torch") -> str:
    """Register the packed attention of ``path`` (:data:`PATHS`: ``torch`` -> :data:`VARLEN`, ``kernels`` and
    ``fused`` -> :data:`VARLEN_KERNELS`) with transformers (attention and mask interfaces); returns its name."""
    if path not in PATHS:
        raise ValueError(f"packed_attention must be one of {', '.join(PATHS)}; got {path!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    name = PATHS[path]
    fn = functools.partial(varlen_attention_forward, kernels=path == "kernels")
    AttentionInterface.register(name, fn)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, flash_attention_mask)  # no dense mask: None when causal
    return name
