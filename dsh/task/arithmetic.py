"""Long multiplication step by step, with optional injected errors, and the checks that detect them
(casting out nines and elevens): the arithmetic behind the SFT traces (:mod:`dsh.task.traces` writes it out).

Errors are realistic slips: a wrong partial-product digit, a dropped carry, a misaligned shift. Only errors
that change the product and that the chosen checks detect are drawn, so that a trace's check decides truthfully.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ERROR_TYPES = ("digit", "carry", "shift")
CHECKS = ("nines", "elevens")


@dataclass
class DigitStep:
    x: int        # digit of a (or of the first addend)
    y: int        # digit of b (multiplication) or of the second addend (addition)
    carry_in: int
    value: int
    write: int
    carry_out: int


@dataclass
class Partial:
    digit: int
    index: int            # position of the digit in b (units = 0)
    steps: list
    value: int            # the partial product a * digit as computed (possibly wrong)
    shift: int            # the shift used (possibly wrong)

    @property
    def shifted(self) -> int:
        return self.value * 10 ** self.shift


@dataclass
class Addition:
    left: int
    right: int
    steps: list
    result: int


@dataclass
class Attempt:
    partials: list
    additions: list
    result: int
    error: dict | None = None


def _mul_digit(a: int, d: int, error=None) -> tuple[list, int]:
    """Digit-by-digit a * d (units first). ``error`` = ("digit", step, delta) or ("carry", step)."""
    steps, c, out = [], 0, []
    digits = [int(x) for x in str(a)[::-1]]
    for j, x in enumerate(digits):
        val = x * d + c
        w, co = val % 10, val // 10
        if error and error[0] == "digit" and error[1] == j:
            w = (w + error[2]) % 10
        steps.append(DigitStep(x, d, c, val, w, co))
        out.append(w)
        c = 0 if (error and error[0] == "carry" and error[1] == j) else co
    if c:
        out.append(c)
    return steps, int("".join(map(str, out[::-1])))


def _add(s: int, p: int) -> Addition:
    A, B = str(s)[::-1], str(p)[::-1]
    steps, c, out = [], 0, []
    for i in range(max(len(A), len(B))):
        x = int(A[i]) if i < len(A) else 0
        y = int(B[i]) if i < len(B) else 0
        val = x + y + c
        steps.append(DigitStep(x, y, c, val, val % 10, val // 10))
        out.append(val % 10)
        c = val // 10
    if c:
        out.append(c)
    return Addition(s, p, steps, int("".join(map(str, out[::-1]))))


def long_multiplication(a: int, b: int, error: dict | None = None) -> Attempt:
    """Long multiplication of a by the digits of b (units first), then running sums.

    ``error``: {"type": "digit", "partial": i, "step": j, "delta": k} (the written digit of step j of
    partial product i is off by k), {"type": "carry", "partial": i, "step": j} (the carry out of step j
    is dropped) or {"type": "shift", "partial": i, "shift": s} (partial product i is shifted by s).
    The error propagates through the rest of the computation, as a slip of the pen would.
    """
    partials = []
    for i, ch in enumerate(str(b)[::-1]):
        e = None
        if error and error["partial"] == i and error["type"] == "digit":
            e = ("digit", error["step"], error["delta"])
        elif error and error["partial"] == i and error["type"] == "carry":
            e = ("carry", error["step"])
        steps, val = _mul_digit(a, int(ch), e)
        shift = error["shift"] if (error and error["type"] == "shift" and error["partial"] == i) else i
        partials.append(Partial(int(ch), i, steps, val, shift))
    acc = partials[0].shifted
    additions = []
    for p in partials[1:]:
        add = _add(acc, p.shifted)
        additions.append(add)
        acc = add.result
    return Attempt(partials, additions, acc, error)


def multiplicand_multiplier(a: int, b: int, granularity: str) -> tuple[int, int]:
    """The order in which a trace multiplies: ``a`` by the digits of ``b``, except under ``lean``, where
    the operand with fewer digits is the multiplier (ties keep ``b``)."""
    if granularity == "lean" and len(str(a)) < len(str(b)):
        return b, a
    return a, b


def _detected(error_value: int, checks) -> bool:
    return any(error_value % {"nines": 9, "elevens": 11}[c] != 0 for c in checks)


def draw_error(a: int, b: int, rng: random.Random, error_weights: dict, checks=CHECKS, tries: int = 200) -> dict:
    """A random error (type drawn with ``error_weights``) that changes the product and that the
    ``checks`` detect; raises ValueError if no such error exists for (a, b)."""
    types = [t for t in ERROR_TYPES if error_weights.get(t, 0) > 0]
    weights = [error_weights[t] for t in types]
    nb = len(str(b))
    na = len(str(a))
    for _ in range(tries):
        t = rng.choices(types, weights)[0]
        i = rng.randrange(nb)
        if t == "digit" and int(str(b)[::-1][i]) < 2:
            continue  # a slip in a trivial partial product (x0, x1) is not a realistic one
        if t == "digit":
            err = {"type": "digit", "partial": i, "step": rng.randrange(na), "delta": rng.choice([1, 2, 3, 7, 8, 9])}
        elif t == "carry":
            d = int(str(b)[::-1][i])
            steps, _ = _mul_digit(a, d)
            cands = [j for j, s in enumerate(steps) if s.carry_out > 0]
            if not cands:
                continue
            err = {"type": "carry", "partial": i, "step": rng.choice(cands)}
        else:
            if nb == 1:
                continue
            s = rng.choice([x for x in (i - 1, i + 1) if 0 <= x])
            err = {"type": "shift", "partial": i, "shift": s}
        wrong = long_multiplication(a, b, err).result
        if wrong != a * b and _detected(wrong - a * b, checks):
            return err
    raise ValueError(f"error_weights must allow an error that the checks {tuple(checks)} detect for {a} * {b}")
