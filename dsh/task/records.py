"""Training and prompt records for TRL (conversational prompt/completion), chat prompts for generation, and the
question order of evaluation records."""

from __future__ import annotations

from .problems import level_index
from .traces import TraceConfig, make_trace


def sft_records(problems, config: TraceConfig = TraceConfig(), seed: int = 0) -> list[dict]:
    """Conversational prompt/completion records for TRL's SFTTrainer (the trainer applies the
    model's chat template), with the ground truth kept in ``answer``."""
    out = []
    for p in problems:
        t = make_trace(p, config, seed)
        out.append({"prompt": [{"role": "user", "content": p.question}],
                    "completion": [{"role": "assistant", "content": t.text}],
                    "answer": str(p.answer), "level": p.level})
    return out


def prompt_records(problems) -> list[dict]:
    """Prompt-only records (GRPO and evaluation): question, answer and level."""
    return [{"prompt": [{"role": "user", "content": p.question}], "question": p.question,
             "answer": str(p.answer), "level": p.level} for p in problems]


def chat_length(tokenizer, messages) -> int:
    """Tokens of ``messages`` with the chat template applied, as TRL tokenizes an SFT example."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def chat_prompt(tokenizer, question: str) -> str:
    """``question`` formatted with the tokenizer's chat template, ready for generation."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)


def chat_prompts(tokenizer, questions) -> list[str]:
    """:func:`chat_prompt` of each question, the template rendered in one call (the same strings, half the time)."""
    questions = list(questions)
    if not questions:
        return []
    return tokenizer.apply_chat_template([[{"role": "user", "content": q}] for q in questions], tokenize=False,
                                         add_generation_prompt=True)


def by_question(records) -> list[dict]:
    """Evaluation records (``level``, ``index``, ``sample``) in question order: levels along the ladder, then the
    question's index, then the sample (0 where a record names none); the order every statistic reads them in, so
    that a resumed evaluation (records in another order) gives the same numbers. Records without a level and index
    are returned as they are."""
    records = list(records)
    if not all("level" in r and "index" in r for r in records):
        return records
    return sorted(records, key=lambda r: (level_index(r["level"]), r["index"], r.get("sample", 0)))
