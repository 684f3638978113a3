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


def _block(p, res, copied=None):
    """An attempt answering ``res`` and its check, whose question restates ``copied`` (default ``res``): a model
    that mis-copies its answer into the check question checks the copy."""
    body, _ = lt.attempt_text(p.a, p.b)
    text, ok = lt.attempt_block(p, body, copied if copied is not None else res)
    return text.replace(f"{lt.ANSWER}{copied}.", f"{lt.ANSWER}{res}.", 1) if copied is not None else text, ok


def test_a_check_that_restates_another_number_adds_no_candidate():
    """The check question restates the answer; a mis-copied one must not become a candidate: the laptop reading
    takes only the attempts' stated answers (the general parser, unchanged for the paper's format, reads the
    copy in as the attempt's answer)."""
    from dsh.measure import tasks

    p = Problem(7, 323)                                       # 2261
    wrong, _ = _block(p, 2221)                                # a wrong answer, checked faithfully: fails
    right_miscopied, ok = _block(p, 2261, copied=2221)        # the right answer, its copy wrong: the check fails
    assert not ok and "The answer is 2261.\nCheck 7 * 323 = 2221." in right_miscopied
    right, ok2 = _block(p, 2261)
    assert ok2
    text = f"{wrong}\n{lt.MARKER}\n{right_miscopied}\n{lt.MARKER}\n{right}"
    read = lt.read_response(text)
    assert read.candidates == [2221, 2261, 2261] and read.decisions == ["RESAMPLE", "RESAMPLE", "STOP"]
    general = parse_response(text, 7, 323)
    assert general.candidates == [2221, 2221, 2261]           # the phantom: the copy read as the second answer
    task = tasks.get("laptop_task")
    assert task.parse(text, 7, 323).candidates == read.candidates
    # the reward reads the same: a right final answer whose check copies another number is right, and a wrong
    # final answer whose check restates the right product is wrong
    q = p.question
    assert task.reward(right_miscopied, "2261", q) == 1.0
    wrong_copy_right, _ = _block(p, 2221, copied=2261)
    assert task.reward(wrong_copy_right, "2261", q) == 0.0 and tasks.get("traces").reward(wrong_copy_right, "2261", q) == 1.0
    # a stated answer is the whole sentence: an answer line turned into something else states none
    assert lt.read_response("The answer is 226: 2>2 2>4.\nThe answer is 84.").candidates == [84]
    assert lt.read_response(None).candidates == [] and lt.read_response("no answer").final_answer is None


def test_no_test_question_is_in_a_fine_tuning_set_in_either_order():
    """Every fine-tuning set of the laptop preset (each method, the preset's sizes, seeds 0-2) leaves out the test
    questions in both operand orders (the reversed question writes the same scratchpad and answer)."""
    from dsh.experiment.run import presets
    from dsh.measure import tasks

    test = lt.held_out()
    both = lt.held_out(both_orders=True)
    assert len(both) > len(test) and {(b, a) for a, b in test} <= both
    task = tasks.get("laptop_task")
    for method in ("sft", "grpo"):                        # sft_reflection and dft draw the same problems as sft
        for seed in (0, 1, 2):
            cfg = presets.LAPTOP.train_config(method, seed=seed)
            drawn = {(p.a, p.b) for p in task.training_problems(cfg)}
            assert len(drawn) > 0.9 * cfg.n_train and not drawn & both, (method, seed)


def test_faithfulness_kappa_by_a_second_route_on_committed_responses():
    """Kappa of verdict vs true check on committed reflective responses, recomputed by another route: the verdict
    as the line after each stated answer's check question says it, the true check as arithmetic mod 9."""
    import gzip
    import json
    import re
    from pathlib import Path

    import numpy as np

    from dsh.task.parse import operands

    path = Path(__file__).parent.parent / "book/results/laptop/generations/sft_reflection-s0.jsonl.gz"
    recs = [json.loads(x) for x in gzip.open(path, "rt")]
    recs = [r for r in recs if "response" in r]
    said, truth = [], []
    for r in recs:
        a, b = operands(r["question"])
        lines = r["response"].split("\n")
        for i, line in enumerate(lines[:-2]):
            m = re.fullmatch(r"The answer is (\d+)\.", line)
            if m and lines[i + 1].startswith("Check ") and lines[i + 2].startswith("Check"):
                verdict = re.search(r": the check (passes|fails)\.", lines[i + 2])   # junk after it allowed
                if verdict:
                    said.append(verdict.group(1) == "passes")
                    truth.append(int(m.group(1)) % 9 == (a * b) % 9)
    x, y = np.array(said), np.array(truth)
    po = np.mean(x == y)
    pe = x.mean() * y.mean() + (1 - x.mean()) * (1 - y.mean())
    f = lt.faithfulness(recs)["overall"]
    assert f["checks"] == len(x) > 500
    assert f["verdict_follows_check"] == pytest.approx(po) and f["chance_agreement"] == pytest.approx(pe)
    assert f["kappa"] == pytest.approx((po - pe) / (1 - pe))
    assert f["kappa_ci"][0] < f["kappa"] < f["kappa_ci"][1]


def test_miscopied_attempts_fail_their_check_and_the_check_restates_the_question():
    """The wrong attempts that miscopy the multiplicand (the base's slip beyond its answer levels) multiply another
    number right, and the trace's check question restates the question, not the attempt's copy, so the check fails;
    at miscopy_fraction 0 the traces are the slips-only ones."""
    import random

    from dsh.task.arithmetic import multiplicand_multiplier

    rng = random.Random(5)
    seen = 0
    for p in lt.test_questions(n_per_level=15, seed=4):
        m = lt.miscopied_attempt(p.a, p.b, rng)
        if m is None:
            continue
        body, res = m
        x, y = multiplicand_multiplier(p.a, p.b, "lean")
        head = body.split(":")[0]
        copy, mult = (int(t) for t in head.split("*"))
        assert copy != x and mult == y and res == copy * y and (res - x * y) % 9 != 0
        assert sum(c1 != c2 for c1, c2 in zip(str(copy), str(x))) <= 1 or len(str(copy)) == len(str(x)) - 1
        seen += 1
    assert seen >= 90
    t = lt.trace(Problem(3, 29446), retry_fraction=1.0, seed=1, miscopy_fraction=1.0)
    first = t.text.split("\n")
    assert not first[0].startswith("29446*3") and first[2] == f"Check 3 * 29446 = {t.attempt_answers[0]}."
    assert t.decisions[0] == "RESAMPLE" and t.attempt_answers[-1] == 3 * 29446
    slips = [lt.trace(Problem(3, 29446 + k), retry_fraction=1.0, seed=k) for k in range(20)]
    assert slips == [lt.trace(Problem(3, 29446 + k), retry_fraction=1.0, seed=k, miscopy_fraction=0.0)
                     for k in range(20)]
    assert all(s.text.startswith(f"{29446 + k}*3") for k, s in enumerate(slips))     # slips keep the operands
    with pytest.raises(ValueError, match="miscopy_fraction must be"):
        lt.trace(Problem(3, 45), miscopy_fraction=2)


def test_first_checked_counts_the_responses_whose_first_answer_its_check_follows():
    """Known truth: per level, reflection traces (every first answer checked), no-reflection traces (none), a
    reflection trace cut after its first answer (no check follows it) and a response with no stated answer (not
    counted); the shares are exactly the ones built in."""
    rng = random.Random(3)
    recs, truth = [], {}
    for lv, (n_refl, n_plain) in {"1x3": (7, 3), "1x6": (2, 8)}.items():
        for i in range(n_refl + n_plain):
            p = lt.draw(lv, rng)
            style = "reflection" if i < n_refl else "no_reflection"
            recs.append({"level": lv, "response": lt.trace(p, style, seed=i).text})
        cut = lt.trace(lt.draw(lv, rng), "reflection").text
        recs.append({"level": lv, "response": cut[:cut.index("\nCheck ")]})           # answered, then nothing
        recs.append({"level": lv, "response": "12*3: 2*3=6, 1*3=3 -> 36"})          # no stated answer
        truth[lv] = (n_refl + n_plain + 1, n_refl)
    got = lt.first_checked(recs)
    for lv, (n, k) in truth.items():
        assert got[lv] == {"answered": n, "checked": k, "share": k / n}
    assert got["overall"]["answered"] == sum(n for n, _ in truth.values())
    assert got["overall"]["checked"] == sum(k for _, k in truth.values())
    assert lt.first_checked([{"level": "1x2", "response": "nothing"}])["1x2"]["share"] is None
