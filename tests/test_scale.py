"""Memory arithmetic behind the gpu-small batch sizes (no GPU needed)."""

import pytest
from transformers import AutoConfig

from dsh.experiment.run import presets
from dsh.llm import models, scale
from dsh.training import train_config


def test_embedded_shape_is_the_models_config():
    cfg = AutoConfig.from_pretrained(models.resolve_model("embedded"))
    assert scale.ModelShape.from_config(cfg) == scale.EMBEDDED_SHAPE
    m, _ = models.load("embedded")
    assert sum(p.numel() for p in m.parameters()) == scale.EMBEDDED_SHAPE.n_params
    assert scale.EMBEDDED_SHAPE.kv_bytes_per_token() == 30 * 2 * 3 * 64 * 2   # ~23 KB in bf16


@pytest.mark.parametrize("method", train_config.METHODS)
def test_every_gpu_small_preset_fits_80_gb_at_its_longest_sequences(method):
    cfg = presets.resolve(method, "gpu-small", output_dir="/tmp/never-written")
    mem = scale.training_memory(cfg)
    assert mem["total"] <= 0.9 * presets.GPU_MEMORY.gpu_gb, mem
    # and the micro-batch is the largest power of two that does: twice as many rows would not fit
    bigger = presets.resolve(method, "gpu-small", output_dir="/tmp/never-written",
                             per_device_train_batch_size=2 * cfg.per_device_train_batch_size)
    rows = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    assert scale.training_memory(bigger)["total"] > 0.9 * presets.GPU_MEMORY.gpu_gb or \
        2 * cfg.per_device_train_batch_size > rows
    assert rows == (presets.GPU_MEMORY.grpo_rows if method == "grpo" else presets.GPU_MEMORY.sft_rows)


def test_the_old_grpo_preset_is_flagged():
    """The configuration that ran out of memory on an H100 (64 completions of 1,600 tokens at once)."""
    old = presets.resolve("grpo", "gpu-small", output_dir="/tmp/never-written", per_device_train_batch_size=64,
                          gradient_accumulation_steps=1)
    assert scale.training_memory(old)["total"] > presets.GPU_MEMORY.gpu_gb


def test_fit_batch_arithmetic():
    per_token = scale.activation_bytes_per_token(scale.EMBEDDED_SHAPE)
    micro, accum = scale.fit_batch(32, 2400, gpu_gb=80)
    assert micro * accum == 32
    assert micro * 2400 * per_token + 16 * scale.EMBEDDED_SHAPE.n_params <= 0.9 * 80e9
    assert 2 * micro * 2400 * per_token + 16 * scale.EMBEDDED_SHAPE.n_params > 0.9 * 80e9
    assert scale.fit_batch(32, 100, gpu_gb=80) == (32, 1)
    with pytest.raises(ValueError, match="does not fit"):
        scale.fit_batch(8, 10 ** 7, gpu_gb=1)
    with pytest.raises(ValueError, match="^rows_per_step must be an integer >= 1"):
        scale.fit_batch(0, 100)
