"""The graded laptop experiment's ingredients: a corpus whose attempts slip at the stated per-digit rate (each slip
caught by the check), a base continued from another on it (`dsh base --spec graded`), and fine-tuning that replays
the starting base's own corpus (task_options replay=base_corpus)."""

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dsh.experiment.run import presets
from dsh.measure import tasks
from dsh.task import laptop_task as lt
from dsh.task.problems import Problem
from dsh.training import laptop_base as lb
from dsh.training.train import build_dataset

ROOT = Path(__file__).resolve().parent.parent


def test_a_graded_corpus_slips_at_its_rate_per_digit_and_every_slip_fails_its_check():
    levels = ("1x2", "1x5", "1x8")
    corpus = lt.base_corpus(levels, (1, 1, 1), 6000, check_fraction=0.0, seed=1, slip_rate=0.15, with_problems=True)
    wrong = Counter()
    total = Counter()
    for p, t in corpus:
        if min(p.a, p.b) == 1:              # times 1: no slip changes the product and passes unnoticed
            assert t.attempt_answers[0] == p.answer
            continue
        total[p.level] += 1
        if t.attempt_answers[0] != p.answer:
            wrong[p.level] += 1
            assert not lt.check_text(p.a, p.b, t.attempt_answers[0])[1]      # casting out nines catches it
            assert t.text.endswith(f"{lt.ANSWER}{t.attempt_answers[0]}.")
    for lv in levels:
        n = lt.parse_level(lv)[1]
        expected = 1 - 0.85 ** n
        share = wrong[lv] / total[lv]
        assert abs(share - expected) < 4 * (expected * (1 - expected) / total[lv]) ** 0.5 + 0.01, (lv, share)
    # slip rate 0 leaves the corpus of the shipped base as it was (no extra draw)
    a = lt.base_corpus(("1x2", "1x3"), (1, 1), 300, seed=2)
    b = lt.base_corpus(("1x2", "1x3"), (1, 1), 300, seed=2, slip_rate=0.0)
    assert a == b
    assert lt.slip_probability(Problem(7, 12345678), 0.1) == pytest.approx(1 - 0.9 ** 8)


def test_replay_mixes_the_bases_own_corpus_one_to_one_without_a_test_question():
    prov = {"spec": {"levels": ["1x2", "1x7", "7x1"], "weights": [1, 1, 1], "check_levels": ["1x2", "1x7", "7x1"],
                     "check_fraction": 0.3, "slip_rate": 0.2}}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(d, "dsh_provenance.json").write_text(json.dumps(prov))
        corpus = lb.corpus_of(d)
    cfg = presets.resolve("sft_reflection", "laptop", n_train=200, seed=3,
                          task_options={**presets.LAPTOP_REFLECTION, "replay": "base_corpus"})
    task = tasks.get("laptop_task")
    base = task.records(cfg, task.training_problems(cfg))
    mixed = task.with_replay(cfg, base, corpus)
    assert len(mixed) == 2 * len(base)
    assert task.with_replay(cfg, base, corpus) == mixed                         # reproducible
    extra = [r for r in mixed if r not in base]
    assert len(extra) == len(base)
    assert {r["level"] for r in extra} == {"1x2", "1x7", "7x1"}
    held = lt.held_out(both_orders=True)
    for r in extra:
        assert r["segment_loss"] == [True] and "".join(r["segment_texts"]) == r["completion"][0]["content"]
        q = r["prompt"][0]["content"]
        a, b = (int(x) for x in re.findall(r"\d+", q)[:2])
        assert (a, b) not in held
    checks = sum(r["prompt"][0]["content"].startswith("Check") for r in extra)
    assert 0.2 < checks / len(extra) < 0.4
    wrong = [r for r in extra if not r["prompt"][0]["content"].startswith("Check")
             and not r["completion"][0]["content"].endswith(f"{lt.ANSWER}{r['answer']}.")]
    assert wrong                                                                # slipped attempts are replayed too


def test_replay_needs_a_base_that_describes_its_corpus(tmp_path):
    with pytest.raises(ValueError, match="replay=base_corpus needs a base made by `dsh base`"):
        lb.corpus_of(tmp_path)
    cfg = presets.resolve("sft_reflection", "laptop", model="embedded", n_train=4,
                          task_options={**presets.LAPTOP_REFLECTION, "replay": "base_corpus"})
    with pytest.raises(ValueError, match="replay=base_corpus"):
        build_dataset(cfg)
    with pytest.raises(ValueError, match="task_options\\['replay'\\]"):
        presets.resolve("sft", "laptop", task_options={"replay": "yes"})


def test_bad_graded_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="slip_rate"):
        lb.BaseSpec(slip_rate=1.5)
    with pytest.raises(ValueError, match="init must be None or a model"):
        lb.BaseSpec(init="")
    with pytest.raises(ValueError, match="slip_rate"):
        lt.base_corpus(("1x2",), (1,), 3, slip_rate=-0.1)
    r = subprocess.run([sys.executable, "-m", "dsh", "base", "--out", "x", "--slip-rate", "0.1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "--slip-rate is a setting of --spec graded" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow   # trains a model
def test_a_graded_base_continues_the_laptop_base_and_says_so(tmp_path):
    from dataclasses import replace

    spec = lb.graded_spec(0.25)
    spec = replace(spec, train=replace(spec.train, tokens=6000), n_examples=300, report_n=0, curve_n=2,
                   curve_every=10 ** 6)
    prov = lb.build_base(tmp_path / "g", spec, progress=False)
    assert prov["spec"]["init"] == "laptop-base" and prov["spec"]["slip_rate"] == 0.25
    assert "laptop-base (sha256 " in prov["what"] and "report" not in prov
    corpus = lb.corpus_of(tmp_path / "g")
    assert corpus["slip_rate"] == 0.25 and set(corpus["levels"]) == set(lb.GRADED_LEVELS)
    from safetensors.torch import load_file

    new = load_file(tmp_path / "g" / "model.safetensors")
    old = load_file(lb.SHIPPED_BASE / "model.safetensors")
    assert new.keys() == old.keys() and any(not (new[k] == old[k]).all() for k in new)   # trained further
    assert (tmp_path / "g" / "tokenizer.json").read_text() == (lb.SHIPPED_BASE / "tokenizer.json").read_text()


@pytest.mark.slow
def test_the_shipped_graded_base_is_what_its_command_makes_and_its_corpus_holds_no_test_question():
    from dataclasses import asdict, replace

    from dsh.llm import models

    where = models.resolve_model("laptop-graded-base")
    prov = json.loads(Path(where, "dsh_provenance.json").read_text())
    spec = replace(lb.graded_spec(lb.GRADED_SLIP_RATE), report_n=0)          # `dsh base --spec graded --no-report`
    assert prov["spec"] == json.loads(json.dumps(asdict(spec))), "the shipped graded base is not the command's"
    s = prov["spec"]
    corpus = lt.base_corpus(s["levels"], s["weights"], s["n_examples"], s["check_fraction"], seed=s["train"]["seed"],
                            exclude=lt.held_out(both_orders=True), check_levels=s["check_levels"],
                            slip_rate=s["slip_rate"], with_problems=True)
    held = lt.held_out(both_orders=True)
    assert not [p for p, _ in corpus if (p.a, p.b) in held]
    assert len(corpus) == s["n_examples"]


def test_the_design_table_shows_every_candidate_and_the_rules_choice():
    from dsh.experiment import report

    design = json.loads((ROOT / "book/results/laptop-graded/design/graded_design.json").read_text())
    sft, grpo = report.graded_design_tables(design)
    assert len(sft) == len(design["sft_candidates"]) + len(design.get("round2", {}))
    assert sft.chosen.sum() == 1 and len(grpo) == len(design["grpo_candidates"]) and grpo.chosen.sum() == 1
    chosen = sft[sft.chosen].iloc[0]
    assert chosen["slip rate"] == lb.GRADED_SLIP_RATE == design["sft_choice"]["slip_rate"]
    # the rule's choice recomputed from the measurements: round 2's qualifying candidate, else round 1's best
    ok = [e for e in design.get("round2", {}).values() if e["judged"]["qualifies"]]
    assert (design["sft_choice"]["round"] == 2) == bool(ok)
    key = f"{chosen['slip rate']}-{design['sft_choice']['ft']}"
    assert presets.GRADED_FT_LEVELS == tuple(design["sft_candidates"][key]["ft_levels"])
    with pytest.raises(ValueError, match="design must be graded_design.json's contents"):
        report.graded_design_tables({"x": 1})


def test_the_graded_preset_studies_attribution_as_its_committed_rule_says():
    # design/ATTRIBUTION_RULE.md, committed before any study of a graded model ran: the laptop run's models and
    # repeats, sampled at the evaluation's temperature and token limit, the laptop studies' levels, groups and rounds
    from dsh.experiment.run.attribution_study import StudySettings

    rule = (ROOT / "book/results/laptop-graded/design/ATTRIBUTION_RULE.md").read_text()
    g, lap = presets.get("laptop-graded"), presets.get("laptop")
    assert g.attribution.temperature == g.eval_settings().temperature == g.training["grpo"]["temperature"] == 1.0
    assert g.attribution.max_new_tokens == g.eval_settings().max_new_tokens == 1024
    assert "temperature 1" in rule and "1,024 new tokens" in rule
    base = StudySettings()
    assert (g.attribution.levels, g.attribution.group, g.attribution.prompts_per_level, g.attribution.min_signal,
            g.attribution.max_rounds) == (base.levels, base.group, base.prompts_per_level, 200, 12)
    assert g.attribution_stages == lap.attribution_stages and g.attribution_repeats == lap.attribution_repeats
    for name in g.attribution_stages:
        assert f"`{name}`" in rule
    assert {s.name for s in g.plan_stages()} >= set(g.attribution_stages)


def test_the_graded_evaluation_answers_each_question_as_often_as_round_3_of_its_rule_says():
    """RULE.md, round 3: k is the smallest number of samples a question with which a level anywhere in the graded
    band (p_s <= 0.8) expects >= 30 wrong first attempts from the evaluation's questions a level."""
    import math

    from dsh.experiment.run import presets
    from dsh.measure.claims import GRADED

    ev = presets.get("laptop-graded").eval_settings()
    k = next(k for k in range(1, 10) if ev.n_per_level * k * (1 - GRADED[1]) >= 30 - 1e-9)
    assert ev.samples_per_question == presets.GRADED_SAMPLES == k == 2
    assert math.isclose(ev.n_per_level * (k - 1) * (1 - GRADED[1]), 20)      # one sample would give 20 < 30
    assert presets.get("laptop").eval_settings().samples_per_question == 1  # the laptop run: the paper's protocol


def test_the_graded_preset_cuts_responses_at_the_attempt_budget_round_4_of_its_rule_fixed():
    """RULE.md, round 4: K = the most attempts of the longest ladder level (1x8, 8x1) that fit in the token limit,
    the same budget in GRPO's rollouts (and the validation along them) and every evaluation; recomputed here from
    the task's own format and the tiny tokenizer, so a changed format or limit fails this test."""
    import random

    from dsh.llm.tiny import build_tokenizer
    from dsh.task import laptop_task as lt

    round4 = json.loads((ROOT / "book/results/laptop-graded/design/round4.json").read_text())
    tok, rng = build_tokenizer(), random.Random("round4-budget")
    longest = 0
    for lv in ("1x8", "8x1"):
        for _ in range(200):
            p = lt.draw(lv, rng)
            block, _ = lt.attempt_block(p, *lt.attempt_text(p.a, p.b))
            longest = max(longest, len(tok(f"{block}\n{lt.MARKER}\n", add_special_tokens=False)["input_ids"]))
    assert longest == round4["budget"]["longest_attempt_tokens"]
    k = presets.GRADED_TOKENS // longest
    g = presets.get("laptop-graded")
    assert k == round4["budget"]["K"] == presets.GRADED_ATTEMPT_BUDGET == 4
    assert g.training["grpo"]["attempt_budget"] == g.eval_settings().attempt_budget == k
    assert g.train_config("grpo", model="m", output_dir="o").attempt_budget == k
    # the stages that sample nothing in training, and the laptop run, keep their protocol
    assert all("attempt_budget" not in g.training[m] for m in ("sft", "sft_reflection", "dft"))
    assert presets.get("laptop").eval_settings().attempt_budget is None


def test_round_5_runs_every_grpo_stage_s_update_in_bfloat16_and_its_table_recomputes_its_rule():
    """RULE.md, round 5: the preset's GRPO stages (and so the KL and verdict-only ablations) update in bfloat16
    products, as every committed GRPO stage did; the stages that sample nothing in training stay float32; the
    validation table's rule is recomputed from update_precision.json, and one measurement over the limit breaks it."""
    from dsh.experiment import report
    from dsh.experiment.run import pipeline

    g = presets.get("laptop-graded")
    assert g.train_config("grpo", model="m", output_dir="o").update_precision == "bfloat16"
    assert all(g.train_config(m, model="m", output_dir="o").update_precision == "float32"
               for m in ("sft", "sft_reflection", "dft"))
    assert presets.get("laptop").train_config("grpo", model="m", output_dir="o").update_precision == "float32"
    res = pipeline.load_results(ROOT / "book/results/laptop-graded")
    grpo = [x["name"] for x in res["summary"]["plan"] if x.get("method") == "grpo"]
    assert len(grpo) == 12
    assert {res["summary"]["configs"][n]["update_precision"] for n in grpo} == {"bfloat16"}
    measured = json.loads((ROOT / "book/results/laptop-graded/design/update_precision.json").read_text())
    t = report.round5_table(measured).set_index("update")
    v = measured["bfloat16"]["validation"]
    assert t.loc["bfloat16", "rule holds"] == bool(max(m["truncated"] for m in v) <= 0.05
                                                   and measured["bfloat16"]["mixed_first_fifth"] >= 0.5)
    # float32 reproduced round 4's run bit for bit (the same final weights)
    assert t.loc["float32", "final weights"] == t.loc["round 4 (float32)", "final weights"]
    bad = json.loads(json.dumps(measured))
    bad["bfloat16"]["validation"][-1]["truncated"] = 0.051
    assert not report.round5_table(bad).set_index("update").loc["bfloat16", "rule holds"]
    with pytest.raises(ValueError, match="measured must be update_precision.json's contents"):
        report.round5_table({"bfloat16": {}})


def test_round_4_table_shows_the_validation_run_and_recomputes_its_rule():
    from dsh.experiment import report

    r4 = json.loads((ROOT / "book/results/laptop-graded/design/round4.json").read_text())
    t = report.round4_table(r4)
    assert list(t.step) == [m["step"] for m in r4["validate"]["validation"]]
    assert t["rule holds"].iloc[0] == bool(r4["validate"]["mixed_first_fifth"] >= 0.5 and all(
        m["truncated"] <= 0.05 for m in r4["validate"]["validation"]))
    # one measurement over the limit and the rule fails
    bad = json.loads(json.dumps(r4))
    bad["validate"]["validation"][-1]["truncated"] = 0.051
    assert not report.round4_table(bad)["rule holds"].iloc[0]
    with pytest.raises(ValueError, match="round4 must be round4.json's contents"):
        report.round4_table({"budget": {}})


def test_the_validation_rise_of_the_committed_graded_runs_recomputed_by_hand():
    """report.validation_rise_table against Newcombe's interval written out here from the Wilson formula, on every
    committed GRPO run; a curve that does not start at step 0 and an accuracy that is no count are refused."""
    import copy
    import math

    from dsh.experiment import report
    from dsh.experiment.run import pipeline

    res = pipeline.load_results(ROOT / "book/results/laptop-graded")
    table = report.validation_rise_table(res).set_index("stage")
    curves = res["summary"]["validation_curves"]
    assert sorted(table.index) == sorted(curves) and len(table) == 12

    def wilson(k, n, z=1.959963984540054):
        p, d = k / n, 1 + z * z / n
        h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
        return (p + z * z / (2 * n)) / d - h, (p + z * z / (2 * n)) / d + h

    for name, c in curves.items():
        (k0, n0), (k1, n1) = [(round(r["observed_accuracy"] * r["n"]), r["n"]) for r in (c[0], c[-1])]
        (l0, u0), (l1, u1) = wilson(k0, n0), wilson(k1, n1)
        d = k1 / n1 - k0 / n0
        lo = d - math.sqrt((k1 / n1 - l1) ** 2 + (u0 - k0 / n0) ** 2)
        hi = d + math.sqrt((u1 - k1 / n1) ** 2 + (k0 / n0 - l0) ** 2)
        assert table.loc[name, "rise (95 % interval)"] == f"{d:+.3f} ({lo:+.3f}, {hi:+.3f})", name
        assert table.loc[name, "verdict"] == ("rises" if lo > 0 else "falls" if hi < 0 else "cannot tell")
    bad = copy.deepcopy(res)
    bad["summary"]["validation_curves"]["rl-s0"][-1]["observed_accuracy"] += 0.001
    with pytest.raises(ValueError, match="^rl-s0's validation at step 320: accuracy .* is not a count of its 200"):
        report.validation_rise_table(bad)
    bad = copy.deepcopy(res)
    del bad["summary"]["validation_curves"]["rl-s1"][0]
    with pytest.raises(ValueError, match=r"^rl-s1's validation curve must run from step 0 to a later step"):
        report.validation_rise_table(bad)


def test_first_check_shares_of_the_committed_graded_run_by_a_second_route(tmp_path):
    """report.first_check_table against plain line reading of the committed generations (the first line 'The
    answer is N.', then a line 'Check ...' and a verdict line), stage by stage and level by level; bad folders are
    one-line errors."""
    import gzip
    import re

    from dsh.experiment import report

    folder = ROOT / "book/results/laptop-graded"
    t = report.first_check_table(folder, ("sft_reflection", "rl")).set_index("stage")
    assert len(t) == 6
    for stage in t.index:
        by = {}
        for line in gzip.open(folder / "generations" / f"{stage}.jsonl.gz", "rt"):
            r = json.loads(line)
            lines = r["response"].split("\n")
            first = next((i for i, x in enumerate(lines) if re.match(r"The answer is \d+\.(?!\d)", x)), None)
            if first is None:
                continue
            # the answer sentence alone on its line, the check question, a verdict (junk after it allowed)
            ok = (first + 2 < len(lines) and re.fullmatch(r"The answer is \d+\.", lines[first]) is not None
                  and lines[first + 1].startswith("Check ") and lines[first + 2].startswith("Check")
                  and re.search(r": the check (passes|fails)\.", lines[first + 2]) is not None)
            n, k = by.get(r["level"], (0, 0))
            by[r["level"]] = (n + 1, k + ok)
        for lv, (n, k) in by.items():
            assert abs(t.loc[stage, lv] - k / n) < 1e-12, (stage, lv, t.loc[stage, lv], k / n)
    fig = report.plot_first_checks(t.reset_index(), tuned=("1x2", "1x4"))
    ax = fig.axes[0]
    assert [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")] == ["sft_reflection", "rl"]
    assert [x.get_text() for x in ax.get_xticklabels()][:3] == ["1x2*", "1x3", "1x4*"]
    with pytest.raises(ValueError, match="^table must be report.first_check_table's result"):
        report.plot_first_checks(t[["overall"]])
    with pytest.raises(ValueError, match="^results_dir must be a laptop results folder path"):
        report.first_check_table(3)
    other = tmp_path / "other"
    other.mkdir()
    summary = json.loads((folder / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "task": "traces"}))
    with pytest.raises(ValueError, match="^results_dir must hold the laptop task's results; .* holds task 'traces'"):
        report.first_check_table(other)
