"""What training a model needs in memory (for choosing a configuration before renting GPUs).

Per parameter, mixed-precision full fine-tuning with Adam holds: bf16 weights (2 bytes), bf16
gradients (2), fp32 master weights (4) and two fp32 Adam moments (8): 16 bytes. LoRA keeps the base
weights frozen in bf16 (2 bytes) and trains a small adapter. Activations come on top and depend on
sequence length and batch (gradient checkpointing cuts them to about one layer's worth).
"""

from __future__ import annotations

from . import _validate as v

BYTES_PER_PARAM = {
    "full (bf16 + fp32 master + Adam)": 16,
    "full, ZeRO-3 over N GPUs (per GPU)": None,   # 16 / N
    "full, optimizer offloaded to CPU (GPU part)": 4,   # bf16 weights + bf16 grads
    "LoRA (frozen bf16 base)": 2,
    "inference / reference model (bf16)": 2,
}


def memory_table(n_params: float, n_gpus: int = 8, lora_fraction: float = 0.01) -> list[dict]:
    """Memory in GB (10^9 bytes) for the configurations above (weights, gradients and optimizer only).

    ``lora_fraction``: trainable adapter parameters as a fraction of the model (16 bytes each)."""
    if v.real("n_params", n_params) <= 0:
        raise ValueError(f"n_params must be a positive number of parameters, got {n_params!r}")
    n_gpus = v.positive_int("n_gpus", n_gpus)
    v.probability("lora_fraction", lora_fraction)
    gb = 1e9
    rows = []
    for name, b in BYTES_PER_PARAM.items():
        if b is None:
            gb_val = 16 * n_params / n_gpus / gb
            name = name.replace("N", str(n_gpus))
        elif name.startswith("LoRA"):
            gb_val = (2 * n_params + 16 * lora_fraction * n_params) / gb
        else:
            gb_val = b * n_params / gb
        rows.append({"configuration": name, "GB": gb_val})
    return rows
