"""dsh.experiment.report on a seeded results folder (the laptop preset's plan, written as dsh pipeline writes it) built
from simulated responses whose p_s, p_dC, p_dW are known: the tables recover the truth, the deltas have the right
sign, the claims run per seed, a one-seed view feeds the paper's tables."""

import json
import re

import pytest

from dsh.experiment import report
from dsh.experiment.run import pipeline, presets
from dsh.measure import tasks
from dsh.measure.stage import calibrate_stage
from dsh.task import laptop_task as lt
from dsh.task.synthetic import synthetic_records

LEVELS = ("1x2", "1x3", "1x6", "1x7")   # two levels inside the fine-tuning data, two beyond
TRUTH = {  # stage: (p_s, p_dC, p_dW) at every level
    "base": (0.6, 1.0, 0.0), "sft": (0.6, 1.0, 0.0), "sft_reflection": (0.5, 0.9, 0.3), "dft": (0.5, 0.9, 0.3),
    "rl": (0.55, 0.95, 0.8), "rl_beta0": (0.6, 0.95, 0.8), "rl_beta0.1": (0.5, 0.9, 0.4),
    "sft_verdict": (0.5, 0.5, 0.5), "rl_verdict": (0.5, 1.0, 0.0),
}


def _laptop_format(response: str) -> str:
    """A simulated response rewritten in the laptop format: each attempt's answer stated on its own line
    (``The answer is N.``; a negative wrong answer as another wrong one), the marker between attempts."""
    out = []
    for part in response.split(lt.MARKER):
        val = int(re.findall(r"= (-?\d+)\.", part)[0])
        out.append(f"{val if val >= 0 else 10 ** 9 - val}*1: steps\n{lt.ANSWER}{val if val >= 0 else 10 ** 9 - val}.")
    return f"\n{lt.MARKER}\n".join(out)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("laptop")
    (root / "calibration").mkdir()
    stages = presets.LAPTOP.plan_stages(seeds=(0, 1), ablation_seeds=(0,))
    for k, st in enumerate(stages):
        recs = []
        for i, lv in enumerate(LEVELS):
            recs += [{**r, "response": _laptop_format(r["response"])}
                     for r in synthetic_records(*TRUTH[st.kind], n=80, level=lv, seed=1000 * k + i, marker=lt.MARKER)]
        cal = calibrate_stage(recs, n_bootstrap=10, task="laptop_task")
        (root / "calibration" / f"{st.name}.json").write_text(json.dumps(cal))
    summary = {"preset": "laptop", "task": "laptop_task", "stages": [s.name for s in stages],
               "plan": [{"name": s.name, "kind": s.kind, "seed": s.seed} for s in stages],
               # 10 rounds: RL's reward rises by 0.02 a round, every other GRPO stage's is flat
               "reward_curves": {s.name: [{"step": 8 * i + 1, "reward": 0.4 + 0.02 * i if s.kind == "rl" else 0.5,
                                           "frac_reward_zero_std": 0.2, "kl": 0.01 * k} for i in range(10)]
                                 for k, s in enumerate(stages) if s.method == "grpo"},
               "training": {s.name: {"rollouts": 2560} for s in stages if s.method == "grpo"},
               "validation_curves": {s.name: [{"step": st, "p_s": 0.5 + 0.1 * j, "p_s_ci": [0.4, 0.7],
                                               "p_d_given_correct": 0.9, "p_d_given_correct_ci": [0.8, 1.0],
                                               "p_d_given_wrong": None, "p_d_given_wrong_ci": [None, None],
                                               "observed_accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6}
                                              for j, st in enumerate((0, 40, 80))]
                                     for s in stages if s.kind == "rl"},
               "timings_s": {f"train_{s.name}": 1.0 for s in stages if s.method} |
                            {f"evaluate_{s.name}": 2.0 for s in stages}}
    (root / "summary.json").write_text(json.dumps(summary))
    return pipeline.load_results(root)


def test_long_table_recovers_the_truth(results):
    df = report.long_table(results)
    for kind, (ps, pdc, pdw) in TRUTH.items():
        d = df[df.kind == kind]
        assert abs(d.p_s.mean() - ps) < 0.06
        assert abs(d.p_dC.mean() - pdc) < 0.08
        if pdw > 0:
            assert abs(d.p_dW.mean() - pdw) < 0.08
    t = report.table1(results, report.TABLE1_KINDS)
    assert list(t.index) == ["Base", "SFT (no reflection) (2 seeds)", "SFT (reflection) (2 seeds)", "RL (2 seeds)",
                             "DFT (2 seeds)"]
    assert list(t.columns) == list(LEVELS) and t.loc["Base", "1x2"].endswith(" n=80")
    cell = t.loc["RL (2 seeds)", "1x3"]          # pooled acc (95 % interval over the pooled n) [seed range] n=N
    x = df[(df.kind == "rl") & (df.level == "1x3")]
    k, n = int((x.accuracy * x.n).round().sum()), int(x.n.sum())
    hw = 1.959963984540054 * (k / n * (1 - k / n) / n) ** 0.5      # the paper's normal interval, by hand
    assert cell == (f"{100 * k / n:.1f} ({100 * (k / n - hw):.1f}, {100 * (k / n + hw):.1f}) "
                    f"[{100 * x.accuracy.min():.0f}-{100 * x.accuracy.max():.0f}] n={n}")
    assert n == 160 and x.accuracy.min() < k / n < x.accuracy.max()


def test_kl_table_and_deltas_have_the_signs_of_the_truth(results):
    kl = report.kl_table(results)
    # the ablation's arms and the RL arm at the preset's beta (0.001), in order of beta
    assert list(kl.comparison) == ["beta = 0", "beta = 0.001", "beta = 0.1"]
    dw = [float(x.split(" ")[0]) for x in kl["Δp_dW"]]
    assert dw[0] > dw[2] > 0 and dw[1] > dw[2]          # truth: +0.5, +0.5, +0.1
    d = report.delta_table(results, [("rl vs its SFT", "rl", "sft_reflection")])
    assert d.seeds[0] == 2 and float(d["Δp_dW"][0].split(" ")[0]) > 0.3


def test_claims_faithfulness_timings_and_figures(results):
    c = report.claims_by_seed(results)
    assert set(c.seed) == {0, 1} and (c[c.claim.str.startswith("(ii)")].verdict == "holds").all()
    with pytest.raises(ValueError, match=r"^seed must be one of \[0, 1\] for results with several training seeds"):
        report.claims(results)
    # simulated responses carry no check lines: the laptop task's reading finds nothing to measure
    f = report.faithfulness_table(results, ("sft_reflection", "rl", "dft", "sft_verdict", "rl_verdict"))
    keys = ["p_dC", "p_dW", "checks", *tasks.get("laptop_task").faithfulness_keys,
            "chance_agreement", "kappa", "kappa_low", "kappa_high"]
    assert len(f) == 5 and list(f.columns) == keys and f[keys[3:]].isna().all().all() and (f.checks == 0).all()
    assert abs(f.loc["RL (2 seeds)", "p_dW"] - 0.8) < 0.08
    t = report.timings_table(results)
    assert t.loc["rl-s0", "train"] == 1.0 and t.loc["base", "evaluate"] == 2.0
    import matplotlib

    matplotlib.use("Agg")
    fig = report.plot_calibration(results, ("sft_reflection", "rl"))
    assert [ax.get_title() for ax in fig.axes] == ["SFT (reflection) (2 seeds)", "RL (2 seeds)"]
    assert len(fig.axes[1].lines) == 5 + 5 * 2 * len(LEVELS)   # 5 mean lines, a dot per seed and level
    fig = report.plot_reward_curves(results)
    assert [x.get_text() for x in fig.axes[0].get_legend().get_texts()] == ["rl-s0", "rl-s1", "rl_verdict-s0"]
    fig = report.plot_validation_curves(results)
    assert [x.get_text() for x in fig.axes[0].get_legend().get_texts()] == ["rl-s0", "rl-s1"]
    assert list(fig.axes[1].lines[0].get_ydata()) == [0.5, 0.6, 0.7]        # p_s of rl-s0


def test_the_reward_trend_says_which_runs_learned(results):
    t = report.reward_trend_table(results).set_index("stage")
    assert (t.loc[["rl-s0", "rl-s1"], "verdict"] == "rises").all()
    assert (t.drop(["rl-s0", "rl-s1"]).verdict == "cannot tell").all()      # flat curves
    assert t.loc["rl-s0", "reward first fifth"] == 0.41 and t.loc["rl-s0", "reward last fifth"] == 0.57
    assert t.loc["rl-s0", "rollouts"] == 2560 and t.loc["rl-s0", "rounds"] == 10


def test_unfaithful_causes_sorts_the_misses():
    from dsh.task.problems import Problem

    p = Problem(8, 69857)
    body, res = lt.attempt_text(8, 69857)
    good, _ = lt.attempt_block(p, body, res)
    wrong_cand = good.replace("558856: 1 5>5 5>0 8>1 8>2 5>6 6>0. 0=0: the check passes.",
                              "558854: 1 5>5 5>0 8>1 8>2 5>6 4>2. 2!=0: the check fails.")
    wrong_mult = good.replace("Check: 69857: 6>6 9>6 8>5 5>1 7>8. 8*8>1. 558856: 1 ",
                              "Check: 69858: 6>6 9>6 8>5 5>1 8>0. 0*8>0. 558856: 0 ").replace(
        "5>6 6>0. 0=0: the check passes.", "5>6 6>0. 0=0: the check fails.")
    slip = good.replace("5>6 6>0. 0=0: the check passes.", "5>6 6>1. 1!=0: the check fails.")
    rows = [{"question": p.question, "response": t, "level": "1x5"} for t in (good, wrong_cand, wrong_mult, slip)]
    c = lt.unfaithful_causes(rows)
    assert c == {"checks": 4, "unfaithful": 3, "candidate miscopied": 1, "multiplicand miscopied": 1,
                 "copied right (arithmetic)": 1, "unreadable": 0}
    ex = lt.unfaithful_examples(rows, n=5)
    assert len(ex) == 3 and ex[0]["candidate"] == res and "558854" in ex[0]["written"]


def test_one_seed_feeds_the_papers_claims_and_the_headline_follows_the_data(results):
    by_kind = report.calibration_by_kind(results, 1)
    assert set(by_kind) == {"base", "sft", "sft_reflection", "dft", "rl"}      # seed 1 has no ablations
    assert by_kind["rl"] is results["calibration"]["rl-s1"] and by_kind["base"] is results["calibration"]["base"]
    assert [c["claim"].split(" ")[0] for c in report.claims(results, seed=1)] == ["(i)", "(i')", "(ii)", "(iii)"]
    lines = report.headline(results, ("1x6", "1x7"))
    assert lines[0].startswith("Base: mean accuracy") and "% on 1x6, 1x7." in lines[0]
    assert any(x.startswith("RL minus SFT (reflection)") and "over 2 seeds" in x for x in lines)
    assert any(x.startswith("KL ablation (beta = 0, beta = 0.001, beta = 0.1)") and "no interval" in x for x in lines)


def test_reflection_table_per_seed(results):
    t = report.reflection_table(results, ("1x2", "1x3")).set_index("stage")
    assert list(t.index) == ["sft_reflection-s0", "sft_reflection-s1"]
    assert (abs(t["first attempt"] - 0.5) < 0.08).all() and (abs(t["first attempt, no reflection"] - 0.6) < 0.08).all()
    assert (t.checks == 0).all() and t.kappa.isna().all()        # simulated responses write no checks


def test_question_repeats_counts_each_levels_repeats(tmp_path):
    """A generations file with known repeats gives them back per level; the committed laptop ladder asks every level's
    questions once, and they are the test questions of today's code (read by a second route: the questions drawn
    again, in order)."""
    from pathlib import Path

    from dsh.core.files import read_jsonl, write_jsonl_gz
    from dsh.task.laptop_task import test_questions

    (tmp_path / "generations").mkdir()
    qs = {"1x2": ["a", "b", "a", "a"], "1x10": ["c", "d"]}
    write_jsonl_gz(tmp_path / "generations" / "base.jsonl.gz",
                   [{"level": lv, "question": q} for lv, x in qs.items() for q in x])
    got = report.question_repeats(tmp_path)
    assert got.to_dict("records") == [{"level": "1x2", "questions": 4, "distinct": 2, "repeats": 2},
                                      {"level": "1x10", "questions": 2, "distinct": 2, "repeats": 0}]
    root = Path(__file__).parent.parent / "book" / "results" / "laptop"
    committed = report.question_repeats(root)
    assert committed["repeats"].sum() == 0 and (committed["questions"] == 100).all(), committed
    asked = {}
    for r in sorted(read_jsonl(root / "generations" / "base.jsonl.gz"), key=lambda r: r["index"]):
        asked.setdefault(r["level"], []).append(r["question"])
    drawn = {}
    for p in test_questions(list(committed["level"])):
        drawn.setdefault(p.level, []).append(p.question)
    assert asked == drawn


def test_kl_profile_bins_positions_and_is_empty_with_its_columns_where_no_position_has_ten_trajectories():
    """Mean k1 per bin of positions from the study's sums and counts; a model with (almost) no trajectories, as
    a DFT model that writes no check (the committed dft-s0), gives no rows but the columns a chapter indexes by."""
    study = {"kl_positions": {"sum": [2.0, 4.0, 1.0, 9.0], "n": [10, 20, 10, 3]}}
    got = report.kl_profile(study, width=2)
    assert got.to_dict("records") == [
        {"positions": "0-1", "first": 0, "mean k1": 6.0 / 30, "trajectories": 10},
        {"positions": "2-3", "first": 2, "mean k1": 1.0 / 10, "trajectories": 10}]
    empty = report.kl_profile({"kl_positions": {"sum": [1.0], "n": [1]}})
    assert empty.empty and list(empty.columns) == ["positions", "first", "mean k1", "trajectories"]
    assert empty.set_index("positions")["mean k1"].empty


def test_attempt_lengths_and_kl_by_level_follow_the_ladder_and_take_medians():
    """Levels in ladder order (1x10 after 1x9, not after 1x1); per-level medians of L and of the k1 sums, the span
    of the medians and of all attempts, counted trajectories."""
    rows = [("1x10", 100, 5.0, 1.0), ("1x1", 20, 0.0, 0.0), ("1x1", 30, 2.0, -1.0), ("1x1", 40, 4.0, 3.0),
            ("1x9", 80, 1.0, 1.0)]
    study = {"trajectories": [{"level": lv, "L": L, "kl": {"attempt": a, "decision": d}} for lv, L, a, d in rows]}
    lengths = report.attempt_lengths({"m": study})
    assert list(lengths.columns) == ["1x1", "1x9", "1x10", "span of medians", "span of all"]
    assert lengths.loc["m"].to_dict() == {"1x1": 30, "1x9": 80, "1x10": 100, "span of medians": 100 / 30,
                                          "span of all": 100 / 20}
    for t, (_, _, a, d) in zip(study["trajectories"], rows):
        t["grad"] = {"kl_k3": {"attempt": a + 1, "decision": d + 1}}
    g = report.grad_by_level(study, "kl_k3")
    assert list(g.index) == ["1x1", "1x9", "1x10"]
    assert g.loc["1x1"].to_dict() == {"L": 30, "|g_attempt|": 3.0, "|g_decision|": 1.0}
    kl = report.kl_by_level(study)
    assert list(kl.index) == ["1x1", "1x9", "1x10"]
    assert kl.loc["1x1"].to_dict() == {"attempt k1": 2.0, "decision k1": 0.0, "trajectories": 3}


def test_plot_slopes_draws_one_interval_per_study_and_term_with_a_slope():
    """One error bar per fitted slope (a term without a slope in a study draws none), one row per study."""
    import matplotlib

    matplotlib.use("Agg")

    def fit(slope):
        return {"slope": slope, "ci": [slope - 0.3, slope + 0.2]} if slope is not None else {"slope": None}

    a = {"fits": {"kl_k3 / decision": fit(1.1), "reward / decision": fit(0.2)}}
    b = {"fits": {"kl_k3 / decision": fit(None), "reward / decision": fit(1.4)}}
    fig = report.plot_slopes({"one": {"a": a}, "two": {"b": b}}, terms=("kl_k3", "reward"))
    bars = [len(ax.containers) for ax in fig.axes]
    assert bars == [1, 2]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["one: a", "two: b"]
    x = fig.axes[1].containers[1].lines[0].get_xdata()
    assert list(x) == [1.4]


def test_seed_estimates_are_each_seeds_overall_block_and_the_deltas_their_differences(results):
    """seed_estimates reads the calibration of a kind per training seed (seeds lacking the kind left out);
    seed_deltas is the per-seed difference of two kinds' estimates."""
    got = report.seed_estimates(results, "sft_reflection")
    assert list(got) == [0, 1]
    assert got[1] is results["calibration"]["sft_reflection-s1"]["all"]["overall"]
    assert list(report.seed_estimates(results, "rl_beta0")) == [0]      # an ablation on seed 0 only
    assert report.seed_estimates(results, "no_such_kind") == {}
    rl, sr = report.seed_estimates(results, "rl"), report.seed_estimates(results, "sft_reflection")
    assert report.seed_deltas(results, "rl", "sft_reflection")["Δp_dW"] == [
        rl[s]["p_d_given_wrong"] - sr[s]["p_d_given_wrong"] for s in (0, 1)]
