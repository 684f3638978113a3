"""SFT traces: a problem written out as one or more attempts (paper, Appendix "Dataset Construction").

Traces come in three arithmetic granularities:

- ``compact``: one partial product or running sum per line (for capable models such as Qwen2.5-7B);
- ``digit``: one single-digit product or sum with its write/carry per step, the format a 135M model can
  learn (the book's appendix "Engineering notes");
- ``lean``: digit-level with fewer tokens: a step is written without its write/carry (``6*8+4=52``: the
  written digit is the last digit of the value, the carry is the ``+4`` of the next step), and the
  shorter operand is the multiplier (3 partial products and 2 additions for 3 x 9, instead of 9 and 8),
  which makes a 3x9 trace about half as long as ``digit``'s. The ``gpu-small`` preset uses it.

and two styles:

- ``no_reflection``: one correct long multiplication ending in "The answer is N.";
- ``reflection``: one or more attempts; earlier attempts carry a realistic injected error
  (:mod:`dsh.task.arithmetic`), every attempt ends with "So a * b = N." and a genuine check (casting out nines and
  elevens, computed in the trace), and the check's outcome decides what follows: a reflection marker and a new
  attempt when it fails, the final answer when it passes. Only errors that the checks detect are drawn, so
  every trace ends correct.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..core import validate as v
from . import parse
from .arithmetic import (
    CHECKS,
    ERROR_TYPES,
    Attempt,
    DigitStep,
    draw_error,
    long_multiplication,
    multiplicand_multiplier,
)
from .problems import Problem

GRANULARITIES = ("compact", "digit", "lean")
STYLES = ("no_reflection", "reflection")
# markers written by the generator when a check fails (all are recognized by dsh.task.parse)
GENERATOR_MARKERS = ("I made a mistake. Let me recompute.", "I'll go back and check.",
                     "Let me recompute.", "Wait, I made an error. Let me recheck.")


def _fmt_mul_step(s: DigitStep) -> str:
    return f"{s.x}*{s.y}" + (f"+{s.carry_in}" if s.carry_in else "") + f"={s.value} w{s.write} c{s.carry_out}"


def _fmt_add_step(s: DigitStep) -> str:
    return f"{s.x}+{s.y}" + (f"+{s.carry_in}" if s.carry_in else "") + f"={s.value} w{s.write} c{s.carry_out}"


def _lean_step(s: DigitStep, op: str) -> str:
    return f"{s.x}{op}{s.y}" + (f"+{s.carry_in}" if s.carry_in else "") + f"={s.value}"


def render_attempt(a: int, b: int, att: Attempt, granularity: str) -> str:
    """The arithmetic of one attempt (``a`` times the digits of ``b``), without its final sentence."""
    lines = []
    if granularity == "lean":
        for p in att.partials:
            line = f"{a}*{p.digit}: " + ", ".join(_lean_step(s, "*") for s in p.steps) + f" -> {p.value}"
            if p.shift:
                line += f" shift {p.shift} -> {p.shifted}"
            lines.append(line)
        for ad in att.additions:
            lines.append(f"{ad.left}+{ad.right}: " + ", ".join(_lean_step(s, "+") for s in ad.steps) + f" -> {ad.result}")
    elif granularity == "digit":
        for p in att.partials:
            line = f"{a}*{p.digit}: " + ", ".join(_fmt_mul_step(s) for s in p.steps) + f" -> {p.value}"
            if p.shift:
                line += f" shift {p.shift} -> {p.shifted}"
            lines.append(line)
        for ad in att.additions:
            lines.append(f"{ad.left}+{ad.right}: " + ", ".join(_fmt_add_step(s) for s in ad.steps) + f" -> {ad.result}")
    else:
        for p in att.partials:
            lines.append(f"{a} * {p.digit} = {p.value}, shifted {p.shift}: {p.shifted}")
        acc = att.partials[0].shifted
        lines.append(f"sum after 1: {acc}")
        for k, ad in enumerate(att.additions, start=2):
            lines.append(f"sum after {k}: {ad.result}")
    return "\n".join(lines)


def _digit_sum_chain(n: int) -> tuple[str, int]:
    """"7563: 7+5+6+3=21, 2+1=3" and the final single digit (n mod 9, with 9 for multiples of 9)."""
    parts, x = [], n
    while x >= 10:
        ds = [int(c) for c in str(x)]
        parts.append("+".join(map(str, ds)) + f"={sum(ds)}")
        x = sum(ds)
    return (f"{n}: " + ", ".join(parts) if parts else f"{n}: {n}"), x


def _alt_sum_chain(n: int) -> tuple[str, int]:
    """Casting out elevens: the alternating digit sum from the units, reduced mod 11."""
    ds = [int(c) for c in str(n)[::-1]]
    expr = "".join((("+" if i % 2 == 0 else "-") if i else "") + str(d) for i, d in enumerate(ds))
    s = sum(d if i % 2 == 0 else -d for i, d in enumerate(ds))
    return f"{n}: {expr}={s} -> {s % 11}", s % 11


def render_check(a: int, b: int, candidate: int, checks=CHECKS) -> tuple[str, bool]:
    """A genuine check of ``a * b = candidate``: returns its text and whether it passes."""
    lines, ok = [], True
    if "nines" in checks:
        ta, ra = _digit_sum_chain(a)
        tb, rb = _digit_sum_chain(b)
        tp, rp = _digit_sum_chain(ra * rb)
        tc, rc = _digit_sum_chain(candidate)
        passed = rp % 9 == rc % 9
        ok &= passed
        lines.append(f"Check by casting out nines: {ta}. {tb}. {ra}*{rb}={ra * rb}, {tp.split(': ', 1)[1]}. {tc}. "
                     f"{rp} {'=' if rp == rc or rp % 9 == rc % 9 else '!='} {rc}: the check "
                     f"{'passes' if passed else 'fails'}.")
    if "elevens" in checks:
        ta, ra = _alt_sum_chain(a)
        tb, rb = _alt_sum_chain(b)
        tc, rc = _alt_sum_chain(candidate)
        rp = (ra * rb) % 11
        passed = rp == rc
        ok &= passed
        lines.append(f"Check by casting out elevens: {ta}. {tb}. {ra}*{rb}={ra * rb} -> {rp}. {tc}. "
                     f"{rp} {'=' if passed else '!='} {rc}: the check {'passes' if passed else 'fails'}.")
    return "\n".join(lines), ok


@dataclass(frozen=True)
class TraceConfig:
    """How traces are written. ``retry_fraction``: share of reflection traces with at least one
    wrong attempt; ``extra_error_rate``: probability of each further wrong attempt (up to
    ``max_attempts - 1`` wrong attempts); ``error_weights``: relative rates of the error types."""

    granularity: str = "digit"
    style: str = "reflection"
    retry_fraction: float = 0.5
    extra_error_rate: float = 0.3
    max_attempts: int = 3
    error_weights: dict = field(default_factory=lambda: {"digit": 1.0, "carry": 1.0, "shift": 1.0})
    checks: tuple = CHECKS
    markers: tuple = GENERATOR_MARKERS

    def __post_init__(self):
        v.choice("granularity", self.granularity, GRANULARITIES)
        v.choice("style", self.style, STYLES)
        v.probability("retry_fraction", self.retry_fraction)
        v.probability("extra_error_rate", self.extra_error_rate)
        v.positive_int("max_attempts", self.max_attempts)
        if not isinstance(self.error_weights, dict) or set(self.error_weights) - set(ERROR_TYPES) or \
                any((not isinstance(w, (int, float))) or w < 0 for w in self.error_weights.values()) or \
                not any(w > 0 for w in self.error_weights.values()):
            raise ValueError(f"error_weights must be a mapping of some of {', '.join(ERROR_TYPES)} to non-negative rates, "
                             f"one positive; got {self.error_weights!r}")
        if not self.checks or set(self.checks) - set(CHECKS):
            raise ValueError(f"checks must be a non-empty subset of {', '.join(CHECKS)}; got {self.checks!r}")
        if not self.markers or not all(isinstance(m, str) and m.strip() for m in self.markers):
            raise ValueError(f"markers must be a non-empty list of non-empty strings; got {self.markers!r}")


@dataclass(frozen=True)
class Trace:
    """A trace and its ground-truth structure (for round-trip tests)."""

    text: str
    attempt_answers: tuple[int, ...]
    decisions: tuple[str, ...]       # "RESAMPLE" / "STOP", one per attempt
    errors: tuple


def make_trace(problem: Problem, config: TraceConfig = TraceConfig(), seed: int = 0) -> Trace:
    """One SFT trace for ``problem`` (deterministic under ``seed``)."""
    if not isinstance(problem, Problem):
        raise ValueError(f"problem must be a dsh.task.problems.Problem, got {type(problem).__name__}")
    rng = random.Random(f"{seed}-{problem.a}-{problem.b}-{config.style}-{config.granularity}")
    a, b = problem.a, problem.b
    x, y = multiplicand_multiplier(a, b, config.granularity)
    if config.style == "no_reflection":
        att = long_multiplication(x, y)
        text = render_attempt(x, y, att, config.granularity) + f"\nThe answer is {att.result}."
        return Trace(text, (att.result,), ("STOP",), (None,))
    n_wrong = 0
    if config.max_attempts > 1 and rng.random() < config.retry_fraction:
        n_wrong = 1
        while n_wrong < config.max_attempts - 1 and rng.random() < config.extra_error_rate:
            n_wrong += 1
    blocks, answers, decisions, errors = [], [], [], []
    for k in range(n_wrong + 1):
        err = None
        if k < n_wrong:
            try:
                err = draw_error(x, y, rng, config.error_weights, config.checks)
            except ValueError:  # no slip of these types that the checks detect (e.g. 101 with nines only)
                n_wrong = k
        att = long_multiplication(x, y, err)
        check, ok = render_check(a, b, att.result, config.checks)
        assert ok == (err is None), "the checks must catch exactly the injected errors"
        head = f"Attempt {k + 1}:\n" if n_wrong else ""
        body = head + render_attempt(x, y, att, config.granularity) + f"\nSo {a} * {b} = {att.result}.\n" + check
        if ok:
            body += f"\nThe answer is {att.result}."
            decisions.append("STOP")
        else:
            body += "\n" + rng.choice(config.markers)
            decisions.append("RESAMPLE")
        blocks.append(body)
        answers.append(att.result)
        errors.append(err)
        if ok:
            break
    return Trace("\n".join(blocks), tuple(answers), tuple(decisions), tuple(errors))


def parse_roundtrip(problems, config: TraceConfig, seed: int = 0) -> dict:
    """Generate a trace for each problem (seed ``seed + i``) and parse it back with
    :func:`dsh.task.parse.parse_response`: how many traces give back exactly their attempts' answers and
    decisions, with the mean number of attempts and of characters."""

    ok, attempts, chars = 0, [], []
    for i, p in enumerate(problems):
        t = make_trace(p, config, seed=seed + i)
        r = parse.parse_response(t.text, p.a, p.b)
        ok += (tuple(r.candidates), tuple(r.decisions)) == (t.attempt_answers, t.decisions)
        attempts.append(len(t.attempt_answers))
        chars.append(len(t.text))
    n = len(attempts)
    return {"traces": n, "parsed exactly": ok, "mean attempts": sum(attempts) / n if n else None,
            "mean characters": sum(chars) / n if n else None}
