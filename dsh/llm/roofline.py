"""The roofline of sampling from a model: the least time a machine of a given matmul peak and memory read
bandwidth needs to decode a workload (prompts and completions of given lengths), the larger of its matrix-product
time and its KV-cache read time (``dsh bench --parts tiny`` reports each path's share of it)."""

from __future__ import annotations

from .scale import ModelShape, kv_bytes_per_token


def model_shape(model) -> dict:
    """What the roofline needs of a model: parameters in matrix products (linear layers and the LM head), layers,
    attention width (heads x head size) and KV bytes per token of context."""
    import torch

    shape = ModelShape.from_config(model.config, n_params=0)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return {"matmul_params": linear, "layers": shape.layers, "attention_width": shape.heads * shape.head_dim,
            "kv_bytes_per_token": kv_bytes_per_token(model)}


def sampling_work(shape: dict, prompt_lens, gen_lens) -> dict:
    """The work of a sampling workload: prompts of ``prompt_lens`` tokens, completions of ``gen_lens`` tokens. A row of
    prompt p and completion g runs p + g - 1 forward positions (the last token is not fed back); position i attends
    i + 1 positions. Matmul FLOPs: 2 x matmul_params per position plus 4 x (i + 1) x attention width per layer; KV
    bytes: each position after the prompt reads the keys and values of its i + 1 positions once (a prompt's own
    attention needs no cache read)."""
    flops = kv = 0.0
    for p, g in zip(prompt_lens, gen_lens):
        n = p + g - 1                                            # forward positions 0 .. n - 1
        attended = n * (n + 1) / 2                               # sum of (i + 1)
        decoded = attended - p * (p + 1) / 2                     # the positions after the prompt
        flops += 2 * shape["matmul_params"] * n + 4 * shape["attention_width"] * shape["layers"] * attended
        kv += shape["kv_bytes_per_token"] * decoded
    return {"flops": flops, "kv_bytes": kv}


def roofline(work: dict, peak_flops: float, read_bandwidth: float) -> dict:
    """The least time a machine of ``peak_flops`` and ``read_bandwidth`` needs for ``work`` (:func:`sampling_work`):
    ``roofline_s`` the larger of the matmul and KV-read times, ``serial_s`` their sum."""
    mm, rd = work["flops"] / peak_flops, work["kv_bytes"] / read_bandwidth
    return {**work, "matmul_s": mm, "kv_read_s": rd, "roofline_s": max(mm, rd), "serial_s": mm + rd,
            "bound_by": "matmul" if mm >= rd else "KV read"}


def sampling_roofline(shape: dict, prompt_lens, gen_lens, peak_flops: float, read_bandwidth: float) -> dict:
    """:func:`roofline` of :func:`sampling_work`."""
    return roofline(sampling_work(shape, prompt_lens, gen_lens), peak_flops, read_bandwidth)
