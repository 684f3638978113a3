"""Padding-free SFT (dsh.llm.packing): a packed batch gives the loss and gradients of the padded batch."""

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from dsh.llm import models, packing

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)


@pytest.fixture(scope="module")
def batches():
    model, tok = models.load("embedded")
    examples = [{"input_ids": tok("What is 12 * 34? " * k + "Let me check.")["input_ids"]} for k in (1, 4, 2)]
    padded = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(examples)
    packed = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, padding_free=True)(examples)
    assert packed["input_ids"].shape[0] == 1 and packed["input_ids"].shape[1] < padded["input_ids"].numel()
    return model, padded, packed


def _loss_and_grad(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    g = model.model.layers[3].self_attn.q_proj.weight.grad.clone()
    model.zero_grad()
    return loss.item(), g


@pytest.mark.parametrize("path", sorted(packing.PATHS))
def test_packed_loss_equals_padded_loss(batches, path):
    """Fails if attention crossed from one packed example into the next or RoPE positions did not restart (both
    packed paths: per-example torch calls and the C kernels; the embedded model: head size 64, grouped KV heads)."""
    model, padded, packed = batches
    ref_loss, ref_grad = _loss_and_grad(model, padded)
    model.set_attn_implementation(packing.register(path))
    try:
        loss, grad = _loss_and_grad(model, packed)
        # the same packed row without its boundaries: attention crosses examples, the loss changes
        crossing = {k: packed[k] for k in ("input_ids", "labels")}
        wrong, _ = _loss_and_grad(model, crossing)
        # a padded batch (no boundaries) still works under the same attention implementation
        again, _ = _loss_and_grad(model, padded)
    finally:
        model.set_attn_implementation("sdpa")
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-5, rtol=1e-4)
    assert abs(wrong - ref_loss) > 1e-2
    assert again == pytest.approx(ref_loss, abs=1e-5)


@pytest.mark.parametrize("path", sorted(packing.PATHS))
def test_boundaries_from_position_ids_alone(batches, path):
    model, padded, packed = batches
    ref_loss, _ = _loss_and_grad(model, padded)
    model.set_attn_implementation(packing.register(path))
    try:
        loss, _ = _loss_and_grad(model, {k: packed[k] for k in ("input_ids", "labels", "position_ids")})
    finally:
        model.set_attn_implementation("sdpa")
    assert loss == pytest.approx(ref_loss, abs=1e-5)
