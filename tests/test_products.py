"""The decoding step's products (dsh.llm.products): oneDNN only where its result is torch's bit for bit, so the choice
never changes a sample; the products' log that dsh bench reads."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dsh.llm import products
from dsh.llm.engine import Engine

F = torch.nn.functional


@pytest.mark.parametrize("shape", [(384, 128), (768, 128), (128, 384), (68, 128)])
def test_every_row_count_gives_torchs_product_bit_for_bit(shape):
    """The engine's shapes (the laptop base's fused q/k/v and gate/up, down, LM head) at every row count up to the
    slots: fails if oneDNN were used where it rounds otherwise (on an AMD Zen 4, below 8 rows and at an inner
    dimension of 384)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(*shape, generator=g)
    p = products.Products(48)
    p.prepare(w)
    x = torch.randn(48, shape[1], generator=g)
    for r in range(1, 49):
        assert torch.equal(p.linear(x[:r], w), F.linear(x[:r], w)), r
    assert products.plan(*shape, 48) <= set(range(1, 49))


def test_a_plan_holds_only_row_counts_where_onednn_agrees():
    """plan's rows, checked again here one by one against oneDNN's own product."""
    if not products.onednn_available():
        assert products.plan(384, 128, 64) == frozenset()
        return
    ops = torch.ops.mkldnn
    g = torch.Generator().manual_seed(2)
    w = torch.randn(384, 128, generator=g)
    packed = ops._reorder_linear_weight(w)
    for r in products.plan(384, 128, 64):
        x = torch.randn(r, 128, generator=g)
        assert torch.equal(ops._linear_pointwise(x, packed, None, "none", [], ""), F.linear(x, w))


def test_the_engine_logs_every_product_of_a_step():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=12, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, eos_token_id=11, pad_token_id=0, bos_token_id=1)
    m = LlamaForCausalLM(cfg).eval()
    eng = Engine(m, [11], slots=4, max_len=32, attention="kernels")
    log: list = []
    eng.log_products(log)
    eng.generate([[1, 2, 3]] * 3, 5, temperature=0)
    per_step = 1 + 4 * 2                                      # q/k/v, output, gate/up, down a layer, and the head
    assert log and len(log) % per_step == 0
    macs = [24 * (24 + 2 * 12), 24 * 24, 24 * 80, 40 * 24] * 2 + [24 * 12]   # one step's products, in order
    for i, (rows, flops, secs) in enumerate(log):
        assert rows == 3 and flops == 2 * rows * macs[i % per_step] and secs >= 0
    n = len(log)
    eng.log_products(None)
    eng.generate([[1, 2, 3]], 2, temperature=0)
    assert len(log) == n
    with pytest.raises(ValueError, match="a list or None"):
        eng.log_products(())
    with pytest.raises(ValueError, match="CPU path"):
        Engine(m, [11], slots=4, max_len=32, attention="torch").log_products([])
