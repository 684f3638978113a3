"""A held-out evaluation set for dsh.task.parse, written by a generator that shares nothing with dsh.task.traces: its own
problems, its own arithmetic layout (partial products "a * d * 10^k = v" and "running total: N" lines), its own
reflection phrasings and answer forms. Each response follows a known two-stage process (p_s, p_dC, p_dW), so the
attempts' correctness and STOP / RESAMPLE decisions are labels by construction.

    python tests/heldout/generate.py        # rewrites tests/heldout/parser_heldout.jsonl (deterministic)

Several marker phrasings are in none of dsh.task.parse's literal lists (they must be caught by its pattern family or
not at all), and the answer forms are not the ones dsh.task.traces writes ("So a * b = N.", "The answer is N.").
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("parser_heldout.jsonl")
P_S, P_DC, P_DW = 0.5, 0.6, 0.6
N_RESPONSES = 400
MAX_ATTEMPTS = 4

MARKERS = [
    "Hold on, I made an error in one of the partial products.",
    "Let me redo this more carefully.",
    "Wait a moment, that doesn't look right.",
    "On second thought, I should verify this.",
    "Let me double-check the carries.",
    "Let me re-verify the additions.",
    "Actually, I made a mistake above.",
    "Hmm, let me reconsider.",
    "Let me recalculate that product from the start.",
    "Something is off; let me go back and verify.",
]
# (format, how the number is written)
ANSWERS = [
    "Therefore, the product is {n_comma}.",
    "Final answer: \\boxed{{{n}}}",
    "So the result is **{n}**.",
    "{a} \u00d7 {b} = {n_thin}",
    "$${a} \\times {b} = {n}$$",
    "The final answer is ${n}$.",
    "{b} \\cdot {a} = {n_under}",
    "Thus {a} x {b} equals {n}.",
]
CLOSINGS = ["", "", "I am confident in this result.", "That completes the multiplication."]


def _written(n: int) -> dict:
    comma = f"{n:,}"
    return {"n": str(n), "n_comma": comma, "n_thin": comma.replace(",", "\u2009"), "n_under": comma.replace(",", "_")}


def _attempt_body(a: int, b: int, rng: random.Random, wrong: bool) -> tuple[str, int]:
    """Partial products of a by the digits of b and running totals; a wrong attempt slips in one partial product."""
    digits = [int(c) for c in str(b)[::-1]]
    slip = rng.randrange(len(digits)) if wrong else -1
    lines, total = [], 0
    for k, d in enumerate(digits):
        v = a * d * 10 ** k
        if k == slip:
            v += rng.choice([-1, 1]) * rng.randint(1, 9) * 10 ** (k + rng.randint(0, 1))
            if v < 0:
                v = a * d * 10 ** k + 10 ** k
        lines.append(f"{a} * {d} * 10^{k} = {v}")
        total += v
        lines.append(f"running total: {total}")
    if wrong and total == a * b:           # a slip that cancels out: force a wrong total
        total += 10
        lines[-1] = f"running total: {total}"
    return "\n".join(lines), total


def response(a: int, b: int, rng: random.Random) -> tuple[str, list[bool], list[str]]:
    """One response from the two-stage process and its labels (correct, decision) per attempt."""
    blocks, correct, decisions = [], [], []
    for k in range(MAX_ATTEMPTS):
        ok = rng.random() < P_S
        body, value = _attempt_body(a, b, rng, wrong=not ok)
        form = rng.choice(ANSWERS)
        blocks.append(body + "\n" + form.format(a=a, b=b, **_written(value)))
        correct.append(ok)
        last = k == MAX_ATTEMPTS - 1
        resample = not last and (rng.random() >= P_DC if ok else rng.random() < P_DW)
        decisions.append("RESAMPLE" if resample else "STOP")
        if not resample:
            break
        blocks.append(rng.choice(MARKERS))
    closing = rng.choice(CLOSINGS)
    return "\n".join(blocks + ([closing] if closing else [])), correct, decisions


def generate(n: int = N_RESPONSES, seed: int = 20261123) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = rng.randint(10 ** (rng.randint(2, 3) - 1), 10 ** 3 - 1)
        b = rng.randint(10 ** (rng.randint(3, 6) - 1), 10 ** 6 - 1)
        text, correct, decisions = response(a, b, rng)
        out.append({"question": f"Calculate {a} * {b}. Think step by step.", "answer": a * b, "response": text,
                    "level": f"{len(str(a))}x{len(str(b))}", "truncated": False,
                    "label_correct": correct, "label_decisions": decisions})
    return out


if __name__ == "__main__":
    OUT.write_text("".join(json.dumps(r) + "\n" for r in generate()))
    print(OUT)
