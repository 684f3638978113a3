"""The machine's peaks, measured where the benchmarks run: the matmul peak, the copy bandwidth and the read bandwidth,
each the best of several tries (``dsh bench`` and :mod:`dsh.experiment.bench.tiny` put every speed beside them;
:mod:`dsh.llm.roofline` turns them into the least time of a sampling workload)."""

from __future__ import annotations

import functools
import time

from . import kernels


def sync(device):
    """Wait for the device's queued work (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(device, f, repeats: int) -> float:
    """Seconds of the fastest of ``repeats + 1`` calls of ``f`` (the first warms up)."""
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        t = time.perf_counter()
        f()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def memory_bandwidth(device, mbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (a read and a write of every byte), best of ``repeats``."""
    import torch

    n = (mbytes or (1024 if device.type == "cuda" else 256)) * 2 ** 20
    x = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    y = torch.empty_like(x)
    return 2 * n / best_seconds(device, lambda: y.copy_(x), repeats)


def read_bandwidth(device, mbytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second of reading a large float32 tensor once (a sum over it), best of ``repeats``."""
    import torch

    x = torch.ones(mbytes * 2 ** 18, device=device)
    return x.numel() * 4 / best_seconds(device, lambda: x.sum(), repeats)


def matmul_peak(device, repeats: int = 5) -> float:
    """FLOP/s of a large matmul in the training dtype (bf16 on CUDA, fp32 on CPU), best of ``repeats``."""
    import torch

    cuda = device.type == "cuda"
    n, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / best_seconds(device, lambda: a @ b, repeats)


def fma_rate(repeats: int = 5) -> float | None:
    """FLOP/s of the CPU's fused multiply-adds on every thread (the C kernels' ``fma_rate``: independent chains, no
    memory traffic), best of ``repeats``: the hardware's fp32 peak, which no matrix product exceeds; None where the
    kernels do not build."""
    lib = kernels.load()
    if lib is None:
        return None
    lib.fma_rate(1_000_000)                       # warm-up (threads started, clocks up)
    return max(lib.fma_rate(20_000_000) for _ in range(repeats))


@functools.cache
def onednn_available() -> bool:
    """Whether torch has oneDNN's packed linear product on the CPU (tried once a process)."""
    import torch

    ops = getattr(torch.ops, "mkldnn", None)
    if ops is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.zeros(8, 8)
        ops._linear_pointwise(torch.zeros(2, 8), ops._reorder_linear_weight(w), None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


def onednn_matmul_peak(repeats: int = 5) -> float | None:
    """FLOP/s of a 1024^3 fp32 product by oneDNN with its weights packed ahead (the path torch's inductor takes on
    the CPU), best of ``repeats``; None where torch has no oneDNN. On some CPUs it is well above MKL's
    :func:`matmul_peak`, on others level with it."""
    import torch

    if not onednn_available():
        return None
    ops = torch.ops.mkldnn
    n = 1024
    a, w = torch.randn(n, n), torch.randn(n, n)
    try:
        packed = ops._reorder_linear_weight(w, n)
        f = lambda: ops._linear_pointwise(a, packed, None, "none", [], "")  # noqa: E731
        f()
    except (RuntimeError, AttributeError):
        return None
    return 2 * n ** 3 / best_seconds(torch.device("cpu"), f, repeats)
