"""Parsing candidates and decisions: never raises, recognizes the paper's patterns and markers."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh import parse

A, B = 123, 4567


def test_candidate_patterns():
    cases = {
        "so the answer is 561741.": 561741,
        "The answer is: 561,741": 561741,
        "123 * 4567 = 561741": 561741,
        "4567 × 123 = 561741": 561741,
        "final: \\boxed{561741}": 561741,
        "it is **561,741**": 561741,
        "The answer is $\\boxed{561741}$": 561741,
    }
    for text, val in cases.items():
        assert parse.parse_response(text, A, B).final_answer == val, text


def test_intermediate_products_are_not_candidates():
    text = "123 * 7 = 861, shifted 0: 861\n3*4=12 w2 c1\nThe answer is 561741."
    r = parse.parse_response(text, A, B)
    assert r.candidates == [561741]
    # without the operands, "a * b = N" is not used at all
    assert parse.parse_response("123 * 4567 = 5", None, None).candidates == []


def test_decisions_follow_markers():
    text = ("123 * 4567 = 561751. Wait, that looks off. Let me recompute. 123 * 4567 = 561741. "
            "The answer is 561741.")
    r = parse.parse_response(text, A, B)
    assert r.candidates == [561751, 561741]
    assert r.decisions == ["RESAMPLE", "STOP"]


def test_marker_without_new_attempt_is_stop_and_restatement_is_one_attempt():
    r = parse.parse_response("The answer is 5. Let me double-check.", A, B)
    assert r.decisions == ["STOP"]
    r = parse.parse_response("123 * 4567 = 561741. So the answer is 561741.", A, B)
    assert r.candidates == [561741] and r.decisions == ["STOP"]


def test_default_markers_include_the_papers():
    for m in ("I'll go back and check", "Let me recompute", "I made a mistake", "Let me recheck",
              "Let me double-check", "Wait", "I made an error", "On second thought"):
        r = parse.parse_response(f"The answer is 1. {m}. The answer is 2.", A, B)
        assert r.decisions == ["RESAMPLE", "STOP"], m
        r = parse.parse_response(f"The answer is 1. {m.upper()}! The answer is 2.")
        assert r.decisions == ["RESAMPLE", "STOP"], m


def test_custom_markers_and_near_misses():
    assert parse.parse_response("The answer is 1. Awaiting. The answer is 2.").decisions == ["STOP"]
    assert parse.parse_response("The answer is 1. Nope. The answer is 2.", markers=["Nope"]).decisions == ["RESAMPLE", "STOP"]
    assert parse.parse_response("The answer is 1. Nope. The answer is 2.", markers=[]).decisions == ["STOP"]


def test_operands():
    assert parse.operands("Calculate 123 * 4567. Think step by step.") == (123, 4567)
    assert parse.operands("nothing") == (None, None)
    assert parse.operands(None) == (None, None)


NEAR = st.sampled_from(["answer is", "answer is ", "\\boxed{", "**", "123 * 4567 =", "Wait", "wait",
                        "Let me recompute", ",", "1,23", "1,234,", "-", "\u2019", "I\u2019ll go back and check",
                        "\\boxed{1,2}", "**1,**", "answer is -", "123 × 4567 = ", "9" * 40, "\n", " "])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_never_raises_on_unicode(text):
    r = parse.parse_response(text, A, B)
    assert len(r.candidates) == len(r.decisions)
    assert all(d in ("STOP", "RESAMPLE") for d in r.decisions)
    if r.decisions:
        assert r.decisions[-1] == "STOP"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(NEAR, st.text(max_size=5), st.integers(-10 ** 12, 10 ** 12).map(str)), max_size=30))
def test_never_raises_on_adversarial_near_misses(parts):
    text = "".join(parts)
    r = parse.parse_response(text, A, B)
    assert all(isinstance(c, int) for c in r.candidates)
    assert parse.parse_response(text).final_answer is None or isinstance(parse.parse_response(text).final_answer, int)


def test_non_strings_do_not_raise():
    for x in (None, 5, b"bytes", ["The answer is 5"]):
        assert parse.parse_response(x).attempts == ()


def test_one_reward_behind_trl_and_verl():
    """train.correctness_reward (TRL) and verl.compute_score are both parse.is_correct."""
    from dsh import train, verl

    q = "Calculate 12 * 34. Think step by step."
    cases = [("The answer is 408.", "408"), ("12 * 34 = 408", "408"), ("The answer is 1,408.", "1408"),
             ("nothing", "12"), ("The answer is 407.", "408"), ("The answer is 408.", " 408 "),
             ("The answer is 408.", "abc"), ("The answer is 408. Let me recompute. The answer is 407.", "408")]
    got = [parse.is_correct(t, truth, q) for t, truth in cases]
    assert got == [True, True, True, False, False, True, False, False]
    assert train.correctness_reward([t for t, _ in cases], [x for _, x in cases], [q] * len(cases)) == \
        [float(x) for x in got]
    assert [verl.compute_score("d", t, x, {"a": 12, "b": 34}) for t, x in cases] == [float(x) for x in got]
    assert parse.is_correct(408, "408") and not parse.is_correct(408, "4o8") and not parse.is_correct(True, 1)
