"""The decoding step's attention alone in ``dsh bench --parts tiny``: :func:`dsh.llm.kernels.attend` (one layer, one
decoding position of every row) at the sampling part's rows, every row at the same context length, on caches of
random keys and values in each dtype the engine has (float32; float16 where the CPU converts half floats in
hardware). It reads each row's keys and values up to its position once, so its rate in bytes per second, set
against the read bandwidth measured in the same run and measured beside it (:func:`add_shares`), is how near the
attention streams the cache at the memory's speed. At small shapes (the ``cpu`` size's 32 rows at 20-40 positions:
about a megabyte of cache) the caches stay in the CPU's own caches and the share can pass 1."""

from __future__ import annotations

import time

from ...llm import kernels
from ...llm.models import load
from ...llm.peaks import read_bandwidth
from ...training.laptop_base import SHIPPED_BASE


def attention_rate(model, rows: int, context: int, kv_dtype=None, repeats: int = 30) -> dict:
    """Seconds per :func:`dsh.llm.kernels.attend` call with ``rows`` rows at position ``context`` (each reading
    ``context + 1`` positions of keys and values of ``model``'s attention shape, in ``kv_dtype``), and the bytes of
    cache it reads per second: the best of ``repeats`` decoding steps after a warm-up, a step one call per layer on
    that layer's own cache, as the engine runs them (so the caches are not all in the CPU's last-level cache);
    ``kv_dtype`` None: float32."""
    import torch

    from ...llm.kernel_engine import attention_shape

    kv_dtype = torch.float32 if kv_dtype is None else kv_dtype
    lib = kernels.load()
    if lib is None:
        raise ValueError(f"the C kernels are unavailable: {kernels.why_not}")
    H, KV, D, scale = attention_shape(model)
    T = kernels.TILE
    M = -(-(context + 1) // T) * T
    g = torch.Generator().manual_seed(0)
    layers = model.config.num_hidden_layers
    k = [torch.randn(rows, M // T, KV, D, T, generator=g).to(kv_dtype) for _ in range(layers)]
    v = [torch.randn(rows, M, KV, D, generator=g).to(kv_dtype) for _ in range(layers)]
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(M)[None])
    cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
    qkv = torch.randn(rows, (H + 2 * KV) * D, generator=g)
    pos = torch.full((rows,), context, dtype=torch.long)
    lens, slot, out = pos + 1, torch.arange(rows), torch.empty(rows, H, D)
    best = float("inf")
    for i in range(repeats + 1):
        t = time.perf_counter()
        for kl, vl in zip(k, v):
            kernels.attend(lib, qkv, cos, sin, pos, lens, slot, kl, vl, out, KV, M, scale)
        if i:                                             # the first step warms the threads up
            best = min(best, (time.perf_counter() - t) / layers)
    read = rows * (context + 1) * KV * D * 2 * k[0].element_size()
    return {"rows": rows, "context": context, "kv_cache": str(kv_dtype).replace("torch.", ""),
            "seconds_per_call": best, "kv_bytes_per_call": read, "bytes_per_s": read / best}


def attention_rows(rows: int, max_new: int) -> list[dict]:
    """:func:`attention_rate` of the shipped base at ``rows`` rows, at half and at all of ``max_new`` positions, for
    each cache dtype the engine has here, each with the read bandwidth measured just before and just after it (the
    larger: ``read_bandwidth_beside``), since this host's bandwidth moves between minutes more than the attention's
    rate does."""
    import torch

    model, _ = load(str(SHIPPED_BASE), device="cpu")
    dtypes = [torch.float32] + ([torch.float16] if kernels.half_cache(kernels.load()) else [])
    out = []
    for c in (max_new // 2, max_new):
        for d in dtypes:
            before = read_bandwidth(torch.device("cpu"))
            r = attention_rate(model, rows, c, d)
            out.append({**r, "read_bandwidth_beside": max(before, read_bandwidth(torch.device("cpu")))})
    return out


def add_shares(rows: list[dict], peaks: dict) -> None:
    """Each row's rate as a share of the read bandwidth in ``peaks`` (the tiny bench's device peaks) and of the one
    measured beside it."""
    for r in rows:
        r["share_of_read_bandwidth"] = r["bytes_per_s"] / peaks["read_bandwidth_bytes_per_s"]
        if "read_bandwidth_beside" in r:
            r["share_of_read_bandwidth_beside"] = r["bytes_per_s"] / r["read_bandwidth_beside"]
