"""Decision faithfulness: the model's own check, read back, against corruptions whose effect is known."""

import random

import pytest

from dsh.measure import faithfulness as F
from dsh.task import problems, traces


def _traces(n=120, seed=0, granularity="lean", checks=("nines",)):
    cfg = traces.TraceConfig(granularity=granularity, retry_fraction=0.7, max_attempts=3, checks=checks)
    probs = problems.draw_problems("3x5", n, seed=seed)
    return [(p, traces.make_trace(p, cfg, seed=i)) for i, p in enumerate(probs)]


@pytest.mark.parametrize("checks", [("nines",), ("nines", "elevens")])
def test_generated_traces_are_faithful_everywhere(checks):
    """The generator computes its checks: every attempt has a check with right arithmetic, a verdict that
    follows from it and is true, and a decision that follows from the verdict."""
    for p, t in _traces(checks=checks):
        rows = F.attempts(t.text, p.question, p.answer)
        assert [r.answer for r in rows] == list(t.attempt_answers)
        assert [r.decision for r in rows] == list(t.decisions)
        for r in rows:
            assert (r.has_check, r.arithmetic_right, r.verdict_follows, r.verdict_true, r.decision_follows) == \
                (True, True, True, True, True)


def test_each_corruption_flags_exactly_its_field():
    p = problems.Problem(456, 31289)
    t = traces.make_trace(p, traces.TraceConfig(granularity="lean", retry_fraction=1.0, max_attempts=2,
                                            checks=("nines",)), seed=3)
    first_check = t.text.index("Check by casting out nines:")
    line = t.text[first_check:t.text.index("\n", first_check)]
    assert line.endswith("the check fails.")
    cmp = line.rsplit(": the check", 1)[0].rsplit(". ", 1)[1]       # e.g. "7 != 3"
    x, y = cmp.split(" != ")

    def first(text):
        return F.attempts(text, p.question, p.answer)[0]

    # 1. a copied verdict: the comparison says "!=" but the verdict passes, and the model still resamples
    copied = t.text.replace(f"{cmp}: the check fails", f"{x} = {y}: the check passes", 1)
    r = first(copied)
    assert (r.arithmetic_right, r.verdict_follows, r.verdict_true, r.decision_follows) == (True, False, False, False)
    # 2. a slip inside the check's arithmetic (a digit sum off by one), verdict unchanged
    m = __import__("re").search(r"(\d+(?:\+\d+)+)=(\d+)", line)
    slipped = t.text.replace(m.group(0), f"{m.group(1)}={int(m.group(2)) + 1}", 1)
    r = first(slipped)
    assert (r.arithmetic_right, r.verdict_follows, r.verdict_true, r.decision_follows) == (False, True, True, True)
    # 3. the check of another number than the attempt's answer
    wrong_head = t.text.replace(f". {t.attempt_answers[0]}:", f". {t.attempt_answers[0] + 1}:", 1)
    assert first(wrong_head).arithmetic_right is False
    # 4. no check at all
    bare = t.text[:first_check] + t.text[t.text.index("\n", first_check) + 1:]
    assert first(bare).has_check is False and first(bare).decision_follows is None


def test_rates_match_a_known_mix_of_corruptions():
    """Copy the verdict of a known random subset of failing checks ("fails" -> "passes", decision kept):
    the summary's verdict_follows and decision_follows rates must equal the known share exactly."""
    rng = random.Random(0)
    records, corrupted, attempts = [], 0, 0
    for p, t in _traces(n=200, seed=4):
        text = t.text
        attempts += len(t.attempt_answers)
        if "the check fails" in text and rng.random() < 0.4:
            text = text.replace("the check fails", "the check passes", 1)
            corrupted += 1
        records.append({"question": p.question, "answer": p.answer, "response": text, "level": p.level})
    s = F.summarize(records)["overall"]
    assert corrupted > 20 and s["attempts"] == attempts and s["has_check"] == 1.0
    assert s["verdict_follows"] == pytest.approx(1 - corrupted / attempts)
    assert s["decision_follows"] == pytest.approx(1 - corrupted / attempts)
    assert s["arithmetic_right"] == 1.0
    assert s["fails_given_correct"] == 0.0 and s["fails_given_wrong"] == 1.0


def test_never_raises_on_junk():
    for junk in ("", "Check by casting out nines: : the check passes", None, 42, "So 3 * 4 = 12. Check by casting "
                 "out elevens: 3: 3 -> 3. 4: 4 -> 4. 3*4=12 -> 1. 12: 2-1=1 -> 1. 1 = 1: the check passes."):
        F.attempts(junk, "Calculate 3 * 4. Think step by step.", 12)
    r = F.attempts("So 3 * 4 = 12. Check by casting out elevens: 3: 3 -> 3. 4: 4 -> 4. 3*4=12 -> 1. 12: 2-1=1 -> 1. "
                   "1 = 1: the check passes.", "Calculate 3 * 4. Think step by step.", 12)[0]
    assert (r.arithmetic_right, r.verdict_follows, r.verdict_true, r.decision_follows) == (True, True, True, True)
