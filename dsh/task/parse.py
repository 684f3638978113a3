"""Attempts and decisions in a response (paper, Remark "Operational Identification of Decision Actions").

A *candidate* is an integer a response commits to, in the forms people and models write:

- "the answer is N", "the final answer is N", "Final answer: N", "the product is N", "the result is N"
  (also with "=", "equals"; not "the partial product is N");
- "a * b = N" with the question's own operands in either order and any of ``*``, ``x``, ``×``, ``\\times``,
  ``\\cdot``, ``·`` (also "equals N", "is N"), and "= N" closing a line that restates "a * b";
- ``\\boxed{N}``, ``**N**``, ``$N$``;
- "I get N" closing a sentence or a line.

Numbers may carry thousands separators (``,``, thin spaces, ``_``) and a trailing period. Intermediate results
("running total: N", partial products such as "343 * 2 * 10^1 = 6860", a check's arithmetic, "a * b = N * 10 +
..." where the expression goes on) are not candidates. Candidates with no reflection marker between them restate
one attempt's answer; the attempt's answer is the last of them. After each attempt the decision is RESAMPLE when a
reflection marker follows and a new attempt (another candidate) comes after it, and STOP otherwise. The final
answer is the last candidate.

Reflection markers (``DEFAULT_MARKERS``) are the paper's phrases, common literal ones and a case-insensitive
pattern family (``MARKER_PATTERNS``: "let me re-check / recompute / re-verify / redo ...", "I made a mistake /
an error", "wait", "on second thought", "double-check", "go back and check"). ``markers`` accepts literal
phrases (matched case-insensitively, straight or curly apostrophes) and compiled regular expressions.

:func:`parse_response` never raises on a string and runs in time linear in the response's length.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

LITERAL_MARKERS = (
    # the paper's
    "I'll go back and check", "Let me recompute", "I made a mistake",
    # common ones
    "Let me recheck", "Let me re-check", "Let me double-check", "Let me double check", "Let me check again",
    "Wait", "I made an error", "On second thought", "Let me verify", "Let me try again", "Hmm",
)
MARKER_PATTERNS = (
    r"let\s+me\s+re-?(?:check|compute|calculate|verify|do|examine|evaluate|consider|think)",
    r"i\s+made\s+an?\s+(?:mistake|error|slip)",
    r"(?<![a-z])wait(?![a-z])",
    r"on\s+second\s+thoughts?",
    r"double[- ]?check",
    r"go\s+back\s+and\s+(?:check|verify|recompute)",
)
DEFAULT_MARKERS = LITERAL_MARKERS + tuple(re.compile(p, re.IGNORECASE) for p in MARKER_PATTERNS)

_SEP = "[,\u2009\u202f_]"                     # thousands separators: comma, thin spaces, underscore
_NUM = r"-?\d{1,3}(?:" + _SEP + r"\d{3})+(?!\d)|-?\d+"
_OP = r"(?:\*|×|x|X|·|⋅|\\times|\\cdot)"
# a number that an expression continues (an operator follows) is an intermediate value, not a commitment
_ENDS = r"(?!\d)(?!\.\d)(?! \d{3}(?!\d))(?!\s*(?:" + _OP + r"|[+/^]|-\s*\d))"
_PATTERNS = [
    re.compile(r"(?<![A-Za-z])(?<!partial )(?<!partial\n)(?:final\s+answer|answer|product|result)\s*(?:is|:|=|equals)"
               r"\s*:?\s*(?:\$\s*)?(?:\\boxed\{\s*)?(?:\*\*\s*)?(" + _NUM + r")" + _ENDS, re.IGNORECASE),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    re.compile(r"\*\*\s*(" + _NUM + r")\s*\.?\*\*"),
    re.compile(r"(?<![\w$\\])\$\s*(" + _NUM + r")\s*\$(?![\w$])"),
    # "I get N." closing a sentence or a line (not "I get 6 for the digit sum": an intermediate value goes on)
    re.compile(r"(?<![A-Za-z])I\s+get\s+(" + _NUM + r")(?=\s*(?:[.!](?!\d)|$))", re.IGNORECASE | re.MULTILINE),
]
_LINE_END = re.compile(r"(?:=|equals)\s*\$?\s*(?:\*\*\s*)?(" + _NUM + r")\s*(?:\*\*)?\s*\$?\s*[.!]?\s*$", re.IGNORECASE)


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
        return int(re.sub(_SEP, "", s))
    except (ValueError, AttributeError, TypeError):
        return None


def _pattern_lead(pattern: str) -> str:
    """The letter every match of one of ``MARKER_PATTERNS`` starts with (after its optional look-behind)."""
    body = pattern.removeprefix("(?<![a-z])")
    assert body[0].isalpha() and body[1:2] not in ("?", "*", "{", "|"), pattern
    return body[0]


_PATTERN_LEADS = {p: _pattern_lead(p) for p in MARKER_PATTERNS}


@functools.lru_cache(maxsize=64)
def _marker_regex_cached(markers: tuple) -> re.Pattern | None:
    parts, leads = [], set()
    lits = sorted({m.strip() for m in markers if isinstance(m, str) and m.strip()}, key=len, reverse=True)
    for m in lits:
        e = re.escape(m).replace("'", "['\u2019]")  # straight or curly apostrophe
        parts.append(r"(?<![A-Za-z])" + e + r"(?![A-Za-z])")
        leads |= {m[0], "\u2019"} if m[0] == "'" else {m[0]}
    patterns = [m for m in markers if isinstance(m, re.Pattern)]
    parts += [f"(?:{m.pattern})" for m in patterns]
    if not parts:
        return None
    # where every marker's first character is known (literals; MARKER_PATTERNS, whose text is joined in and read
    # case-insensitively like the rest), a look-ahead on them lets the search skip every other position at once:
    # the same matches, ~15x faster on the committed responses
    if all(m.pattern in _PATTERN_LEADS for m in patterns):
        leads |= {_PATTERN_LEADS[m.pattern] for m in patterns}
        head = "(?=[" + "".join(re.escape(c) for c in sorted(leads)) + "])"
        return re.compile(head + "(?:" + "|".join(parts) + ")", re.IGNORECASE)
    return re.compile("|".join(parts), re.IGNORECASE)


def marker_regex(markers=DEFAULT_MARKERS) -> re.Pattern | None:
    """One case-insensitive expression for ``markers`` (literal phrases and compiled patterns); None if empty."""
    if isinstance(markers, (str, re.Pattern)):
        markers = (markers,)
    try:
        return _marker_regex_cached(tuple(markers or ()))
    except TypeError:  # an unhashable item: not a marker
        return _marker_regex_cached(tuple(m for m in markers if isinstance(m, (str, re.Pattern))))


def _operand(x: int) -> str:
    """``x`` written with or without thousands separators."""
    s = str(abs(x))
    head = len(s) % 3 or 3
    groups = [s[:head]] + [s[i:i + 3] for i in range(head, len(s), 3)]
    return ("-" if x < 0 else "") + (_SEP + "?").join(map(re.escape, groups))


@functools.lru_cache(maxsize=4096)   # one per question: an evaluation holds hundreds (laptop: 700)
def _product_regex(a: int, b: int) -> re.Pattern:
    pair = "|".join(f"{_operand(x)}\\s*{_OP}\\s*{_operand(y)}" for x, y in {(a, b), (b, a)})
    return re.compile(r"(?<![\d,.])(?:" + pair + r")(?![\d])(?!\s*" + _OP + r")")


def find_candidates(text: str, a: int | None = None, b: int | None = None) -> list[tuple[int, int, int]]:
    """Every candidate as (value, start, end) in text order, overlapping matches removed."""
    if not isinstance(text, str):
        return []
    found = []
    for pat in _PATTERNS:
        for m in pat.finditer(text):
            val = _to_int(m.group(1))
            if val is not None:
                found.append((val, m.start(), m.end()))
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        direct = re.compile(r"\s*(?:=|equals|is)\s*\$?\s*(" + _NUM + r")" + _ENDS, re.IGNORECASE)
        for m in _product_regex(a, b).finditer(text):
            d = direct.match(text, m.end())
            if d:
                val = _to_int(d.group(1))
                if val is not None:
                    found.append((val, m.start(), d.end()))
            stop = text.find("\n", m.end())
            stop = len(text) if stop < 0 else stop
            e = _LINE_END.search(text, m.end(), stop)
            if e and (not d or e.start(1) > d.start(1)):
                val = _to_int(e.group(1))
                if val is not None:
                    found.append((val, e.start(), e.end()))
    found.sort(key=lambda t: (t[1], -t[2]))
    out, last_end = [], -1
    for val, s, e in found:
        if s >= last_end:
            out.append((val, s, e))
            last_end = e
    return out


def parse_response(text, a: int | None = None, b: int | None = None, markers=DEFAULT_MARKERS) -> ParsedResponse:
    """Split a response into attempts (answer + STOP/RESAMPLE). ``a``, ``b``: the question's operands,
    which enable the "a * b = N" forms. Never raises on a string."""
    try:
        if not isinstance(text, str):
            return ParsedResponse(())
        return group_attempts(text, find_candidates(text, a, b), markers)
    except Exception:  # pragma: no cover - defensive: the contract is "never raises"
        return ParsedResponse(())


def group_attempts(text: str, cands, markers=DEFAULT_MARKERS) -> ParsedResponse:
    """Attempts from the candidates ``cands`` ((value, start, end), in order) of ``text``: a reflection marker
    between two candidates starts a new attempt (the previous one's decision is RESAMPLE: a marker followed by a
    new attempt, the paper's identification); an attempt's answer is its last candidate; the last decision is STOP."""
    if not cands:
        return ParsedResponse(())
    rx = marker_regex(markers)
    marker_pos = [m.start() for m in rx.finditer(text)] if rx else []
    groups = [[cands[0]]]
    for prev, cur in zip(cands, cands[1:]):
        i = bisect.bisect_left(marker_pos, prev[2])
        if i < len(marker_pos) and marker_pos[i] < cur[1]:
            groups.append([cur])
        else:
            groups[-1].append(cur)
    attempts = []
    for i, g in enumerate(groups):
        val, s, e = g[-1]
        attempts.append(Attempt(val, s, e, "RESAMPLE" if i + 1 < len(groups) else "STOP", g[0][1]))
    return ParsedResponse(tuple(attempts))


_Q = re.compile(r"(" + _NUM + r")\s*(?:" + _OP + r"|times|multiplied\s+by)\s*(" + _NUM + r")", re.IGNORECASE)


def operands(question) -> tuple[int | None, int | None]:
    """The operands of "Calculate a * b. ..." (any of the ``*`` forms; also in words: "a times b", "a multiplied
    by b"); (None, None) if absent."""
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
    rx = marker_regex(markers)
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
