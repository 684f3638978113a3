"""What training a model needs in memory (for choosing a configuration before renting GPUs, and for
deriving the batch sizes of the ``gpu-small`` presets from their token budgets).

Per parameter, mixed-precision full fine-tuning with Adam holds: bf16 weights (2 bytes), bf16
gradients (2), fp32 master weights (4) and two fp32 Adam moments (8): 16 bytes. LoRA keeps the base
weights frozen in bf16 (2 bytes) and trains a small adapter. Activations come on top and depend on
sequence length and batch (gradient checkpointing cuts them to about one layer's worth).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import validate as v

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


# ------------------------------------------------------------------------------------------------
# Activation memory of one training micro-batch, and the batch that fits a GPU
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """The sizes that memory depends on (read from a transformers config with :meth:`from_config`)."""

    n_params: float
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, cfg, n_params: float | None = None) -> ModelShape:
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        if n_params is None:  # embeddings (tied or not) + attention + MLP + norms
            h, i, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
            per_layer = h * heads * head_dim * 2 + h * kv * head_dim * 2 + 3 * h * i + 2 * h
            n_params = V * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2) + L * per_layer + h
        return cls(float(n_params), cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size,
                   cfg.vocab_size, heads, kv, head_dim)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache per token of context: layers x 2 x kv_heads x head_dim x bytes."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


# SmolLM2-135M-Instruct, the embedded model (its config.json; a test compares them)
EMBEDDED_SHAPE = ModelShape(n_params=134_515_008, hidden=576, layers=30, intermediate=1536, vocab=49_152,
                            heads=9, kv_heads=3, head_dim=64)


def activation_bytes_per_token(shape: ModelShape, gradient_checkpointing: bool = False) -> float:
    """Bytes kept for the backward pass per token of a micro-batch, bf16, no dropout, fused attention.

    Per layer: the two RMSNorm inputs in fp32 (2 x 4h) and outputs (2 x 2h), q, k, v before and q, k
    after RoPE and the attention output (2 x (4h + 3 kv_dim)), the MLP's gate, up, activation and
    product (4 x 2 x intermediate) and the residual stream (2h): 18h + 6 kv_dim + 8 intermediate + 2h.
    With gradient checkpointing only the residual stream of each layer is kept (2h), plus one layer
    recomputed at a time. The logits add vocab x (2 + 4 + 4) bytes (bf16 logits, their fp32 copy for the
    loss and its gradient). An upper estimate: on an H100 a padded SFT batch of 32 x 2,400 tokens of
    the embedded model peaked at 68.4 GB (the book's appendix "Engineering notes"), where this gives ~95 GB."""
    h, kvd = shape.hidden, shape.kv_heads * shape.head_dim
    layer = 18 * h + 6 * kvd + 8 * shape.intermediate + 2 * h
    kept = shape.layers * 2 * h + layer if gradient_checkpointing else shape.layers * layer
    return float(kept + shape.vocab * 10)


def training_memory(cfg, shape: ModelShape = EMBEDDED_SHAPE, prompt_tokens: int = 64) -> dict:
    """Peak GPU memory (GB, 10^9 bytes) of one training micro-batch of ``cfg`` (a dsh TrainConfig) at
    its longest sequences: ``max_length`` tokens a row for SFT, ``prompt_tokens + max_completion_length``
    for GRPO, which also holds the reference model and the rollout engine's KV cache (one slot per
    completion of a generation batch). Weights, gradients and Adam: 16 bytes a parameter."""
    per_row = (prompt_tokens + cfg.max_completion_length) if cfg.method == "grpo" else cfg.max_length
    if per_row is None:
        raise ValueError("max_length must be set to estimate the memory of an SFT run")
    tokens = cfg.per_device_train_batch_size * per_row
    parts = {"weights, gradients, optimizer": 16 * shape.n_params,
             "activations and logits": tokens * activation_bytes_per_token(shape, cfg.gradient_checkpointing)}
    if cfg.method == "grpo":
        rows = cfg.generation_batch_size or cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
        parts["reference model"] = 2 * shape.n_params
        parts["rollout KV cache"] = rows * per_row * shape.kv_bytes_per_token()
    out = {k: x / 1e9 for k, x in parts.items()}
    out["total"] = sum(out.values())
    out["tokens per micro-batch"] = tokens
    return out


def fit_batch(rows_per_step: int, tokens_per_row: int, fixed_gb: float = 0.0, gpu_gb: float = 80.0,
              headroom: float = 0.9, shape: ModelShape = EMBEDDED_SHAPE,
              gradient_checkpointing: bool = False) -> tuple[int, int]:
    """``(per_device_train_batch_size, gradient_accumulation_steps)`` for ``rows_per_step`` rows of
    ``tokens_per_row`` tokens an optimizer step on one GPU of ``gpu_gb``: the largest power-of-two
    micro-batch (dividing ``rows_per_step``) whose activations fit ``headroom x gpu_gb`` after
    ``fixed_gb`` (weights, optimizer, caches) and ``16 x n_params`` bytes."""
    rows_per_step = v.positive_int("rows_per_step", rows_per_step)
    tokens_per_row = v.positive_int("tokens_per_row", tokens_per_row)
    free = headroom * gpu_gb * 1e9 - fixed_gb * 1e9 - 16 * shape.n_params
    fits = int(free // (tokens_per_row * activation_bytes_per_token(shape, gradient_checkpointing)))
    if fits < 1:
        raise ValueError(f"tokens_per_row={tokens_per_row} does not fit {gpu_gb} GB even one row at a time")
    micro = 1
    while micro * 2 <= min(fits, rows_per_step) and rows_per_step % (micro * 2) == 0:
        micro *= 2
    return micro, rows_per_step // micro


@dataclass(frozen=True)
class GpuBudget:
    """What a preset sizes its batches for on one GPU: the rows an optimizer step sees (the design choice) and the
    memory they must fit; the micro-batch follows (:func:`batch_for`)."""

    gpu_gb: float                   # memory of the GPU (GB, 10^9 bytes)
    sft_rows: int                   # examples per optimizer step
    grpo_rows: int                  # completions per optimizer step
    grpo_generation: int            # completions per rollout batch (the rollout engine's KV cache holds them)
    prompt_tokens: int              # budget for a chat-formatted question


def batch_for(cfg, budget: GpuBudget, shape: ModelShape = EMBEDDED_SHAPE) -> dict:
    """``per_device_train_batch_size`` and ``gradient_accumulation_steps`` of ``cfg`` (a dsh TrainConfig) from the
    memory its sequences need on ``budget``'s GPU (:func:`fit_batch`): SFT rows of ``max_length`` tokens, GRPO rows
    of prompt + completion beside the rollout engine's KV cache and the reference model."""
    if cfg.method == "grpo":
        row = budget.prompt_tokens + cfg.max_completion_length
        gen = cfg.generation_batch_size or budget.grpo_generation
        kv_gb = gen * row * shape.kv_bytes_per_token() / 1e9   # the rollout engine's cache
        micro, accum = fit_batch(budget.grpo_rows, row, fixed_gb=kv_gb + 2 * shape.n_params / 1e9,
                                 gpu_gb=budget.gpu_gb, shape=shape)
    else:
        micro, accum = fit_batch(budget.sft_rows, cfg.max_length, gpu_gb=budget.gpu_gb, shape=shape)
    return dict(per_device_train_batch_size=micro, gradient_accumulation_steps=accum)


def kv_bytes_per_token(model) -> int:
    """Bytes of KV cache one token of context takes in ``model`` (all layers, keys and values, in the model's dtype):
    :meth:`ModelShape.kv_bytes_per_token` of its config."""
    return ModelShape.from_config(model.config, n_params=0).kv_bytes_per_token(next(model.parameters()).element_size())


def fit_slots(model, wanted: int, max_len: int, memory_fraction: float = 0.5) -> int:
    """``wanted`` rows, or fewer on a GPU so that a KV cache of ``max_len`` tokens per row takes at most
    ``memory_fraction`` of the free GPU memory (the rest is for activations and, in GRPO, training)."""
    wanted = v.positive_int("wanted", wanted)
    v.positive_int("max_len", max_len)
    import torch

    p = next(model.parameters())
    if p.device.type != "cuda":
        return wanted
    free, _ = torch.cuda.mem_get_info(p.device)
    return max(1, min(wanted, int(free * memory_fraction // (max_len * kv_bytes_per_token(model)))))
