"""Parsing candidates and decisions: never raises, recognizes the paper's patterns and markers."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.task import parse

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


def _plain_marker_regex(markers):
    """The marker expression without its look-ahead on first characters: the reference it must equal."""
    import re
    lits = sorted({m.strip() for m in markers if isinstance(m, str) and m.strip()}, key=len, reverse=True)
    parts = [r"(?<![A-Za-z])" + re.escape(m).replace("'", "['\u2019]") + r"(?![A-Za-z])" for m in lits]
    parts += [f"(?:{m.pattern})" for m in markers if isinstance(m, re.Pattern)]
    return re.compile("|".join(parts), re.IGNORECASE)


_MARKER_BITS = st.sampled_from(["Wait", "wAIT", "await", "Let me re-check", "let  me recompute", "I made an slip",
                                "ON SECOND THOUGHTS", "double check", "Double-Check", "go back and verify",
                                "I\u2019ll go back and check", "'tis odd", "\u2019tis odd", "Hmm", "hmmm", "K",
                                "\u212a", "\u017f", "ß", " ", "\n", ".", "I", "l", "w", "x", "7"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_MARKER_BITS, max_size=12), st.sampled_from(["default", "quote", "pattern"]))
def test_the_marker_expressions_first_character_look_ahead_changes_no_match(bits, which):
    import re
    markers = {"default": parse.DEFAULT_MARKERS, "quote": parse.DEFAULT_MARKERS + ("'tis odd", "k"),
               "pattern": (re.compile(r"h+m+", re.IGNORECASE), "Wait")}[which]
    text = "".join(bits)
    got = [m.span() for m in parse.marker_regex(markers).finditer(text)]
    assert got == [m.span() for m in _plain_marker_regex(markers).finditer(text)], text
    # the look-ahead is used where every marker's first character is known, and only there
    assert parse.marker_regex(markers).pattern.startswith("(?=[") == (which != "pattern")


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
    """The traces task's GRPO reward (TRL) and verl.compute_score are both parse.is_correct; the laptop task's
    reads its own format."""
    from dsh.task import verl
    from dsh.training import train
    q = "Calculate 12 * 34. Think step by step."
    cases = [("The answer is 408.", "408"), ("12 * 34 = 408", "408"), ("The answer is 1,408.", "1408"),
             ("nothing", "12"), ("The answer is 407.", "408"), ("The answer is 408.", " 408 "),
             ("The answer is 408.", "abc"), ("The answer is 408. Let me recompute. The answer is 407.", "408")]
    got = [parse.is_correct(t, truth, q) for t, truth in cases]
    assert got == [True, True, True, False, False, True, False, False]
    reward = train.task_reward("traces")
    assert reward.__name__ == "correctness_reward"      # TRL logs rewards/<name>/mean
    assert reward([t for t, _ in cases], [x for _, x in cases], [q] * len(cases)) == [float(x) for x in got]
    # the laptop task's reward reads its own format: only a line stating "The answer is N." is an answer
    laptop = train.task_reward("laptop_task")([t for t, _ in cases], [x for _, x in cases], [q] * len(cases))
    assert laptop == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert [verl.compute_score("d", t, x, {"a": 12, "b": 34}) for t, x in cases] == [float(x) for x in got]
    assert parse.is_correct(408, "408") and not parse.is_correct(408, "4o8") and not parse.is_correct(True, 1)


def test_parser_reads_a_1_mb_response():
    """A 1 MB response parses to the right answer and every attempt (no wall-clock assertion: the machine is
    shared; the parser's speed on 1 MB is a README figure)."""
    work = "".join(f"343 * {d} * 10^{k} = {343 * d * 10 ** k}\nrunning total: {k * 1000 + d}\n"
                   for k in range(6) for d in range(10))
    answer = "So 343 * 7451 = 2,555,693. Wait, let me double-check.\n"
    text = (work + answer) * (2 ** 20 // len(work + answer) + 1)          # a 1 MB response
    p = parse.parse_response(text, 343, 7451)
    assert p.final_answer == 2555693 and len(p.attempts) == text.count("Wait")
    dense = "The answer is **2,555,693**. Wait. $2555693$ \\boxed{2555693} 343 * 7451 = 2555693.\n"
    big = dense * (2 ** 20 // len(dense) + 1)
    assert parse.parse_response(big, 343, 7451).final_answer == 2555693


def test_ten_thousand_fuzzed_strings_never_raise():
    import random

    rng = random.Random(0)
    pieces = ["The answer is ", "**", "\\boxed{", "}", "$", "$$", "\\times", "\\cdot", "×", " * ", " = ", "1,234",
              "12_345", "9\u2009999", "-7", "Wait", "wait,", "Let me re-check", "I made an error", "On second thought",
              "double-check", "\n", "# ", "- ", "`code`", "\\frac{1}{2}", "\u0000", "\ud7ff", "\u202e", "é", "数",
              "😀", "answer: ", "product is ", "result = ", "1" * 40, ".", ",", "(", ")", "[", "]"]
    for _ in range(10_000):
        s = "".join(rng.choice(pieces) if rng.random() < 0.7 else chr(rng.randint(1, 0x2FFF))
                    for _ in range(rng.randint(0, 40)))
        a = rng.choice([None, 12, 34, 1234])
        b = rng.choice([None, 12, 34, 1234])
        p = parse.parse_response(s, a, b)
        assert all(isinstance(x, int) for x in p.candidates)
        parse.decision_spans(s, a, b)


def test_markers_can_be_added_as_phrases_or_patterns(tmp_path):
    import json
    import re

    from dsh.__main__ import main

    text = "The answer is 407. Hold up, something is off. The answer is 408."
    assert parse.parse_response(text).decisions == ["STOP"]       # "Hold up" is no default marker
    assert parse.parse_response(text, markers=parse.DEFAULT_MARKERS + ("hold up",)).decisions == ["RESAMPLE", "STOP"]
    rx = re.compile(r"hold\s+(?:up|on)", re.IGNORECASE)
    assert parse.parse_response(text, markers=(rx,)).decisions == ["RESAMPLE", "STOP"]
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"question": "Calculate 12 * 34.", "answer": 408, "response": text}) + "\n")
    for extra in (["--marker", "Hold up"], ["--marker-pattern", r"hold\s+up"]):
        assert main(["calibrate", str(f), "--json", "--bootstrap", "0", *extra]) == 0
