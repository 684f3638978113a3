"""Data: problems, splits, traces (deterministic, leak-free, genuine checks, errors that propagate)."""

import json

import pandas as pd
import pytest

from dsh.core import files
from dsh.task import arithmetic, parse, problems, records, traces, verl


def test_splits_are_the_papers_and_deterministic():
    s1 = problems.make_splits(seed=0)
    s2 = problems.make_splits(seed=0)
    assert s1 == s2
    assert len(s1["train"]) == 20_000 and len(s1["test"]) == 700
    levels = pd.Series([p.level for p in s1["train"]]).value_counts().to_dict()
    assert levels == {"4x5": 10_000, "5x4": 10_000}
    tl = pd.Series([p.level for p in s1["test"]]).value_counts().to_dict()
    assert tl == {f"3x{n}": 100 for n in range(3, 10)}
    for p in s1["train"][:500] + s1["test"]:
        m, n = problems.parse_level(p.level)
        assert 10 ** (m - 1) <= p.a < 10 ** m and 10 ** (n - 1) <= p.b < 10 ** n
    assert problems.make_splits(seed=1)["train"] != s1["train"]


def test_no_test_problem_in_training_even_when_levels_overlap():
    s = problems.make_splits(n_train=3000, train_levels=["2x2"], n_test=500, test_levels=["2x2"], seed=5)
    assert not ({(p.a, p.b) for p in s["train"]} & {(p.a, p.b) for p in s["test"]})


def test_question_format():
    p = problems.Problem(123, 4567)
    assert p.question == "Calculate 123 * 4567. Think step by step."
    assert p.answer == 123 * 4567 and p.level == "3x4"


@pytest.mark.parametrize("granularity", traces.GRANULARITIES)
def test_no_reflection_trace_is_correct_and_single(granularity):
    for p in problems.make_splits(n_train=50, n_test=5)["train"]:
        t = traces.make_trace(p, traces.TraceConfig(granularity=granularity, style="no_reflection"))
        assert t.attempt_answers == (p.answer,) and t.decisions == ("STOP",)
        assert t.text.endswith(f"The answer is {p.answer}.")
        assert "Check" not in t.text


@pytest.mark.parametrize("granularity", traces.GRANULARITIES)
def test_reflection_traces_end_correct_with_genuine_checks(granularity):
    cfg = traces.TraceConfig(granularity=granularity, retry_fraction=1.0, extra_error_rate=0.6, max_attempts=4)
    seen = set()
    for i, p in enumerate(problems.make_splits(n_train=200, n_test=5)["train"]):
        t = traces.make_trace(p, cfg, seed=i)
        assert t.attempt_answers[-1] == p.answer
        assert all(x != p.answer for x in t.attempt_answers[:-1])
        assert t.decisions[-1] == "STOP" and set(t.decisions[:-1]) <= {"RESAMPLE"}
        assert 2 <= len(t.attempt_answers) <= 4
        for e in t.errors[:-1]:
            seen.add(e["type"])
        # the check really computes: it fails exactly on the wrong attempts
        for ans in t.attempt_answers:
            _, ok = traces.render_check(p.a, p.b, ans)
            assert ok == (ans == p.answer)
    assert seen == {"digit", "carry", "shift"}


def test_errors_propagate_like_a_slip_of_the_pen():
    a, b = 7563, 31284
    att = arithmetic.long_multiplication(a, b, {"type": "digit", "partial": 1, "step": 2, "delta": 3})
    assert att.result - a * b == 3 * 10 ** 2 * 10 ** 1
    att = arithmetic.long_multiplication(a, b, {"type": "shift", "partial": 2, "shift": 3})
    assert att.result - a * b == a * 2 * (10 ** 3 - 10 ** 2)
    att = arithmetic.long_multiplication(a, b, {"type": "carry", "partial": 0, "step": 0})
    assert att.result - a * b == -1 * 10 ** 1     # 3*4=12: the carry 1 into the tens is lost
    assert arithmetic.long_multiplication(a, b).result == a * b


def test_trace_determinism_and_mix():
    cfg = traces.TraceConfig(retry_fraction=0.5)
    probs = problems.make_splits(n_train=400, n_test=1)["train"]
    t1 = [traces.make_trace(p, cfg, seed=0).text for p in probs]
    t2 = [traces.make_trace(p, cfg, seed=0).text for p in probs]
    assert t1 == t2
    frac = sum(len(traces.make_trace(p, cfg).attempt_answers) > 1 for p in probs) / len(probs)
    assert 0.4 < frac < 0.6
    assert all(len(traces.make_trace(p, traces.TraceConfig(max_attempts=1)).attempt_answers) == 1 for p in probs[:50])


def test_digit_format_is_the_measured_one():
    t = traces.make_trace(problems.Problem(756, 3128), traces.TraceConfig(style="no_reflection", granularity="digit"))
    first = t.text.splitlines()[0]
    assert first.startswith("756*8: 6*8=48 w8 c4, 5*8+4=44 w4 c4, 7*8+4=60 w0 c6 -> 6048")


def test_sft_and_prompt_records():
    probs = problems.make_splits(n_train=4, n_test=1)["train"]
    recs = records.sft_records(probs)
    assert recs[0]["prompt"] == [{"role": "user", "content": probs[0].question}]
    assert recs[0]["completion"][0]["role"] == "assistant"
    assert recs[0]["answer"] == str(probs[0].answer)
    pr = records.prompt_records(probs)
    assert pr[0]["answer"] == str(probs[0].answer) and pr[0]["level"] == probs[0].level


def test_chat_prompt_uses_the_template():
    class Tok:
        def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "<|user|>" + msgs[0]["content"] + "<|assistant|>"
    assert records.chat_prompt(Tok(), "Q") == "<|user|>Q<|assistant|>"


def test_chat_prompts_in_one_call_equal_one_call_each():
    """The batched template (complete's path) gives each question's chat_prompt, on the shipped base's tokenizer."""
    from transformers import AutoTokenizer

    from dsh.training.laptop_base import SHIPPED_BASE

    tok = AutoTokenizer.from_pretrained(str(SHIPPED_BASE))
    qs = [p.question for p in problems.make_splits(n_train=30, n_test=1)["train"]] + ["", "Calculate 3 * 4."]
    assert records.chat_prompts(tok, qs) == [records.chat_prompt(tok, q) for q in qs]
    assert records.chat_prompts(tok, []) == []


def test_verl_parquet_and_reward(tmp_path):
    probs = problems.make_splits(n_train=10, n_test=2)["test"]
    path = verl.write_parquet(probs, tmp_path / "test.parquet", split="test")
    df = pd.read_parquet(path)
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = df.iloc[0]
    assert row["reward_model"]["style"] == "rule"
    assert row["reward_model"]["ground_truth"] == str(probs[0].answer)
    assert list(row["prompt"])[0]["content"] == probs[0].question
    p = probs[0]
    t = traces.make_trace(p, traces.TraceConfig(retry_fraction=1.0), seed=1)
    assert verl.compute_score("dsh/multiplication", t.text, str(p.answer), {"a": p.a, "b": p.b}) == 1.0
    assert verl.compute_score("dsh/multiplication", t.text, str(p.answer + 1)) == 0.0
    assert verl.compute_score("x", "no number here", "12") == 0.0
    with pytest.raises(ValueError, match="^path must end in .parquet"):
        verl.write_parquet(probs, tmp_path / "x.csv")
    assert not list(tmp_path.glob(".*tmp"))


def test_write_jsonl_is_atomic(tmp_path):
    class Boom:
        def __iter__(self):
            yield {"x": 1}
            raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        files.write_jsonl(Boom(), tmp_path / "out.jsonl")
    assert list(tmp_path.iterdir()) == []
    files.write_jsonl([{"x": 1}], tmp_path / "ok.jsonl")
    assert json.loads((tmp_path / "ok.jsonl").read_text()) == {"x": 1}


@pytest.mark.parametrize("kwargs,name", [
    (dict(granularity="bits"), "granularity"), (dict(style="cot"), "style"),
    (dict(retry_fraction=2.0), "retry_fraction"), (dict(max_attempts=0), "max_attempts"),
    (dict(error_weights={"typo": 1.0}), "error_weights"), (dict(checks=("sevens",)), "checks"),
    (dict(markers=()), "markers"),
])
def test_bad_trace_config(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        traces.TraceConfig(**kwargs)


def test_bad_levels_and_counts():
    with pytest.raises(ValueError, match="^level must look like '3x5'"):
        problems.draw_problems("three by five", 3)
    with pytest.raises(ValueError, match="^level must"):
        problems.make_splits(test_levels=["0x3"])
    with pytest.raises(ValueError, match="^n_train must be"):
        problems.make_splits(n_train=-1)


def test_parse_recovers_generated_structure_exactly():
    for g in traces.GRANULARITIES:
        for st in traces.STYLES:
            cfg = traces.TraceConfig(granularity=g, style=st, retry_fraction=0.8, extra_error_rate=0.5, max_attempts=4)
            for i, p in enumerate(problems.make_splits(n_train=120, n_test=10, seed=3)["train"]):
                t = traces.make_trace(p, cfg, seed=i)
                r = parse.parse_response(t.text, p.a, p.b)
                assert tuple(r.candidates) == t.attempt_answers
                assert tuple(r.decisions) == t.decisions
                assert r.final_answer == p.answer


def test_parse_roundtrip_counts_exact_parses_and_misses(monkeypatch):
    ps = problems.make_splits(n_train=60, n_test=3, seed=5)["train"]
    cfg = traces.TraceConfig(retry_fraction=1.0)
    ok = traces.parse_roundtrip(ps, cfg, seed=1)
    assert ok["traces"] == ok["parsed exactly"] == 60 and ok["mean attempts"] >= 2
    real = parse.parse_response   # a parser that sees one answer too many parses no trace exactly
    monkeypatch.setattr(parse, "parse_response", lambda text, a, b: real(text + " Wait. The answer is 1.", a, b))
    assert traces.parse_roundtrip(ps, cfg, seed=1)["parsed exactly"] == 0


def test_lean_traces_multiply_by_the_shorter_operand_and_are_shorter():
    """Fails if ``lean`` multiplies by the longer operand (9 partial products for 3x9) or writes the
    write/carry of every step: its 3x9 traces must be under 60 % of ``digit``'s characters."""
    p = problems.Problem(456, 312897891)
    lean = traces.make_trace(p, traces.TraceConfig(granularity="lean", style="no_reflection")).text
    digit = traces.make_trace(p, traces.TraceConfig(granularity="digit", style="no_reflection")).text
    assert lean.startswith("312897891*6: 1*6=6, 9*6=54, 8*6+5=53") and " w" not in lean
    assert len(lean.splitlines()) == 3 + 2 + 1          # 3 partial products, 2 additions, the answer
    assert len(lean) < 0.6 * len(digit)
    assert arithmetic.multiplicand_multiplier(456, 312897891, "lean") == (312897891, 456)
    assert arithmetic.multiplicand_multiplier(456, 312897891, "digit") == (456, 312897891)


def test_reflection_with_one_check_falls_back_when_no_slip_is_detectable():
    """6350522 * 101: no digit, carry or shift slip changes the product by a non-multiple of 9, so with
    casting out nines alone no wrong attempt can be drawn; the trace then has fewer wrong attempts
    (before, make_trace raised)."""
    cfg = traces.TraceConfig(granularity="lean", retry_fraction=1.0, max_attempts=3, checks=("nines",))
    t = traces.make_trace(problems.Problem(6350522, 101), cfg, seed=1)
    assert t.attempt_answers == (6350522 * 101,) and t.decisions == ("STOP",)
    ok = [traces.make_trace(p, cfg, seed=i) for i, p in enumerate(problems.draw_problems("4x5", 100, seed=3))]
    assert sum(len(x.attempt_answers) > 1 for x in ok) >= 95      # detectable slips exist almost always


def test_gzip_copy_gives_the_same_bytes_every_time(tmp_path):
    """The same input gzipped twice (each through its own random temporary name, at different times) gives the same
    bytes, with no file name and no time in the header, and reads back."""
    import gzip
    import time

    src = tmp_path / "g.jsonl"
    src.write_text('{"a": 1}\n' * 50)
    a = files.gzip_copy(src, tmp_path / "a.jsonl.gz").read_bytes()
    time.sleep(1.1)
    b = files.gzip_copy(src, tmp_path / "b.jsonl.gz").read_bytes()
    assert a == b and a[3] & 0x08 == 0 and a[4:8] == b"\0\0\0\0"     # FLG.FNAME unset, MTIME 0
    assert gzip.decompress(a) == src.read_bytes()


def test_a_distinct_draw_has_no_repeat_and_is_the_same_stream_with_repeats_skipped():
    """The laptop ladder's 100 questions of 1x2 (810 problems) hold 7 repeats when drawn with
    replacement. ``distinct=True`` draws the same stream without them: the first occurrences in the same order,
    topped up from further down the stream; a draw that had no repeat (the paper's 3x3..3x9) is the same list."""
    seed = problems.TEST_STREAM   # the test questions' stream (problems.test_problems, seed 0)
    plain = problems.draw_problems("1x2", 100, seed=seed)
    pairs = [(p.a, p.b) for p in plain]
    assert len(set(pairs)) == 93   # the case of the issue: 7 repeats
    dist = problems.draw_problems("1x2", 100, seed=seed, distinct=True)
    assert len({(p.a, p.b) for p in dist}) == 100
    firsts = list(dict.fromkeys(pairs))
    assert [(p.a, p.b) for p in dist][:93] == firsts
    longer = problems.draw_problems("1x2", 300, seed=seed)
    assert [(p.a, p.b) for p in dist] == list(dict.fromkeys((p.a, p.b) for p in longer))[:100]
    for lv in ("3x3", "3x9"):
        assert problems.draw_problems(lv, 100, seed=seed, distinct=True) == problems.draw_problems(lv, 100, seed=seed)
    # every problem of a level, and no more
    assert len(set(problems.draw_problems("1x1", 81, seed=2, distinct=True))) == 81
    with pytest.raises(ValueError, match=r"^count must be at most 81 for distinct problems of level 1x1 "):
        problems.draw_problems("1x1", 82, seed=2, distinct=True)
    with pytest.raises(ValueError, match=r"^count must be at most 80 for distinct problems of level 1x1 "
                                         r"\(81 problems, 1 excluded\); got 81$"):
        problems.draw_problems("1x1", 81, seed=2, exclude={(1, 1)}, distinct=True)
