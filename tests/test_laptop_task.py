"""The laptop task (dsh.task.laptop_task) and the tiny tokenizer (dsh.llm.tiny): traces parse back to their structure,
the check decides exactly as arithmetic mod 9, the corpus is reproducible and keeps the test questions out."""

import random

import pytest

from dsh.task import laptop_task as lt
from dsh.task.parse import parse_response
from dsh.task.problems import Problem


def test_check_decides_as_arithmetic_mod_9():
    rng = random.Random(0)
    for _ in range(5000):
        a, b = rng.randint(1, 9), rng.randint(10, 10 ** 8)
        if rng.random() < 0.5:
            a, b = b, a
        c = a * b + rng.choice([0, 0, 1, -1, 9, -18, 27, 100, 7 * 10 ** rng.randint(0, 6)])
        text, ok = lt.check_text(a, b, c)
        assert ok == ((c - a * b) % 9 == 0)
        assert text.endswith(lt.PASSES if ok else lt.FAILS)
        # every written running value is the true one: recompute each "d>s" independently
        body = text[len(lt.CHECK_PREFIX):]
        chains = [part for part in body.split(". ") if ": " in part]
        multiplicand = chains[0].split(": ")
        s = 0
        for pair in multiplicand[1].split(" "):
            d, r = pair.split(">")
            s = (s + int(d)) % 9
            assert int(r) == s


def test_check_line_is_local_the_verdict_follows_the_last_value():
    text, ok = lt.check_text(8, 69857, 558854)
    assert text == ("Check: 69857: 6>6 9>6 8>5 5>1 7>8. 8*8>1. 558854: 1 5>5 5>0 8>1 8>2 5>6 4>2. "
                    "2!=0: the check fails.")
    assert not ok
    assert lt.check_text(8, 69857, 558856)[1]


@pytest.mark.parametrize("style", lt.STYLES)
def test_traces_parse_back_exactly(style):
    rng = random.Random(1)
    for i in range(300):
        p = lt.draw(rng.choice(lt.TEST_LEVELS + lt.TRAIN_LEVELS), rng)
        t = lt.trace(p, style, retry_fraction=0.7, seed=i)
        r = parse_response(t.text, p.a, p.b)
        assert tuple(r.candidates) == t.attempt_answers
        assert tuple(r.decisions) == t.decisions
        assert r.final_answer == p.answer
        if style == "reflection":
            fid = lt.check_fidelity(p.a, p.b, t.text)
            assert len(fid) == len(t.attempt_answers)
            assert all(f["exact"] and f["verdict"] == f["true_check"] for f in fid)
            assert [f["verdict"] for f in fid] == [d == "STOP" for d in t.decisions]


def test_check_fidelity_reads_a_wrong_verdict():
    p = Problem(8, 69857)
    wrong = lt.check_text(8, 69857, 558854)[0].replace("2!=0: the check fails.", "0=0: the check passes.")
    resp = f"x\n{lt.ANSWER}558854.\nCheck 8 * 69857 = 558854.\n{wrong}"
    (f,) = lt.check_fidelity(p.a, p.b, resp)
    assert f["verdict"] and not f["true_check"] and not f["exact"] and not f["correct"]


def test_base_corpus_is_reproducible_and_holds_out_the_test_questions():
    held = lt.held_out(n_per_level=20)
    levels, weights = ("1x2", "1x3", "2x1"), (1, 1, 0)
    c1 = lt.base_corpus(levels, weights, 400, check_fraction=0.3, seed=3, exclude=held)
    c2 = lt.base_corpus(levels, weights, 400, check_fraction=0.3, seed=3, exclude=held)
    assert c1 == c2
    assert c1 != lt.base_corpus(levels, weights, 400, check_fraction=0.3, seed=4, exclude=held)
    checks = [t for t in c1 if t.prompt.startswith("Check ")]
    assert 0.2 < len(checks) / len(c1) < 0.4
    assert any(t.decisions == ("RESAMPLE",) for t in checks) and any(t.decisions == ("STOP",) for t in checks)
    # attempts follow the weights (no 2x1), checks are drawn from every level
    import re

    pairs = [tuple(map(int, re.search(r"(\d+) \* (\d+)", t.prompt).groups())) for t in c1]
    assert not set(pairs) & held
    attempts = [pq for pq, t in zip(pairs, c1) if not t.prompt.startswith("Check ")]
    assert attempts and all(a < 10 for a, b in attempts)        # weight 0 on 2x1: no attempt of it
    assert any(a >= 10 for (a, b), t in zip(pairs, c1) if t.prompt.startswith("Check "))


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="style must be one of"):
        lt.trace(Problem(3, 45), "bogus")
    with pytest.raises(ValueError, match="weights must be"):
        lt.base_corpus(("1x2",), (1, 2), 10)
    with pytest.raises(ValueError, match="retry_fraction"):
        lt.trace(Problem(3, 45), retry_fraction=2)


def test_tiny_tokenizer_round_trips_and_formats_questions():
    from dsh.llm import tiny
    from dsh.task.records import chat_prompt

    tok = tiny.build_tokenizer()
    rng = random.Random(2)
    for i in range(200):
        p = lt.draw(rng.choice(lt.TEST_LEVELS), rng)
        t = lt.trace(p, "reflection", seed=i)
        ids = tok(t.text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == t.text
    assert chat_prompt(tok, "Calculate 3 * 45. Think step by step.") == "Calculate 3 * 45. Think step by step.\n"
    full = tok.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
                                   tokenize=True, return_dict=False)
    assert full[-1] == tok.eos_token_id
    # each fixed phrase is one token
    for ph in lt.PHRASES:
        assert len(tok(ph, add_special_tokens=False)["input_ids"]) == 1
    assert tok.padding_side == "left" and tok.pad_token_id != tok.eos_token_id


def test_verdict_only_traces_keep_truthful_verdicts_without_the_computation():
    rng = random.Random(5)
    for i in range(100):
        p = lt.draw("1x5", rng)
        t = lt.trace(p, "reflection", retry_fraction=1.0, seed=i, check="verdict")
        assert ">" not in t.text.split("\n")[-1]
        fid = lt.check_fidelity(p.a, p.b, t.text)
        assert len(fid) == len(t.attempt_answers) >= 1
        assert all(f["verdict"] == f["true_check"] and not f["exact"] for f in fid)
        r = parse_response(t.text, p.a, p.b)
        assert tuple(r.decisions) == t.decisions
