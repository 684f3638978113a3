"""The laptop task: one-digit-multiplier multiplication written for a tiny transformer, with a check the model
computes (casting out nines as running digit sums), in the paper's two-stage shape.

The paper's task (3xN test ladder, 4x5/5x4 training, Appendix E) is scaled down to a ladder a from-scratch model
of about a million parameters learns on two CPU cores: ``1xN`` (a one-digit number times an N-digit number).
Everything is written so that each generated token depends on a few nearby tokens (the lesson of the de-risking
runs, described in chapter 07's design table):

- **Attempt** (pi_sample): the lean long multiplication of :mod:`dsh.task.traces` (``69857*8: 7*8=56, 5*8+5=45, ...
  -> 558856``) and a final sentence that does not restate the operands (``The answer is 558856.``), so the
  parser reads the attempt's answer even when the model mis-copies an operand. These are the base's own words:
  a first design that wrote ``The product is N.`` after each reflective attempt lost most answers in copying
  the number into a sentence the base had never written (chapter 07's design table).
- **Check** (what pi_d sees): casting out nines written one digit at a time: ``69857: 6>6 9>6 8>5 5>1 7>8``
  (each pair is a digit and the running digit sum mod 9), times the multiplier mod 9 (``8*8>1``), then the
  candidate's digits subtracted from that one at a time (``558856: 1 5>5 5>0 8>1 8>2 5>6 6>0``) and the verdict
  on the last digit (``0=0``). Each token is a lookup on the two or three tokens before it, so the verdict can
  follow from the model's own computation instead of being imitated (a first format that compared two residues
  written 20 tokens apart was imitated: chapter 07's design table). Casting out nines misses errors that are
  multiples of 9 (a correct check passes them).
- **Decision** (pi_d): after the check question (``Check 8 * 69857 = 558856.``, as the base learned to be asked)
  and the check, ``: the check passes.`` and the end (STOP), or ``: the check fails.`` then ``Let me
  recompute.`` and a new attempt (RESAMPLE), recognised by :mod:`dsh.task.parse` as the paper's marker.

The from-scratch *base* is pre-trained on two skills a pretrained LLM would bring: answering ``Calculate a * b.``
with the attempt (no reflection, the analogue of the paper's Qwen2.5-7B-Instruct) and checking a given claim
(``Check a * b = c.``, c right or wrong), the ingredients that reflection SFT then composes.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ..core import validate as v
from ..core.agreement import cell, cohen_kappa
from .arithmetic import draw_error, long_multiplication, multiplicand_multiplier
from .parse import ParsedResponse, group_attempts, operands
from .problems import Problem, parse_level, test_problems
from .traces import render_attempt

MARKER = "Let me recompute."
CHECK_PREFIX = "Check: "
PASSES = ": the check passes."
FAILS = ": the check fails."
PRODUCT = "The product is "   # a token of the shipped tokenizer, unused by the traces since the design change
ANSWER = "The answer is "
CHECK_QUESTION = "Check {a} * {b} = {c}."
# the fixed phrases of the traces, one token each in the tiny tokenizer (:mod:`dsh.llm.tiny`)
PHRASES = (CHECK_PREFIX, PASSES, FAILS, PRODUCT, ANSWER, MARKER, "Calculate ", " Think step by step.", "Check ",
           ", ", " -> ", " shift ")
# the ladder: levels "1xN"; fine-tuning trains on 1x2 ... 1x5 in both operand orders, the test ladder runs beyond
TEST_LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")
TRAIN_LEVELS = ("1x2", "2x1", "1x3", "3x1", "1x4", "4x1", "1x5", "5x1")
STYLES = ("no_reflection", "reflection")
# how a reflection trace checks: "computed" writes the check out (the verdict follows from it); "verdict" writes
# only the verdict (truthful in the data, but the model sees no computation to base it on: the imitated control)
CHECK_STYLES = ("computed", "verdict")


def residue_chain(n: int, start: int = 0, sign: int = 1) -> tuple[str, int]:
    """``"69857: 6>6 9>6 8>5 5>1 7>8"`` and n mod 9: each digit with the running digit sum mod 9 after it.
    With ``sign=-1`` the digits are subtracted from ``start`` (written after the colon):
    ``"558856: 1 5>5 5>0 8>1 8>2 5>6 6>0"`` ends at (start - n) mod 9."""
    s, parts = start % 9, ([str(start % 9)] if sign < 0 else [])
    for ch in str(n):
        s = (s + sign * int(ch)) % 9
        parts.append(f"{ch}>{s}")
    return f"{n}: " + " ".join(parts), s


def check_text(a: int, b: int, candidate: int) -> tuple[str, bool]:
    """The check of ``a * b = candidate`` by casting out nines, written as the model writes it, and whether it
    passes. The multiplicand's digit sum mod 9 (``rx``), times the one-digit multiplier mod 9 (``rp``), then the
    candidate's digits subtracted from ``rp`` one at a time: the check passes when that ends at 0, i.e.
    ``candidate = a * b (mod 9)``. Every token depends on the few before it (the verdict on one digit)."""
    x, y = multiplicand_multiplier(a, b, "lean")
    tx, rx = residue_chain(x) if x > 9 else ("", x)
    ty, ry = residue_chain(y) if y > 9 else ("", y)
    rp = (rx * ry) % 9
    tc, rest = residue_chain(max(candidate, 0), start=rp, sign=-1)
    ok = rest == 0 and candidate >= 0
    parts = [t for t in (tx, ty) if t] + [f"{rx}*{ry}>{rp}", tc, f"{rest}{'=' if ok else '!='}0"]
    return CHECK_PREFIX + ". ".join(parts) + (PASSES if ok else FAILS), ok


def attempt_text(a: int, b: int, error: dict | None = None) -> tuple[str, int]:
    """One attempt at ``a * b`` (lean steps, optionally with an injected slip) and its result."""
    x, y = multiplicand_multiplier(a, b, "lean")
    att = long_multiplication(x, y, error)
    return render_attempt(x, y, att, "lean"), att.result


def draw_slip(a: int, b: int, rng: random.Random) -> dict | None:
    """A realistic slip (wrong digit, dropped carry) that changes the product and that casting out nines detects;
    None when there is none (e.g. a multiplier of 1)."""
    x, y = multiplicand_multiplier(a, b, "lean")
    try:
        return draw_error(x, y, rng, {"digit": 1.0, "carry": 1.0}, ("nines",))
    except ValueError:
        return None


def miscopied_attempt(a: int, b: int, rng: random.Random, tries: int = 50) -> tuple[str, int] | None:
    """An attempt that copies the multiplicand wrongly (one digit dropped or changed, the slip the base makes
    beyond its answer levels) and multiplies the wrong number right: its steps, header included, and its result,
    which the check of ``a * b`` detects (its error is no multiple of 9). None when no such copy is found."""
    x, y = multiplicand_multiplier(a, b, "lean")
    digits = str(x)
    for _ in range(tries):
        i = rng.randrange(len(digits))
        if rng.random() < 0.5 and len(digits) > 1:
            copy = digits[:i] + digits[i + 1:]
        else:
            copy = digits[:i] + rng.choice([d for d in "0123456789" if d != digits[i]]) + digits[i + 1:]
        if copy[0] == "0":
            continue
        body, res = attempt_text(int(copy), y)
        if (res - x * y) % 9:
            return body, res
    return None


def wrong_attempt(a: int, b: int, rng: random.Random, miscopy_fraction: float = 0.0) -> tuple[str, int]:
    """A wrong attempt at ``a * b`` for a reflection trace: with probability ``miscopy_fraction`` one that miscopies
    the multiplicand (:func:`miscopied_attempt`), else a slip in the arithmetic (:func:`draw_slip`); both are
    detected by the check. (A multiplier of 1 may leave no slip: the attempt is then right.)"""
    if miscopy_fraction > 0 and rng.random() < miscopy_fraction:     # (no draw at 0: the slips' stream unchanged)
        m = miscopied_attempt(a, b, rng)
        if m is not None:
            return m
    return attempt_text(a, b, draw_slip(a, b, rng))


@dataclass(frozen=True)
class TaskTrace:
    """A trace and its structure: the answer of each attempt and each decision (for round-trip tests)."""

    prompt: str
    text: str
    attempt_answers: tuple[int, ...]
    decisions: tuple[str, ...]
    # the text cut into pieces with whether a model should learn it: False on the wrong attempts (their steps and
    # stated answer), True on the rest; "".join of the pieces is ``text`` (None: learn it all)
    segments: tuple[tuple[str, bool], ...] | None = None


def trace(p: Problem, style: str = "reflection", retry_fraction: float = 0.5, extra_error_rate: float = 0.3,
          max_attempts: int = 3, seed: int = 0, check: str = "computed", miscopy_fraction: float = 0.0) -> TaskTrace:
    """One SFT trace of ``p``. ``no_reflection``: the attempt and ``The answer is N.``; ``reflection``: attempts
    each followed by the product sentence and its check, wrong ones (share ``retry_fraction``, further ones with
    probability ``extra_error_rate``; a share ``miscopy_fraction`` of them miscopy the multiplicand, the rest slip
    in the arithmetic: :func:`wrong_attempt`) failing their check and followed by the marker; the last attempt is
    right. ``check``: one of :data:`CHECK_STYLES`."""
    v.choice("style", style, STYLES)
    v.choice("check", check, CHECK_STYLES)
    v.probability("retry_fraction", retry_fraction)
    v.probability("extra_error_rate", extra_error_rate)
    v.probability("miscopy_fraction", miscopy_fraction)
    v.positive_int("max_attempts", max_attempts)
    rng = random.Random(f"{seed}-{p.a}-{p.b}-{style}")
    if style == "no_reflection":
        body, res = attempt_text(p.a, p.b)
        return TaskTrace(p.question, f"{body}\n{ANSWER}{res}.", (res,), ("STOP",))
    n_wrong = 0
    if max_attempts > 1 and rng.random() < retry_fraction:
        n_wrong = 1
        while n_wrong < max_attempts - 1 and rng.random() < extra_error_rate:
            n_wrong += 1
    # the slipped attempts fail their check (draw_slip draws only slips the check detects; None: no slip exists,
    # a correct attempt that ends the trace); the generator's correct attempt follows them
    slipped = [wrong_attempt(p.a, p.b, rng, miscopy_fraction) for _ in range(n_wrong)]
    return trace_from_attempts(p, slipped, max_attempts, check)


def attempt_block(p: Problem, body: str, res: int, check: str = "computed") -> tuple[str, bool]:
    """One attempt of a reflection trace and its check, without the decision: the attempt's steps, its answer in
    the base's own words (``The answer is N.``), the check question as the base learned it (``Check a * b =
    N.``) and the check (``check="verdict"``: the verdict only). Returns the text and whether the check passes."""
    chk, ok = check_text(p.a, p.b, res)
    if check == "verdict":
        chk = "Check" + (PASSES if ok else FAILS)
    return f"{body}\n{ANSWER}{res}.\n{CHECK_QUESTION.format(a=p.a, b=p.b, c=res)}\n{chk}", ok


def trace_from_attempts(p: Problem, attempts, max_attempts: int = 3, check: str = "computed") -> TaskTrace | None:
    """A reflection trace whose attempts are given (``(body, result)`` pairs, e.g. the model's own samples): each
    attempt is followed by the product sentence and its true check; a passing check ends the trace (STOP, even on
    a wrong answer that casting out nines misses), a failing one is followed by the marker and the next attempt;
    after the given attempts run out, the generator's correct attempt follows. None when the trace would need more
    than ``max_attempts`` attempts. The trace's ``segments`` mark the wrong attempts (steps and stated answer) as
    not to be learned: the check, the verdict, the marker and the right attempt carry what reflection SFT teaches."""
    v.choice("check", check, CHECK_STYLES)
    segments, answers, decisions = [], [], []
    queue = list(attempts)
    for k in range(max_attempts):
        body, res = queue.pop(0) if queue else attempt_text(p.a, p.b)
        block, ok = attempt_block(p, body, res, check)
        attempt = f"{body}\n{ANSWER}{res}."
        assert block.startswith(attempt)
        segments += [("\n" if k else "", True), (attempt, res == p.answer), (block[len(attempt):], True)]
        answers.append(res)
        if ok:
            decisions.append("STOP")
            segments = tuple((t, learn) for t, learn in segments if t)
            return TaskTrace(p.question, "".join(t for t, _ in segments), tuple(answers), tuple(decisions), segments)
        segments.append((f"\n{MARKER}", True))
        decisions.append("RESAMPLE")
    return None


_OWN = re.compile(r"^(.*?)\nThe answer is (\d+)\.$", re.S)


def split_attempt(text: str) -> tuple[str, int] | None:
    """A no-reflection response (``<steps>\nThe answer is N.``) as ``(body, N)``; None when it is not one."""
    m = _OWN.match(text.strip())
    return (m.group(1), int(m.group(2))) if m and m.group(1).strip() else None


_STATED = re.compile(r"^The answer is (\d+)\.(?!\d)", re.M)   # the sentence whole: an answer line the model
# turned into something else ("The answer is 226: 2>2 ...", cut "The answer is 10") states no answer


def read_response(text, a: int | None = None, b: int | None = None, markers=(MARKER,)) -> ParsedResponse:
    """A laptop response read as the paper defines its two stages: a candidate is an attempt's stated answer (a
    line ``The answer is N.``, the sentence whole), nothing else; the check lines (the check question ``Check a * b = c.``, which
    restates the candidate, and the check) are what pi_d reads, so a mis-copied check adds no candidate. Attempts
    and decisions as :func:`dsh.task.parse.group_attempts` forms them: RESAMPLE when the marker (the format's own,
    ``Let me recompute.``) and a new stated answer follow, STOP otherwise. ``a``, ``b``: unused (the signature of
    :func:`dsh.task.parse.parse_response`)."""
    if not isinstance(text, str):
        return ParsedResponse(())
    return group_attempts(text, [(int(m.group(1)), m.start(), m.end()) for m in _STATED.finditer(text)], markers)


def check_example(p: Problem, rng: random.Random, wrong_fraction: float = 0.5) -> TaskTrace:
    """A base-corpus example of the check skill: asked ``Check a * b = c.`` (c the product or a slip of it), the
    base restates the claim and checks it (:func:`check_text`)."""
    c = p.answer
    if rng.random() < wrong_fraction:
        err = draw_slip(p.a, p.b, rng)
        if err is not None:
            c = attempt_text(p.a, p.b, err)[1]
        elif rng.random() < 0.5:
            c = p.answer + rng.choice([1, 2, 3, 4, 5, 6, 7, 8]) * 10 ** rng.randrange(len(str(p.answer)))
    text, ok = check_text(p.a, p.b, c)
    claim = CHECK_QUESTION.format(a=p.a, b=p.b, c=c)
    # the base restates the claim before checking it: copying numbers of every length of the ladder is a skill it
    # brings, so that a reflective model can write its own check question (``Check a * b = N.``) beyond 1x5
    return TaskTrace(claim, f"{claim}\n{text}", (c,), ("STOP" if ok else "RESAMPLE",))


def probe_items(problems, seed: int = 0, miscopy_fraction: float = 0.5) -> list[dict]:
    """The check probe's items (beyond the paper: decision faithfulness with as many wrong candidates as right
    ones): for every problem one response prefix ending in a right answer and one ending in a wrong answer, each an
    attempt in the base's own words followed by ``The answer is N.`` and a new line, so that what the model writes
    next is its check question, its check and its verdict (pi_d). Wrong attempts are the slips the generator draws
    (a wrong digit or a dropped carry) or, with probability ``miscopy_fraction``, a mis-copied multiplicand
    (:func:`wrong_attempt`); all of them fail the true check. A problem that admits no wrong attempt the check
    detects (a multiplier of 1) gives its right item only. Each item: the problem, the prefix, the candidate and
    whether it is right. The same problems and seed give the same items."""
    v.length("seed", seed)
    v.probability("miscopy_fraction", miscopy_fraction)
    rng = random.Random(f"probe-{seed}")
    out = []
    for p in problems:
        body, res = attempt_text(p.a, p.b)
        out.append({"problem": p, "prefix": f"{body}\n{ANSWER}{res}.\n", "candidate": res, "correct": True})
        body, res = wrong_attempt(p.a, p.b, rng, miscopy_fraction)
        if res != p.answer and not check_text(p.a, p.b, res)[1]:
            out.append({"problem": p, "prefix": f"{body}\n{ANSWER}{res}.\n", "candidate": res, "correct": False})
    return out


def draw(level: str, rng: random.Random) -> Problem:
    m, n = parse_level(level)
    return Problem(rng.randint(10 ** (m - 1), 10 ** m - 1), rng.randint(10 ** (n - 1), 10 ** n - 1))


def slip_probability(p: Problem, slip_rate: float) -> float:
    """The chance that an attempt at ``p`` in a graded corpus carries a slip: ``1 - (1 - slip_rate)^N`` with N the
    multiplicand's digits (one chance per step of the long multiplication), so accuracy falls with the level."""
    v.probability("slip_rate", slip_rate)
    return 1 - (1 - slip_rate) ** len(str(max(p.a, p.b)))


def fallible_attempt(p: Problem, rng: random.Random, slip_rate: float) -> TaskTrace:
    """A no-reflection example of a fallible pi_sample: with probability :func:`slip_probability` the attempt carries
    a slip (:func:`draw_slip`: a wrong digit or a dropped carry, which casting out nines detects) and states the
    slipped result as its answer; otherwise the right attempt."""
    if slip_rate > 0 and rng.random() < slip_probability(p, slip_rate):
        err = draw_slip(p.a, p.b, rng)
        if err is not None:
            body, res = attempt_text(p.a, p.b, err)
            return TaskTrace(p.question, f"{body}\n{ANSWER}{res}.", (res,), ("STOP",))
    return trace(p, "no_reflection")


def base_corpus(levels, weights, n: int, check_fraction: float = 0.3, seed: int = 0,
                exclude=frozenset(), check_levels=None, slip_rate: float = 0.0,
                stream: str = "base", with_problems: bool = False) -> list:
    """The from-scratch pre-training corpus: ``n`` examples, a share ``check_fraction`` of them check examples
    (levels uniform over ``check_levels``, default ``levels``: checking is a skill the base has at every length),
    the rest no-reflection attempts (levels drawn from ``levels`` with ``weights``), each slipped with probability
    :func:`slip_probability` (``slip_rate`` 0: every attempt right); problems in ``exclude`` (pairs (a, b)) are
    never drawn (the test questions, in both orders: :func:`held_out`). ``stream`` names the random stream (the
    same ``stream`` and ``seed`` give the same corpus). ``with_problems``: ``(Problem, TaskTrace)`` pairs."""
    levels = [f"{m}x{k}" for m, k in map(parse_level, levels)]
    check_levels = levels if check_levels is None else [f"{m}x{k}" for m, k in map(parse_level, check_levels)]
    if not check_levels:
        raise ValueError("check_levels must name at least one level, like '1x2'; got none")
    if len(weights) != len(levels) or any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"weights must be {len(levels)} non-negative numbers, one positive; got {weights!r}")
    n = v.length("n", n)
    v.probability("check_fraction", check_fraction)
    v.probability("slip_rate", slip_rate)
    if not isinstance(stream, str) or not stream:
        raise ValueError(f"stream must be a non-empty name of the random stream, like 'base'; got {stream!r}")
    rng = random.Random(f"{stream}-{seed}")
    out = []
    while len(out) < n:
        is_check = rng.random() < check_fraction
        p = draw(rng.choice(check_levels) if is_check else rng.choices(levels, weights)[0], rng)
        if (p.a, p.b) in exclude:
            continue
        t = check_example(p, rng) if is_check else fallible_attempt(p, rng, slip_rate)
        out.append((p, t) if with_problems else t)
    return out


def test_questions(levels=TEST_LEVELS, n_per_level: int = 100, seed: int = 0) -> list[Problem]:
    """The test questions of every stage: ``dsh evaluate``'s for these levels and seed
    (:func:`dsh.task.problems.test_problems`)."""
    return test_problems(levels, n_per_level, seed)


def held_out(levels=TEST_LEVELS, n_per_level: int = 100, seed: int = 0, both_orders: bool = False) -> frozenset:
    """The test questions as pairs (a, b); ``both_orders`` adds (b, a): the reversed question writes the same
    scratchpad and answer (the lean attempt multiplies the longer operand by the shorter), so a training set
    must leave out both, and the base's corpus (:mod:`dsh.training.laptop_base`) and fine-tuning do."""
    pairs = {(p.a, p.b) for p in test_questions(levels, n_per_level, seed)}
    return frozenset(pairs | ({(b, a) for a, b in pairs} if both_orders else set()))


_ATTEMPT_CHECK = re.compile(r"The answer is (\d+)\.\nCheck [^\n]*\n(Check(?:: [^\n]*?)?: the check (passes|fails)\.)")


def check_fidelity(question_a: int, question_b: int, response: str) -> list[dict]:
    """Every (answer sentence, check) pair in a response: the candidate, the model's verdict, the true check's
    verdict on that candidate, whether the answer is right, the check line written and the true one, and whether
    they are the same (``exact``)."""
    out = []
    for m in _ATTEMPT_CHECK.finditer(response):
        cand = int(m.group(1))
        true_text, true_ok = check_text(question_a, question_b, cand)
        out.append({"candidate": cand, "verdict": m.group(3) == "passes", "true_check": true_ok,
                    "correct": cand == question_a * question_b, "exact": m.group(2) == true_text,
                    "written": m.group(2), "true_text": true_text})
    return out


def faithfulness(records) -> dict:
    """Decision faithfulness of responses to laptop questions (records with ``question``, ``response`` and
    ``level``): per level and overall, the number of (product, check) pairs, the share whose verdict equals the
    true check of that candidate (``verdict_follows_check``) with its chance baseline and Cohen's kappa
    (``chance_agreement``, ``kappa``, ``kappa_ci``; :func:`dsh.core.agreement.cohen_kappa`; the 2x2 counts of
    verdict "passes" by true check passes in ``follows_counts``, so that levels and seeds pool), whose check line
    is exactly right (``check_exact``), whose verdict is right about correctness (``verdict_right``), and the share
    of attempts after a "fails" verdict that go on with the marker (``resample_after_fail``)."""

    by: dict = {}
    for r in records:
        a, b = operands(r["question"])
        fid = check_fidelity(a, b, r["response"])
        parsed = read_response(r["response"], a, b)
        for lv in (r.get("level", "all"), "overall"):
            d = by.setdefault(lv, {"checks": 0, "exact": 0, "right": 0, "resample": 0, "counts": [0, 0, 0, 0]})
            for k, f in enumerate(fid):
                d["checks"] += 1
                # 2x2 of verdict "passes" by true check passes: both, verdict only, true check only, neither
                d["counts"][cell(f["verdict"], f["true_check"])] += 1
                d["exact"] += f["exact"]
                d["right"] += f["verdict"] == f["correct"]
                if not f["verdict"]:
                    d["resample"] += k < len(parsed.decisions) and parsed.decisions[k] == "RESAMPLE"
    share = lambda x, n: x / n if n else None  # noqa: E731
    out = {}
    for lv, d in by.items():
        kappa = cohen_kappa(*d["counts"])
        out[lv] = {"checks": d["checks"], "verdict_follows_check": kappa["observed"],
                   "chance_agreement": kappa["chance"], "kappa": kappa["kappa"], "kappa_ci": kappa["kappa_ci"],
                   "follows_counts": d["counts"],
                   "check_exact": share(d["exact"], d["checks"]), "verdict_right": share(d["right"], d["checks"]),
                   "resample_after_fail": share(d["resample"], d["counts"][2] + d["counts"][3])}
    return out


def first_checked(records) -> dict:
    """How often pi_d has a check to read after the first attempt: per level and ``overall``, the responses
    (records with ``response`` and ``level``) with a stated answer, and those whose first answer is followed at once by
    its check (the check question and a verdict line, as :func:`check_fidelity` reads them): ``{"answered",
    "checked", "share"}`` (share None without an answered response). A response that stops without a check makes
    its STOP without reading correctness."""
    by: dict = {}
    for r in records:
        first = _STATED.search(r["response"]) if isinstance(r.get("response"), str) else None
        for lv in (r.get("level", "all"), "overall"):
            d = by.setdefault(lv, [0, 0])
            if first is not None:
                d[0] += 1
                d[1] += _ATTEMPT_CHECK.match(r["response"], first.start()) is not None
    return {lv: {"answered": n, "checked": k, "share": k / n if n else None} for lv, (n, k) in by.items()}


def _checks(records):
    """(response index, question, multiplicand, check) for every check of ``records`` (:func:`check_fidelity`)."""
    for i, r in enumerate(records):
        a, b = operands(r["question"])
        for c in check_fidelity(a, b, r["response"]):
            yield i, r["question"], multiplicand_multiplier(a, b, "lean")[0], c


def unfaithful_examples(records, n: int = 3) -> list[dict]:
    """Up to ``n`` checks of ``records`` (evaluation records) whose verdict differs from the true check of the
    candidate (the first of each response): the question, the candidate, the check written and the true one."""
    out, last = [], None
    for i, q, _, c in _checks(records):
        if c["verdict"] != c["true_check"] and i != last:
            out.append({"question": q, "candidate": c["candidate"], "written": c["written"], "true": c["true_text"]})
            last = i
            if len(out) >= n:
                break
    return out


_WRITTEN = re.compile(r"Check: (\d+): [^.]*\. (\d+)\*(\d+)>(\d+)\. (\d+): ")


def check_copies(check: str) -> tuple[int, ...] | None:
    """The numbers a check copies, as written: the claim it restates (``Check a * b = c.``, when it does) and the
    multiplicand it sums and the candidate it subtracts (``Check: 69857: ... 552856: ...`` -> (69857, 552856));
    None when the check does not have that shape."""
    lines = check.strip().split("\n")
    claim = re.fullmatch(r"Check (\d+) \* (\d+) = (\d+)\.", lines[0]) if len(lines) > 1 else None
    m = _WRITTEN.match(lines[-1])
    if not m or (len(lines) > 1 and not claim) or len(lines) > 2:
        return None
    return (tuple(map(int, claim.groups())) if claim else ()) + (int(m.group(1)), int(m.group(5)))


def unfaithful_causes(records) -> dict:
    """Why verdicts miss the true check: of the checks of ``records`` whose verdict differs from the true check of
    the candidate, how many copied the candidate wrong into the check, how many copied the multiplicand wrong (and
    the candidate right), and how many copied both right (an arithmetic slip in the chain) or do not parse."""
    counts = {"checks": 0, "unfaithful": 0, "candidate miscopied": 0, "multiplicand miscopied": 0,
              "copied right (arithmetic)": 0, "unreadable": 0}
    for _, _, x, c in _checks(records):
        counts["checks"] += 1
        if c["verdict"] == c["true_check"]:
            continue
        counts["unfaithful"] += 1
        w = _WRITTEN.match(c["written"])
        if not w:
            counts["unreadable"] += 1
        elif int(w.group(5)) != c["candidate"]:
            counts["candidate miscopied"] += 1
        elif int(w.group(1)) != x:
            counts["multiplicand miscopied"] += 1
        else:
            counts["copied right (arithmetic)"] += 1
    return counts
