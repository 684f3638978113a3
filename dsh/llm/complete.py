"""Completions of questions through :class:`dsh.llm.engine.Engine`: the one sampling path of the package for
evaluation (``dsh evaluate``'s ``dsh`` backend), the model's own attempts in reflection traces, the laptop base's
reports and ``dsh bench``.

Each question is chat-formatted (:func:`dsh.task.records.chat_prompt`) and gets its own random stream (its key: by
default its index in the list), so a completion does not depend on the batch it ran in.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import validate as v
from ..task.records import chat_prompt


@dataclass(frozen=True)
class Completion:
    """One completion: its text (special tokens dropped), whether it stopped on an end-of-sequence token (else it
    reached the token limit), and its prompt and completion lengths in tokens."""

    text: str
    stopped: bool
    prompt_tokens: int
    completion_tokens: int


def complete(model, tok, questions, max_new_tokens: int, temperature: float = 1.0, seed: int = 0, rows: int = 64,
             keys=None, on_finish=None, progress: bool = False) -> list[Completion]:
    """:class:`Completion` of each question string (in order): at most ``max_new_tokens`` new tokens, sampled at
    ``temperature`` (0: greedy) with the counted streams of ``seed`` and ``keys`` (one int per question; default
    the index), ``rows`` rows decoded at once (capped by what the KV cache can hold on a GPU).
    ``on_finish(i, completion)`` is called as question ``i`` finishes (e.g. to write it at once)."""
    from .engine import Engine, fit_slots

    questions = list(questions)
    v.positive_int("max_new_tokens", max_new_tokens)
    v.positive_int("rows", rows)
    if v.real("temperature", temperature) < 0:
        raise ValueError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    if keys is not None and len(keys) != len(questions):
        raise ValueError(f"keys must give one stream key per question ({len(questions)}); got {len(keys)}")
    if not questions:
        return []
    prompts = [tok(chat_prompt(tok, q), add_special_tokens=False)["input_ids"] for q in questions]
    max_len = max(map(len, prompts)) + max_new_tokens
    eos = model.generation_config.eos_token_id
    eos = [tok.eos_token_id] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    engine = Engine(model, eos, slots=fit_slots(model, min(rows, len(prompts)), max_len), max_len=max_len)
    out: list = [None] * len(prompts)

    def finished(i, g):
        out[i] = Completion(tok.decode(g.text_tokens, skip_special_tokens=True), bool(g.stopped), len(prompts[i]),
                            len(g.text_tokens))
        if on_finish is not None:
            on_finish(i, out[i])

    engine.generate(prompts, max_new_tokens, temperature=temperature, seed=seed, progress=progress,
                    callback=finished, keys=None if keys is None else list(keys))
    return out
