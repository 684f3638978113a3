"""Attempts and decisions in a response (paper, Remark "Operational Identification of Decision Actions").

A *candidate* is an integer a response commits to: "the answer is N", "a * b = N" (also "equals N",
"is N"; the question's own operands, in either order), "\\boxed{N}", "**N**"; numbers may carry thousands separators. Candidates
with no reflection marker between them restate one attempt's answer; the attempt's answer is the last
of them. After each attempt the decision is RESAMPLE when a reflection marker follows and a new attempt
(another candidate) comes after it, and STOP otherwise. The final answer is the last candidate.

:func:`parse_response` never raises on a string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MARKERS = (
    # the paper's
    "I'll go back and check", "Let me recompute", "I made a mistake",
    # common ones
    "Let me recheck", "Let me re-check", "Let me double-check", "Let me double check", "Let me check again",
    "Wait", "I made an error", "On second thought", "Let me verify", "Let me try again", "Hmm",
)

_NUM = r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+"
_PATTERNS = [
    re.compile(r"answer\s+is\s*:?\s*\$?\s*(?:\\boxed\{\s*)?(?:\*\*)?\s*(" + _NUM + r")", re.IGNORECASE),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"\*\*\s*(" + _NUM + r")\s*\*\*"),
]


@dataclass(frozen=True)
class Attempt:
    """One attempt: its answer, the character span of its committing candidate, and the decision."""

    answer: int
    start: int
    end: int
    decision: str  # "STOP" or "RESAMPLE"
    first: int = -1  # start of the attempt's first candidate (restatements follow it up to ``start``)


@dataclass(frozen=True)
class ParsedResponse:
    attempts: tuple[Attempt, ...]

    @property
    def candidates(self) -> list[int]:
        return [a.answer for a in self.attempts]

    @property
    def decisions(self) -> list[str]:
        return [a.decision for a in self.attempts]

    @property
    def final_answer(self) -> int | None:
        return self.attempts[-1].answer if self.attempts else None


def _to_int(s: str) -> int | None:
    try:
        return int(s.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def _marker_regex(markers) -> re.Pattern | None:
    ms = [m.strip() for m in markers if isinstance(m, str) and m.strip()]
    if not ms:
        return None
    parts = []
    for m in sorted(ms, key=len, reverse=True):
        e = re.escape(m).replace("'", "['\u2019]")  # straight or curly apostrophe
        parts.append(r"(?<![A-Za-z])" + e + r"(?![A-Za-z])")
    return re.compile("|".join(parts), re.IGNORECASE)


def find_candidates(text: str, a: int | None = None, b: int | None = None) -> list[tuple[int, int, int]]:
    """Every candidate as (value, start, end) in text order, overlapping matches removed."""
    if not isinstance(text, str):
        return []
    found = []
    pats = list(_PATTERNS)
    if isinstance(a, int) and isinstance(b, int):
        ops = {(str(a), str(b)), (str(b), str(a))}
        for x, y in ops:
            pats.append(re.compile(r"(?<![\d,])" + re.escape(x) + r"\s*(?:\*|x|\u00d7|\\times)\s*" + re.escape(y)
                                   + r"\s*(?:=|equals|is)\s*(" + _NUM + r")(?!\d)(?!\.\d)", re.IGNORECASE))
    for pat in pats:
        for m in pat.finditer(text):
            val = _to_int(m.group(1))
            if val is not None:
                found.append((val, m.start(), m.end()))
    found.sort(key=lambda t: (t[1], -t[2]))
    out, last_end = [], -1
    for val, s, e in found:
        if s >= last_end:
            out.append((val, s, e))
            last_end = e
    return out


def parse_response(text, a: int | None = None, b: int | None = None, markers=DEFAULT_MARKERS) -> ParsedResponse:
    """Split a response into attempts (answer + STOP/RESAMPLE). ``a``, ``b``: the question's operands,
    which enable the "a * b = N" pattern. Never raises on a string."""
    try:
        if not isinstance(text, str):
            return ParsedResponse(())
        cands = find_candidates(text, a, b)
        if not cands:
            return ParsedResponse(())
        rx = _marker_regex(markers)
        marker_pos = [m.start() for m in rx.finditer(text)] if rx else []
        # group candidates into attempts: a marker between two candidates starts a new attempt
        groups = [[cands[0]]]
        for prev, cur in zip(cands, cands[1:]):
            if any(prev[2] <= p < cur[1] for p in marker_pos):
                groups.append([cur])
            else:
                groups[-1].append(cur)
        attempts = []
        for i, g in enumerate(groups):
            val, s, e = g[-1]
            attempts.append(Attempt(val, s, e, "RESAMPLE" if i + 1 < len(groups) else "STOP", g[0][1]))
        return ParsedResponse(tuple(attempts))
    except Exception:  # pragma: no cover - defensive: the contract is "never raises"
        return ParsedResponse(())


_Q = re.compile(r"(" + _NUM + r")\s*(?:\*|x|\u00d7|\\times)\s*(" + _NUM + r")")


def operands(question) -> tuple[int | None, int | None]:
    """The operands of "Calculate a * b. ..." (None, None if absent)."""
    if not isinstance(question, str):
        return None, None
    m = _Q.search(question)
    if not m:
        return None, None
    return _to_int(m.group(1)), _to_int(m.group(2))


def truth_value(truth) -> int | None:
    """A ground-truth answer as an integer: an int, or a string of digits with optional sign, thousands
    separators and surrounding blanks; None when it is neither."""
    if isinstance(truth, bool):
        return None
    if isinstance(truth, int):
        return truth
    return _to_int(str(truth).strip())


def is_correct(response_or_answer, truth, question=None) -> bool:
    """The paper's reward ``R(tau) = 1[final answer correct]``: ``response_or_answer`` is a response (its final
    answer is found by :func:`parse_response`, with the operands of ``question`` when given) or an answer
    (an int); ``truth`` as :func:`truth_value` reads it. Never raises: anything unreadable is not correct."""
    want = truth_value(truth)
    if want is None:
        return False
    if isinstance(response_or_answer, int) and not isinstance(response_or_answer, bool):
        return response_or_answer == want
    a, b = operands(question)
    return parse_response(response_or_answer, a, b).final_answer == want


def decision_spans(text, a: int | None = None, b: int | None = None, markers=DEFAULT_MARKERS) -> list[tuple[int, int]]:
    """Character spans of the RESAMPLE decisions: for every attempt followed by another one, the text from
    the first reflection marker after its answer to the end of the line (or sentence) of the last marker
    before the next attempt. (A STOP decision is the end-of-turn token, outside the text.)"""
    parsed = parse_response(text, a, b, markers)
    rx = _marker_regex(markers)
    if rx is None or not isinstance(text, str):
        return []
    spans = []
    for att, nxt in zip(parsed.attempts, parsed.attempts[1:]):
        found = list(rx.finditer(text, att.end, nxt.start))
        if found:
            # from the first marker to the end of the line (or sentence) of the last one
            end = found[-1].end()
            stop = [i for i in (text.find("\n", end, nxt.start), text.find(". ", end, nxt.start)) if i >= 0]
            end = min(stop) + 1 if stop else end
            spans.append((found[0].start(), min(end, nxt.start)))
    return spans
