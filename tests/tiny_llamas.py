"""A tiny llama for the engine's tests: 2 layers, 4 query heads over 2 key/value heads of size 6 (not a multiple of
the 16-wide tiles), 12 tokens, end token 11."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def gqa_llama(head_scale: float | None = None) -> LlamaForCausalLM:
    """The model from seed 0, in eval mode; ``head_scale`` multiplies the LM head (peaked logits)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=12, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, eos_token_id=11, pad_token_id=0, bos_token_id=1)
    m = LlamaForCausalLM(cfg).eval()
    if head_scale is not None:
        with torch.no_grad():
            m.lm_head.weight.mul_(head_scale)
    return m


def gqa_llama_own_norms() -> LlamaForCausalLM:
    """:func:`gqa_llama` with peaked logits (head scale 8) and every RMS norm its own epsilon, large enough to matter
    (a C step that mixed up two norms' epsilons would show)."""
    m = gqa_llama(head_scale=8.0)
    for i, layer in enumerate(m.model.layers):
        layer.input_layernorm.variance_epsilon = 0.05 * (i + 1)
        layer.post_attention_layernorm.variance_epsilon = 0.3 * (i + 1)
    m.model.norm.variance_epsilon = 0.7
    return m
