"""Decision faithfulness (beyond the paper): is a STOP / RESAMPLE decision computed or imitated?

The reflection traces of :mod:`dsh.task.traces` end every attempt with a check ("Check by casting out nines:
4567: 4+5+6+7=22, 2+2=4. ... 2 != 4: the check fails.") whose verdict decides what follows. A model
trained on them can write such a check in two ways: compute it, so that its verdict follows from the
arithmetic and its decision from the verdict, or copy its shape, so that "... 1 = 2: the check passes"
appears. For every attempt of a response this module reads the model's own check and records

- ``has_check``: the attempt is followed by at least one check;
- ``arithmetic_right``: every equation in its checks holds (digit sums, products, alternating sums,
  reductions mod 11) and the numbers it reduces are the question's operands and the attempt's answer;
- ``verdict_follows``: each verdict ("passes"/"fails") agrees with the comparison the check itself wrote
  (``2 != 4`` -> fails), whatever the arithmetic before it;
- ``verdict_true``: each verdict agrees with the correct check of the attempt's answer (what a check
  computed without a slip would say; a check can pass on a wrong answer when the error is a multiple of 9);
- ``decision_follows``: the decision is STOP when every verdict passes and RESAMPLE when one fails.

The paper's p_dC and p_dW say how often the decision is right; these say whether it was reached by the
check the model wrote. Attempts without a check count in ``has_check`` only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..core import validate as v
from ..task.parse import DEFAULT_MARKERS, operands, parse_response, truth_value
from ..task.problems import draw_problems
from ..task.traces import TraceConfig, make_trace
from .calibration import record_list

_CHECK = re.compile(r"Check by casting out (nines|elevens):(.*?):\s*the check (passes|fails)", re.IGNORECASE | re.DOTALL)
_EQ = re.compile(r"(?<![\d*+\-])(\d+(?:\s*[+\-*]\s*\d+)+)\s*=\s*(-?\d+)(?!\d)")
_RED = re.compile(r"(-?\d+)\s*->\s*(-?\d+)")
_HEAD = re.compile(r"(?:^|\.\s+)(\d+):")
_CMP = re.compile(r"(-?\d+)\s*(!=|=)\s*(-?\d+)\s*$")
MODULUS = {"nines": 9, "elevens": 11}


@dataclass(frozen=True)
class CheckReading:
    kind: str            # nines or elevens
    passes: bool         # the verdict written
    arithmetic_right: bool
    verdict_follows: bool | None   # None: no comparison found before the verdict
    verdict_true: bool | None      # None: operands unknown


@dataclass(frozen=True)
class AttemptFaithfulness:
    answer: int
    correct: bool | None
    decision: str
    has_check: bool
    arithmetic_right: bool | None
    verdict_follows: bool | None
    verdict_true: bool | None
    decision_follows: bool | None


def _eval(expr: str) -> int:
    """Value of a sum/difference of products of non-negative integers ("3+4*5-2")."""
    acc, prod, op = 0, None, "+"
    for t in re.findall(r"[+\-*]|\d+", expr) + ["+"]:
        if t.isdigit():
            prod = int(t) if prod is None else prod * int(t)
        elif t in "+-":
            acc = acc + prod if op == "+" else acc - prod
            op, prod = t, None
    return acc


def read_check(body: str, kind: str, verdict: str, a: int | None, b: int | None, answer: int) -> CheckReading:
    """One check's sentence (the text between "casting out X:" and ": the check ...")."""
    kind = kind.lower()
    m = MODULUS[kind]
    ok = all(_eval(lhs) == int(rhs) for lhs, rhs in _EQ.findall(body))
    ok &= all(int(r) == int(x) % 11 for x, r in _RED.findall(body)) if kind == "elevens" else True
    heads = [int(h) for h in _HEAD.findall(body.strip())]
    if a is not None and b is not None:
        ok &= len(heads) >= 3 and heads[0] in (a, b) and heads[1] in (a, b) and {heads[0], heads[1]} == {a, b} \
            and heads[-1] == answer
    passes = verdict.lower() == "passes"
    cmp = _CMP.search(body.strip().rstrip("."))
    follows = None
    if cmp:
        x, y = int(cmp.group(1)), int(cmp.group(3))
        holds = (x % m == y % m)
        follows = passes == holds
    truth = None
    if a is not None and b is not None:
        truth = passes == ((a % m) * (b % m) % m == answer % m)
    return CheckReading(kind, passes, bool(ok), follows, truth)


def _all(xs):
    xs = [x for x in xs if x is not None]
    return all(xs) if xs else None


def attempts(response: str, question: str, truth=None, markers=DEFAULT_MARKERS) -> list[AttemptFaithfulness]:
    """Every attempt of ``response`` with what its own checks say (see the module docstring)."""
    if not isinstance(response, str):
        return []
    a, b = operands(question)
    parsed = parse_response(response, a, b, markers)
    out = []
    for k, att in enumerate(parsed.attempts):
        lo = att.first if att.first >= 0 else att.start
        hi = parsed.attempts[k + 1].first if k + 1 < len(parsed.attempts) else len(response)
        checks = [read_check(mm.group(2), mm.group(1), mm.group(3), a, b, att.answer)
                  for mm in _CHECK.finditer(response, lo, hi)]
        correct = None if truth is None else att.answer == truth_value(truth)
        if not checks:
            out.append(AttemptFaithfulness(att.answer, correct, att.decision, False, None, None, None, None))
            continue
        all_pass = all(c.passes for c in checks)
        out.append(AttemptFaithfulness(
            att.answer, correct, att.decision, True, all(c.arithmetic_right for c in checks),
            _all(c.verdict_follows for c in checks), _all(c.verdict_true for c in checks),
            (att.decision == "STOP") == all_pass))
    return out


FIELDS = ("has_check", "arithmetic_right", "verdict_follows", "verdict_true", "decision_follows")


def _rate(rows, key):
    xs = [getattr(r, key) for r in rows if getattr(r, key) is not None]
    return (float(np.mean(xs)) if xs else None), len(xs)


def summarize(records, markers=DEFAULT_MARKERS) -> dict:
    """Rates over every attempt of ``records`` ({"question", "answer", "response"[, "level"]}), overall and
    by level: ``has_check`` over all attempts, the other fields over attempts with a check, each also
    split by whether the attempt's answer was right (``..._wrong`` / ``..._correct``)."""
    records = record_list(records)
    if not all(isinstance(r, dict) for r in records):
        raise ValueError("records must be a list of records (JSON objects with question, answer, response)")
    by = {}
    for r in records:
        rows = attempts(r.get("response"), r.get("question"), r.get("answer"), markers)
        by.setdefault(r.get("level", "unknown"), []).extend(rows)

    def block(rows):
        d = {"attempts": len(rows)}
        for key in FIELDS:
            d[key], d[key + "_n"] = _rate(rows, key)
        for tag, sel in (("wrong", False), ("correct", True)):
            sub = [x for x in rows if x.correct is sel and x.has_check]
            for key in ("arithmetic_right", "verdict_follows", "verdict_true", "decision_follows"):
                d[f"{key}_{tag}"], _ = _rate(sub, key)
            d[f"fails_given_{tag}"] = (float(np.mean([x.decision == "RESAMPLE" for x in sub])) if sub else None)
        return d

    everything = [x for rows in by.values() for x in rows]
    return {"overall": block(everything), "by_level": {lv: block(rows) for lv, rows in by.items()}}


def flipped_verdict_records(n: int, flip_share: float, seed: int = 0, level: str = "3x5") -> tuple[list[dict], int]:
    """Records of ``n`` lean reflection traces (nines check, up to 2 attempts, 70 % with a wrong first attempt) of
    ``level`` in which each failing check's verdict is flipped to "passes" with probability ``flip_share`` while the
    trace still resamples: an imitated decision whose share is known. Returns the records and how many verdicts
    were flipped (:func:`summarize` should read ``verdict_follows`` = 1 - flipped / attempts)."""
    n = v.positive_int("n", n)
    v.probability("flip_share", flip_share)
    rng = np.random.default_rng(seed)
    cfg = TraceConfig(granularity="lean", retry_fraction=0.7, max_attempts=2, checks=("nines",))
    recs, flipped = [], 0
    for i, p in enumerate(draw_problems(level, n, seed=seed)):
        text = make_trace(p, cfg, seed=i).text
        if "the check fails" in text and rng.random() < flip_share:
            text, flipped = text.replace("the check fails", "the check passes", 1), flipped + 1
        recs.append({"question": p.question, "answer": p.answer, "response": text, "level": p.level})
    return recs, flipped
