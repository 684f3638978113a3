"""A tiny model as a real Hugging Face model: a randomly initialised transformers ``LlamaForCausalLM`` and a
``PreTrainedTokenizerFast`` built with the ``tokenizers`` library for the task's alphabet.

The tokenizer has one token per character of the alphabet plus the traces' fixed phrases
(:data:`dsh.task.laptop_task.PHRASES`) as single tokens, ``<pad>``, ``<eos>`` (the only end of turn) and ``<unk>``,
left padding, and a one-line chat template (the user's text and a newline), so that every dsh command that
formats a question with the chat template (evaluate, GRPO rollouts, SFT records) works on the saved folder
like on any other model. Decoding round-trips the traces exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..core import validate as v
from ..core.files import readable
from ..task.laptop_task import PHRASES

ALPHABET = "0123456789+-*=:,.!>? \n" + "abcdefghijklmnopqrstuvwxyz" + "ACTL'"
SPECIAL = ("<pad>", "<eos>", "<unk>")
# the user's text and a newline; an assistant turn ends with <eos> (so TRL's conversational records teach the
# model to stop); the generation prompt adds nothing
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ '<eos>' }}"
                 "{% else %}{{ '\\n' }}{% endif %}{% endfor %}")


def build_tokenizer():
    """The tiny tokenizer as a ``PreTrainedTokenizerFast`` (see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + tuple(ALPHABET))}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_tokens(list(PHRASES))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   bos_token="<eos>", padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass(frozen=True)
class TinyConfig:
    """The tiny model's shape (a ``LlamaConfig``)."""

    d_model: int = field(default=128, metadata={"help": "hidden size"})
    layers: int = field(default=4, metadata={"help": "transformer blocks"})
    heads: int = field(default=4, metadata={"help": "attention heads (d_model divisible by heads)"})
    ffn: int = field(default=384, metadata={"help": "MLP width"})
    max_positions: int = field(default=1024, metadata={"help": "longest sequence (prompt and completion)"})

    def __post_init__(self):
        for k in ("d_model", "layers", "heads", "ffn", "max_positions"):
            v.positive_int(k, getattr(self, k))
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise ValueError(f"heads must divide d_model into an even head size; got d_model={self.d_model}, "
                             f"heads={self.heads}")


def make_model(tok, config: TinyConfig = TinyConfig(), seed: int = 0):
    """A randomly initialised ``LlamaForCausalLM`` of ``config``'s shape for tokenizer ``tok`` (seeded)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=config.d_model, intermediate_size=config.ffn,
                      num_hidden_layers=config.layers, num_attention_heads=config.heads,
                      num_key_value_heads=config.heads, max_position_embeddings=config.max_positions,
                      tie_word_embeddings=True, rope_theta=10000.0, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id]
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model, tok, folder, provenance: dict) -> Path:
    """Save model (safetensors), tokenizer and ``dsh_provenance.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    (folder / "dsh_provenance.json").write_text(json.dumps(provenance, indent=1, default=str) + "\n")
    return readable(folder)
