"""Multiplication problems and SFT traces (paper, Appendix "Task Description" and "Dataset Construction").

Problems are "Calculate [a] * [b]. Think step by step." with an m-digit ``a`` and an n-digit ``b`` drawn
uniformly from [10^(m-1), 10^m - 1]. Traces come in two arithmetic granularities:

- ``compact``: one partial product or running sum per line (for capable models such as Qwen2.5-7B);
- ``digit``: one single-digit product or sum with its write/carry per step, the format a 135M model can
  learn (the measurements are in the book's appendix on the embedded model);
- ``lean``: digit-level with fewer tokens: a step is written without its write/carry (``6*8+4=52``: the
  written digit is the last digit of the value, the carry is the ``+4`` of the next step), and the
  shorter operand is the multiplier (3 partial products and 2 additions for 3 x 9, instead of 9 and 8),
  which makes a 3x9 trace about half as long as ``digit``'s. The ``gpu-small`` preset uses it.

and two styles:

- ``no_reflection``: one correct long multiplication ending in "The answer is N.";
- ``reflection``: one or more attempts; earlier attempts carry a realistic injected error (a wrong
  partial-product digit, a dropped carry or a misaligned shift), every attempt ends with
  "So a * b = N." and a genuine check (casting out nines and elevens, computed in the trace), and the
  check's outcome decides what follows: a reflection marker and a new attempt when it fails, the final
  answer when it passes. Only errors that the checks detect are drawn, so every trace ends correct.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import _validate as v

QUESTION = "Calculate {a} * {b}. Think step by step."
TRAIN_LEVELS = ((4, 5), (5, 4))
TEST_LEVELS = tuple((3, n) for n in range(3, 10))
GRANULARITIES = ("compact", "digit", "lean")
STYLES = ("no_reflection", "reflection")
ERROR_TYPES = ("digit", "carry", "shift")
CHECKS = ("nines", "elevens")
# markers written by the generator when a check fails (all are recognized by dsh.parse)
GENERATOR_MARKERS = ("I made a mistake. Let me recompute.", "I'll go back and check.",
                     "Let me recompute.", "Wait, I made an error. Let me recheck.")


@dataclass(frozen=True)
class Problem:
    """One multiplication problem; ``level`` is "mxn" (digits of a, digits of b)."""

    a: int
    b: int

    @property
    def level(self) -> str:
        return f"{len(str(self.a))}x{len(str(self.b))}"

    @property
    def question(self) -> str:
        return QUESTION.format(a=self.a, b=self.b)

    @property
    def answer(self) -> int:
        return self.a * self.b


def parse_level(level) -> tuple[int, int]:
    """"3x5" -> (3, 5); raises ValueError naming ``level`` otherwise."""
    if isinstance(level, (tuple, list)) and len(level) == 2:
        m, n = level
    else:
        try:
            m, n = (int(x) for x in str(level).lower().split("x"))
        except ValueError:
            raise ValueError(f"level must look like '3x5' (digits of a x digits of b, each 1..18); got {level!r}") from None
    if not (isinstance(m, int) and isinstance(n, int) and 1 <= m <= 18 and 1 <= n <= 18):
        raise ValueError(f"level must look like '3x5' (digits of a x digits of b, each 1..18); got {level!r}")
    return m, n


def draw_problems(level, count: int, seed: int = 0, exclude=frozenset()) -> list[Problem]:
    """``count`` problems of one level, uniform operands, deterministic under ``seed``; pairs in
    ``exclude`` (a set of (a, b)) are redrawn."""
    m, n = parse_level(level)
    count = v.length("count", count)
    rng = random.Random(f"{seed}-{m}x{n}")
    out = []
    while len(out) < count:
        p = Problem(rng.randint(10 ** (m - 1), 10 ** m - 1), rng.randint(10 ** (n - 1), 10 ** n - 1))
        if (p.a, p.b) not in exclude:
            out.append(p)
    return out


def test_problems(levels=TEST_LEVELS, n_per_level: int = 100, seed: int = 0) -> list[Problem]:
    """The held-out test problems: ``n_per_level`` per level, in level order (the draw that
    :func:`make_splits` holds out of training and that ``dsh.evaluate`` asks)."""
    return [p for lv in levels for p in draw_problems(lv, n_per_level, seed=seed + 1_000_003)]


def make_splits(n_train: int = 20_000, train_levels=TRAIN_LEVELS, n_test: int = 100,
                test_levels=TEST_LEVELS, seed: int = 0) -> dict[str, list[Problem]]:
    """The paper's data: ``n_train`` training problems split evenly over ``train_levels`` and
    ``n_test`` test problems per level. Test problems never appear in training (asserted)."""
    n_train = v.length("n_train", n_train)
    n_test = v.length("n_test", n_test)
    v.length("seed", seed)
    train_levels = [parse_level(x) for x in train_levels]
    test_levels = [parse_level(x) for x in test_levels]
    if not train_levels:
        raise ValueError("train_levels must name at least one level such as '4x5'")
    test = test_problems(test_levels, n_test, seed)
    held_out = {(p.a, p.b) for p in test}
    per = [n_train // len(train_levels) + (1 if i < n_train % len(train_levels) else 0) for i in range(len(train_levels))]
    train = []
    for lv, k in zip(train_levels, per):
        train += draw_problems(lv, k, seed=seed, exclude=held_out)
    rng = random.Random(seed)
    rng.shuffle(train)
    assert not ({(p.a, p.b) for p in train} & held_out), "a test problem leaked into training"
    return {"train": train, "test": test}


# ------------------------------------------------------------------------------------------------
# Long multiplication with optional injected errors
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------
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
        raise ValueError(f"problem must be a dsh.data.Problem, got {type(problem).__name__}")
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


# ------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------
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


def chat_prompt(tokenizer, question: str) -> str:
    """``question`` formatted with the tokenizer's chat template, ready for generation."""
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_jsonl(records, path) -> Path:
    """Write records as JSON lines atomically (no half-written file on failure)."""
    path = Path(path)

    def w(tmp):
        with open(tmp, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    _atomic_write(path, w)
    return path


def problems_to_dicts(problems) -> list[dict]:
    return [dict(asdict(p), level=p.level, question=p.question, answer=p.answer) for p in problems]
