"""The check probe (dsh.experiment.run.check_probe): balanced items, the prefix the model goes on from, the reading of
its first check, the counts against a recount by another route, the pipeline's reuse and its refusals."""

import gzip
import json
import re

import pytest

from dsh.experiment.run import check_probe as cp
from dsh.experiment.run import presets
from dsh.experiment.run.steps import Clock, probe_stage
from dsh.llm.models import weights_digest
from dsh.task import laptop_task as lt


def test_items_are_balanced_deterministic_and_the_wrong_ones_fail_the_true_check():
    qs = lt.test_questions(n_per_level=20)
    items = lt.probe_items(qs, seed=3)
    assert items == lt.probe_items(qs, seed=3) and items != lt.probe_items(qs, seed=4)
    right = [x for x in items if x["correct"]]
    wrong = [x for x in items if not x["correct"]]
    assert len(right) == len(qs) and len(wrong) >= 0.9 * len(qs)      # only a multiplier of 1 gives no wrong one
    for x in items:
        p = x["problem"]
        assert x["prefix"].endswith(f"\nThe answer is {x['candidate']}.\n")
        assert (x["candidate"] == p.answer) == x["correct"]
        assert lt.check_text(p.a, p.b, x["candidate"])[1] == x["correct"]   # wrong ones are caught by the check
        assert lt.split_attempt(x["prefix"]) == (x["prefix"].split("\nThe answer")[0], x["candidate"])
    # both kinds of error: a slip in the steps (the header copies the multiplicand) and a mis-copied multiplicand
    heads = [x["prefix"].split("*")[0] == str(lt.multiplicand_multiplier(x["problem"].a, x["problem"].b, "lean")[0])
             for x in wrong]
    assert 0.2 < sum(heads) / len(heads) < 0.9
    assert all(not x["correct"] for x in lt.probe_items(qs, 0, miscopy_fraction=1.0) if x["prefix"].split("*")[0]
               != str(lt.multiplicand_multiplier(x["problem"].a, x["problem"].b, "lean")[0]))
    with pytest.raises(ValueError, match="miscopy_fraction"):
        lt.probe_items(qs, 0, miscopy_fraction=1.5)


def _rec(question, candidate, continuation, correct=None, level="1x3"):
    a, b = lt.operands(question)
    prefix = f"steps\nThe answer is {candidate}.\n"
    return {"question": question, "level": level, "candidate": candidate,
            "correct": candidate == a * b if correct is None else correct, "prefix": prefix,
            "continuation": continuation, "response": prefix + continuation, "truncated": False}


def test_read_item_reads_the_first_check_line_after_the_prefix():
    q = "Calculate 4 * 960. Think step by step."
    right, _ = lt.check_text(4, 960, 3840)
    r = cp.read_item(_rec(q, 3840, f"Check 4 * 960 = 3840.\n{right}"))
    assert r == {"verdict": True, "true_check": True, "exact": True, "decision": "STOP", "follows_written": True}
    # the RL model's habit: a mis-copied check question, a check of the copy that fails, and a stop; the verdict
    # follows what it wrote, not the true check of the candidate
    wrong_copy, ok = lt.check_text(4, 960, 3740)
    assert not ok
    r = cp.read_item(_rec(q, 3840, f"Check 4 * 960 = 3740.\n{wrong_copy}"))
    assert r == {"verdict": False, "true_check": True, "exact": False, "decision": "STOP", "follows_written": True}
    # a failing verdict and the marker: RESAMPLE; a check question written twice is still read (beyond 1x5)
    bad, _ = lt.check_text(4, 960, 3841)
    r = cp.read_item(_rec(q, 3841, f"Check 4 * 960 = 38410.\nCheck 4 * 960 = 3841.\n{bad}\nLet me recompute.\n9"))
    assert r["decision"] == "RESAMPLE" and r["exact"] and not r["verdict"] and not r["true_check"]
    # a verdict against the value it wrote; a verdict-only check; no check at all; text after the verdict
    flipped = right.replace(": the check passes.", ": the check fails.")
    assert cp.read_item(_rec(q, 3840, flipped))["follows_written"] is False
    r = cp.read_item(_rec(q, 3840, "Check 4 * 960 = 3840.\nCheck: the check passes."))
    assert r["follows_written"] is None and r["verdict"] and not r["exact"]
    assert cp.read_item(_rec(q, 3840, "The answer is 3840.")) is None
    assert cp.read_item(_rec(q, 3840, f"{right}\n4152.\n960*4"))["decision"] is None


def test_summary_counts_equal_a_recount_by_another_route():
    rng = __import__("random").Random(5)
    recs = []
    for p in lt.test_questions(("1x3", "1x7"), 30, seed=2):
        for x in lt.probe_items([p], seed=rng.randrange(99)):
            # a made-up model: checks the candidate right, or a copy of it off by one, or says nothing
            roll = rng.random()
            cand = x["candidate"] + (1 if roll < 0.3 else 0)
            text = "" if roll > 0.9 else f"Check {p.a} * {p.b} = {cand}.\n{lt.check_text(p.a, p.b, cand)[0]}"
            recs.append({**_rec(p.question, x["candidate"], text, x["correct"], p.level), "prefix": x["prefix"],
                         "response": x["prefix"] + text})
    s = cp.summarize(recs, ("1x3",))
    assert s["tuned_levels"] == ["1x3"] and s["beyond_levels"] == ["1x7"]
    for lv in ("1x3", "1x7"):
        mine = [r for r in recs if r["level"] == lv]
        # the second route: the verdict is the word after the last "the check " of the continuation
        read = [(r, re.findall(r"the check (passes|fails)", r["continuation"])) for r in mine]
        with_check = [(r, w[-1] == "passes") for r, w in read if w]
        truth = [lt.check_text(*lt.operands(r["question"]), r["candidate"])[1] for r, _ in with_check]
        both = sum(v and t for (_, v), t in zip(with_check, truth))
        neither = sum(not v and not t for (_, v), t in zip(with_check, truth))
        block = s["by_level"][lv]
        assert block["items"] == len(mine) and block["no_check"] == len(mine) - len(with_check)
        assert block["follows_counts"][0] == both and block["follows_counts"][3] == neither
        assert block["checks"] == sum(block["follows_counts"]) == len(with_check)
        assert block["verdict_follows_check"] == pytest.approx((both + neither) / len(with_check))
    assert s["tuned"]["follows_counts"] == s["by_level"]["1x3"]["follows_counts"]
    # the made-up model follows its own copy: agreement with the true check falls with the share of bad copies
    assert 0.5 < s["tuned"]["verdict_follows_check"] < 0.85 and s["tuned"]["follows_written"] == 1.0
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_prefixes_continue_the_response_and_bad_ones_are_refused():
    from dsh.llm.complete import complete
    from dsh.llm.models import load

    model, tok = load(str(presets.LAPTOP.model))
    qs = [p.question for p in lt.test_questions(("1x3",), 4, seed=1)]
    free = complete(model, tok, qs, 60, temperature=0.0)
    cut = [c.text[:len(c.text) // 2] for c in free]
    cut = [t[:t.rfind(" ") + 1] or t for t in cut]          # whole tokens of the tiny tokenizer end at a space
    cont = complete(model, tok, qs, 60, temperature=0.0, prefixes=cut)
    for f, c, x in zip(free, cont, cut):                    # greedy: going on from its own start gives the same text
        assert (x + c.text)[:len(f.text)] == f.text
    with pytest.raises(ValueError, match="prefixes"):
        complete(model, tok, qs, 8, prefixes=["a"])
    with pytest.raises(ValueError, match="prefixes"):
        complete(model, tok, qs, 8, prefixes=[None] * len(qs))
@pytest.mark.slow   # several seconds: make check leaves it out, make test runs it
def test_run_probe_writes_its_records_and_refuses_bad_input(tmp_path):
    base = str(presets.LAPTOP.model)
    settings = cp.ProbeSettings(n_per_level=4, max_new_tokens=24)
    s = cp.run_probe(base, tmp_path / "p.json", ("1x2", "1x6"), settings, tuned_levels=("1x2",))
    assert json.loads((tmp_path / "p.json").read_text()) == s
    with gzip.open(tmp_path / "p.jsonl.gz", "rt") as f:
        recs = [json.loads(x) for x in f]
    assert len(recs) == s["tuned"]["items"] + s["beyond"]["items"] >= 14
    assert all(r["response"] == r["prefix"] + r["continuation"] for r in recs)
    assert cp.summarize(recs, ("1x2",))["by_level"] == s["by_level"]
    assert s["weights"] == weights_digest(base) and s["settings"]["n_per_level"] == 4
    for bad, match in ((dict(out=tmp_path / "p.txt"), "out"), (dict(levels=("1x9",)), "levels"),
                       (dict(levels="1x2"), "levels"),
                       (dict(settings=cp.ProbeSettings(n_per_level=0)), "n_per_level"),
                       (dict(settings=cp.ProbeSettings(temperature=-1)), "temperature")):
        args = dict(model=base, out=tmp_path / "q.json", levels=("1x2",), settings=settings) | bad
        with pytest.raises(ValueError, match=match):
            cp.run_probe(**args)
        assert not (tmp_path / "q.json").exists()


def test_the_pipeline_probe_is_reused_for_the_same_weights_and_redone_otherwise(tmp_path):
    base = str(presets.LAPTOP.model)
    settings = presets.LAPTOP.eval_settings(levels=("1x2",), n_per_level=3, max_new_tokens=24)
    out = tmp_path / "probe" / "base.json"
    got = probe_stage(base, out, presets.LAPTOP, settings, 0, Clock(False), "base")
    assert got["settings"]["n_per_level"] == 3 and got["tuned_levels"] == ["1x2"]
    stamp = out.stat().st_mtime_ns
    assert probe_stage(base, out, presets.LAPTOP, settings, 0, Clock(False), "base") == got
    assert out.stat().st_mtime_ns == stamp                                 # reused, not rewritten
    other = presets.LAPTOP.eval_settings(levels=("1x2",), n_per_level=2, max_new_tokens=24)
    assert probe_stage(base, out, presets.LAPTOP, other, 0, Clock(False), "base")["settings"]["n_per_level"] == 2


