"""The machine a ``dsh bench --parts tiny`` runs on, as the bench measures and uses it: its peaks
(:func:`device_peaks`), whether a run's load says something ran beside the bench (:func:`loaded`), the process's
minor page faults (:func:`minor_faults`) and the opt-in fast paths it can run (:func:`fast_paths`)."""

from __future__ import annotations

import os

from ...llm import kernels
from ...llm.peaks import fma_rate, matmul_peak, memory_bandwidth, onednn_matmul_peak, read_bandwidth


def device_peaks(repeats: int = 7) -> dict:
    """The machine's peaks (:mod:`dsh.llm.peaks`), each the best of ``repeats``: the fp32 matmul peak of torch's own
    product (MKL; ``matmul_peak_flops``) and of oneDNN with packed weights (``onednn_matmul_flops``, where torch has
    it), both at 1024^3, the better of the two (``library_peak_flops``: the rooflines' matmul peak), the FMA issue
    rate of every thread (``fma_issue_flops``, where the kernels build: the hardware's bound), the read bandwidth
    (bytes/s of a sum over 256 MB on every thread) and the copy bandwidth (read + write bytes/s of a 256 MB copy)."""
    import torch

    cpu = torch.device("cpu")
    got = {"matmul_peak_flops": matmul_peak(cpu, repeats), "read_bandwidth_bytes_per_s": read_bandwidth(cpu, 256, repeats),
           "copy_bandwidth_bytes_per_s": memory_bandwidth(cpu, 256, repeats)}
    onednn, fma = onednn_matmul_peak(repeats), fma_rate(repeats)
    if onednn is not None:
        got["onednn_matmul_flops"] = onednn
    if fma is not None:
        got["fma_issue_flops"] = fma
    got["library_peak_flops"] = max(got["matmul_peak_flops"], onednn or 0.0)
    return got


def loaded(load_1min: float) -> bool:
    """Whether a run's 1-minute load average says that more than the bench ran beside it: above the CPUs' count
    plus a half (the bench's own threads load each CPU about once)."""
    return load_1min > (os.cpu_count() or 1) + 0.5


def minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fast_paths() -> dict:
    """The opt-in fast paths of training and sampling on this machine: the packed attention in C
    (``packed_attention``), the float16 KV cache where :func:`dsh.llm.kernels.half_cache` holds
    (``rollout_kv_cache``)."""
    half = kernels.half_cache(kernels.load())
    return {"packed_attention": "kernels", "rollout_kv_cache": "float16" if half else "float32"}
