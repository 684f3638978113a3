"""The graded experiment's design points measured per seed (dsh.experiment.report.regime_rows) on simulated
results whose truth is known: a ladder built to meet every point meets each, and each point fails when only its own
ingredient is broken; the slope of p_s on difficulty (dsh.measure.trend.level_slope) recovers a known slope."""

import copy
import json
import random
from pathlib import Path

import pytest

from dsh.experiment import report
from dsh.measure.trend import level_slope

LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")
FT = ["1x2", "2x1", "1x4", "4x1", "1x6", "6x1", "1x8", "8x1"]


def _calibration(by_level: dict, n: int) -> dict:
    """A calibration record as dsh.measure.stage.calibrate_stage writes it, with the fields the design points read:
    ``by_level[level] = (p_s, accuracy)`` on ``n`` answered responses a level."""
    return {"all": {"by_level": {lv: {"n": n, "no_answer": 0, "p_s": ps, "observed_accuracy": acc}
                                 for lv, (ps, acc) in by_level.items()}}}


def _results(sft_p_s=(0.75, 0.7, 0.6, 0.55, 0.45, 0.35, 0.3), n=200, rise=0.1, zero_first=0.3, rollouts=10_240,
             truncated=0.02, kappa=0.9):
    rng = random.Random(0)
    curve = [{"reward": 0.6 + rise * i / 39 + rng.gauss(0, 0.01),
              "frac_reward_zero_std": zero_first + 0.2 * i / 39 + rng.gauss(0, 0.01)} for i in range(40)]
    cal = {"base": _calibration({lv: (0.4, 0.4) for lv in LEVELS}, n),
           "sft_reflection": _calibration({lv: (p, p + 0.05) for lv, p in zip(LEVELS, sft_p_s)}, n),
           "rl": _calibration({lv: (min(p + 0.1, 0.95),) * 2 for lv, p in zip(LEVELS, sft_p_s)}, n)}
    summary = {"plan": [{"name": "base", "kind": "base", "seed": None},
                        {"name": "sft_reflection", "kind": "sft_reflection", "seed": 0},
                        {"name": "rl", "kind": "rl", "seed": 0}],
               "configs": {"sft_reflection": {"train_levels": FT}, "rl": {"train_levels": FT}},
               "reward_curves": {"rl": curve}, "training": {"rl": {"rollouts": rollouts}},
               # the validation accuracy at step 0 and at the end, 200 questions: rise 0.1 -> 120 to 140 right
               "validation_curves": {"rl": [{"step": st, "n": 200, "observed_accuracy": (120 + round(200 * r)) / 200}
                                            for st, r in ((0, 0.0), (160, rise / 2), (320, rise))]},
               "truncation": {s: {"eval": truncated} for s in cal}}
    probe = {"sft_reflection": {"by_level": {lv: {"checks": 100, "verdict_follows_check": 0.95, "kappa": kappa}
                                             for lv in LEVELS}}}
    return {"summary": summary, "calibration": cal, "probe": probe}


def _met(r):
    (row,) = report.regime_rows(r)
    return row["met"]


def test_a_ladder_built_to_meet_every_point_meets_each():
    met = _met(_results())
    assert met == dict.fromkeys(report.REGIME_POINTS, True), met
    t = report.regime_table(_results())
    assert t.loc[0, "points not met"] == "-" and t.loc[0, "outside fine-tuning"] == 3


@pytest.mark.parametrize("change, point", [
    (dict(sft_p_s=(0.95, 0.9, 0.9, 0.9, 0.5, 0.5, 0.5)), "graded"),            # 3 graded levels
    (dict(sft_p_s=(0.5, 0.55, 0.5, 0.45, 0.5, 0.55, 0.5)), "falling"),      # graded but flat
    (dict(kappa=0.5), "probe"),
    (dict(n=100), "wrong first"),                                            # p_s 0.75 of 100: 25 wrong
    (dict(zero_first=0.6), "mixed"),
    (dict(rise=0.0), "rise"),
    (dict(rollouts=9_000), "rollouts"),
    (dict(truncated=0.06), "truncated"),
])
def test_each_point_fails_when_its_own_ingredient_is_broken(change, point):
    met = _met(_results(**change))
    assert met[point] is False, (point, met)
    assert report.regime_table(_results(**change)).loc[0, "points not met"].count(point) >= 1


def test_a_base_below_five_percent_on_a_level_and_missing_stages_read_as_such():
    r = _results()
    low = copy.deepcopy(r)
    low["calibration"]["base"]["all"]["by_level"]["1x8"]["observed_accuracy"] = 0.03
    assert _met(low)["base"] is False
    r["summary"]["plan"] = r["summary"]["plan"][:2]
    del r["calibration"]["rl"]
    met = _met(r)
    assert met["mixed"] is met["rise"] is met["rollouts"] is None and met["graded"] is True


def test_the_rise_point_is_the_validation_accuracy_s_and_the_reward_s_fifths_only_show():
    """The rise point reads the validation curve (Newcombe's interval of 120 -> 140 of 200 lies above 0, of 120 ->
    130 does not), whatever the reward's fifths say; a run without a validation curve cannot be judged."""
    r = _results(rise=0.0)                      # a flat reward and a flat validation accuracy
    r["summary"]["validation_curves"]["rl"][-1]["observed_accuracy"] = 140 / 200
    (row,) = report.regime_rows(r)
    assert row["met"]["rise"] is True and row["validation accuracy rise (95 %)"].startswith("+0.100 (+0.0")
    assert row["reward, last fifth - first (95 %)"].startswith(("+0.00", "-0.00"))
    r["summary"]["validation_curves"]["rl"][-1]["observed_accuracy"] = 130 / 200
    assert _met(r)["rise"] is False
    del r["summary"]["validation_curves"]
    assert _met(r)["rise"] is None


def test_level_slope_recovers_a_known_slope_and_covers_it():
    rng = random.Random(1)
    covered = 0
    for _ in range(200):
        digits = list(range(2, 9))
        truth = [0.9 - 0.08 * (d - 2) for d in digits]
        obs = [sum(rng.random() < p for _ in range(300)) / 300 for p in truth]
        fit = level_slope(digits, obs, [300] * 7)
        covered += fit["ci"][0] <= -0.08 <= fit["ci"][1]
    assert 180 <= covered <= 198          # a 95 % interval covers the truth about 190 times in 200
    assert level_slope([2, 3], [0.5, 0.4], [10, 10]) is None
    with pytest.raises(ValueError, match="rates\\[i\\]"):
        level_slope([2, 3, 4], [0.5, 1.4, 0.3], [10, 10, 10])
    with pytest.raises(ValueError, match="one value a level"):
        level_slope([2, 3, 4], [0.5, 0.4], [10, 10, 10])
    with pytest.raises(ValueError, match="digits must differ"):
        level_slope([3, 3, 3], [0.5, 0.4, 0.3], [10, 10, 10])


def test_the_first_page_sentence_names_each_point_not_met_with_its_seeds():
    from dsh.experiment.report import findings

    assert findings.regime_sentence(_results()) == f"Design points met on every seed: {len(report.REGIME_POINTS)} " \
                                                   f"of {len(report.REGIME_POINTS)}."
    got = findings.regime_sentence(_results(rollouts=9_000, truncated=0.07))
    assert got.startswith(f"Design points met on every seed: {len(report.REGIME_POINTS) - 2} of")
    assert f"{report.REGIME_POINTS['rollouts']} (seed 0)" in got and report.REGIME_POINTS["truncated"] in got


def test_run_time_sums_the_stages_and_estimates_the_resumed_ones_by_their_methods_median():
    r = _results()
    for x, m in zip(r["summary"]["plan"], (None, "sft_reflection", "grpo")):
        x["method"] = m
    r["summary"]["plan"].append({"name": "rl2", "kind": "rl", "seed": 1, "method": "grpo"})
    r["calibration"]["rl2"] = r["calibration"]["rl"]
    r["summary"]["training"] = {"sft_reflection": {"wall_s": 100.0}, "rl": {"wall_s": 600.0},
                                "rl2": {"wall_s": 30.0, "resumed_from": "rl2/checkpoint-304"}}
    r["summary"]["timings_s"] = {"evaluate_base": 4.0, "evaluate_sft_reflection": 10.0, "evaluate_rl": 0.0,
                                 "evaluate_rl2": 12.0, "probe_sft_reflection": 5.0}
    got = report.run_time(r)
    assert got["estimated"] == ["rl2"] and got["reused"] == ["rl"]
    by = {x["stage"]: x for x in got["stages"]}
    assert by["rl2"]["train_s"] == 600.0 and by["rl"]["evaluate_s"] == 10.0      # median of 4, 10, 12
    assert by["base"]["probe_s"] == 5.0 and "train_s" not in by["base"]
    assert got["total_s"] == 100 + 600 + 600 + (4 + 10 + 10 + 12) + 4 * 5
    assert "studies" not in got
    r["summary"]["timings_s"]["attribution_rl"] = 70.0
    with_studies = report.run_time(r, {"rl": {"wall_s": 70.0}, "base": {"wall_s": 400.0}})
    assert with_studies["studies"] == [{"study": "rl", "wall_s": 70.0, "reused": False},
                                       {"study": "base", "wall_s": 400.0, "reused": True}]
    assert with_studies["studies_s"] == 470.0 and with_studies["pipeline_s"] == got["total_s"] + 470.0
    with pytest.raises(ValueError, match="studies must map"):
        report.run_time(r, {"rl": {"samples": 3}})


def test_route_timing_takes_each_routes_median_and_scales_the_studies_time():
    runs = [{"route": "packed", "wall_s": 90.0}, {"route": "per trajectory", "wall_s": 150.0},
            {"route": "packed", "wall_s": 110.0}]
    got = report.route_timing({"runs": runs}, 600.0)
    assert got["packed_s"] == 100.0 and got["per_trajectory_s"] == 150.0 and got["ratio"] == 1.5
    assert got["studies_s_packed"] == 400.0 and "studies_s_packed" not in report.route_timing({"runs": runs})
    for bad in ({"runs": runs[:1]}, {"runs": []}, {"runs": [{"route": "packed"}]}, None):
        with pytest.raises(ValueError, match="routes must"):
            report.route_timing(bad)


def test_restudy_table_sets_each_study_against_its_committed_record_and_names_a_moved_fit():
    def fit(n, slope, verdict):
        return {"n": n, "slope": slope, "verdict": verdict}

    same = {"trajectories": [10, 10], "same_trajectories": 10, "norm_rel_diff": {"median": 1e-5, "max": 2e-3},
            "fits": {"kl_k3 / decision": fit([200, 200], [1.0, 1.001], ["holds", "holds"]),
                     "sft / stage": fit([5, 5], [None, None], [None, None])}}
    moved = {**same, "same_trajectories": 9,
             "fits": {"kl_k3 / decision": fit([200, 201], [1.0, 0.9], ["holds", "cannot tell"])}}
    rec = {"studies": [{"study": "a", "committed_wall_s": 600.0, "wall_s": 120.0, "rounds": [2, 2],
                        "against_committed": same},
                       {"study": "b", "committed_wall_s": 300.0, "wall_s": 180.0, "rounds": [1, 1],
                        "against_committed": moved}]}
    table, total = report.restudy_table(rec)
    assert list(table["ratio"]) == [5.0, 1.67] and list(table["packed min"]) == [2.0, 3.0]
    assert list(table["fits kept"]) == ["2 of 2", "0 of 1"] and list(table["same trajectories"]) == ["10 of 10", "9 of 10"]
    assert table["max |d slope|"].iloc[0] == pytest.approx(0.001) and table["max |d slope|"].iloc[1] == pytest.approx(0.1)
    assert total["committed_s"] == 900.0 and total["packed_s"] == 300.0 and total["ratio"] == 3.0
    assert total["changed"] == ["b / kl_k3 / decision"] and not total["fits_kept"] and not total["same_trajectories"]
    assert total["max_slope_difference"]["other fits"] == pytest.approx(0.1)
    assert total["max_slope_difference"]["group-summed reward"] is None
    grouped = json.loads(json.dumps(rec))
    grouped["studies"][0]["against_committed"]["fits"]["reward_group / decision"] = fit([40, 40], [3.0, 3.2],
                                                                                        ["cannot tell"] * 2)
    _, g = report.restudy_table(grouped)
    assert g["max_slope_difference"]["group-summed reward"] == pytest.approx(0.2) and g["fits_kept"] is False
    assert g["max_slope_difference"]["other fits"] == pytest.approx(0.1)
    _, whole = report.restudy_table({"studies": rec["studies"][:1]})
    assert whole["fits_kept"] and whole["same_trajectories"] and whole["changed"] == []
    for bad in (None, {}, {"studies": []}, {"studies": [{"study": "a"}]}):
        with pytest.raises(ValueError, match="restudy must"):
            report.restudy_table(bad)


def test_workers_table_sets_the_layouts_side_by_side_per_trial_and_compares_their_weights():
    def run(stage, g, s, u, w):
        return {"stage": stage, "generation_s": g, "scoring_s": s, "update_s": u, "final_weights": w}

    seq = "one after the other, 2 threads"
    par = "side by side, 1 thread each"
    two = [run("a", 10, 4, 9, "x"), run("b", 10, 4, 9, "y")]
    one = [run("a", 16, 8, 18, "p"), run("b", 16, 8, 18, "q")]
    rec = {"trials": [{"trial": 0, "layout": seq, "wall_s": 72.0, "runs": two},
                      {"trial": 0, "layout": par, "wall_s": 60.0, "runs": one},
                      {"trial": 1, "layout": par, "wall_s": 60.0, "runs": one},
                      {"trial": 1, "layout": seq, "wall_s": 66.0, "runs": two}]}
    table, got = report.workers_table(rec)
    assert list(table.generation_s) == [20, 32, 32, 20] and list(table.update_s) == [18, 36, 36, 18]
    assert got["ratios"] == [1.2, 1.1] and got["slowdown"] == {"generation_s": 1.6, "scoring_s": 2.0, "update_s": 2.0}
    assert got["same_weights"] and got["weights_differ"]
    moved = json.loads(json.dumps(rec))
    moved["trials"][2]["runs"][0]["final_weights"] = "x"          # one thread's second trial: other weights
    _, got = report.workers_table(moved)
    assert not got["same_weights"] and got["weights_differ"]
    for bad in (None, {"trials": []}, {"trials": [{"trial": 0}]}, {"trials": rec["trials"][:1]}):
        with pytest.raises(ValueError, match="record must"):
            report.workers_table(bad)


def test_pipeline_workers_table_gives_each_trials_ratio_the_filled_share_and_whose_weights():
    def run(trial, w, wall, steps, weights):
        return {"trial": trial, "workers": w, "threads": 2 // w, "wall_s": wall, "load_before": 0.5,
                "schedule": [{"step": f"s{i}", "start_s": a, "end_s": b, "worker": i % w} for i, (a, b) in enumerate(steps)],
                "final_weights": weights}

    one, two = {"a": "x", "b": "y"}, {"a": "p", "b": "q"}
    rec = {"runs": [run(0, 1, 100.0, [(0, 60), (60, 100)], one), run(0, 2, 80.0, [(0, 80), (0, 40)], two),
                    run(1, 2, 90.0, [(0, 90), (0, 45)], two), run(1, 1, 99.0, [(0, 50), (50, 99)], one)]}
    table, got = report.pipeline_workers_table(rec, committed={"a": "x", "b": "y", "c": "z"})
    assert list(table.filled) == [1.0, 0.75, 0.75, 1.0] and list(table.steps_min) == [round(100 / 60, 2), 2.0, 2.25,
                                                                                      round(99 / 60, 2)]
    assert got["ratios"] == [1.25, 1.1] and got["same_weights"] and got["weights_differ"] and got["committed"]
    assert report.pipeline_workers_table(rec, committed={"a": "x", "b": "other"})[1]["committed"] is False
    assert report.pipeline_workers_table(rec)[1]["committed"] is None
    moved = json.loads(json.dumps(rec))
    moved["runs"][2]["final_weights"] = {"a": "p", "b": "y"}      # two workers' second trial: one stage's weights moved
    got = report.pipeline_workers_table(moved)[1]
    assert not got["same_weights"] and got["weights_differ"]
    moved["runs"][1]["final_weights"] = {"a": "p", "b": "y"}
    moved["runs"][2]["final_weights"] = {"a": "p", "b": "y"}
    assert not report.pipeline_workers_table(moved)[1]["weights_differ"]    # b alike on both layouts
    for bad in (None, {"runs": []}, {"runs": [{"trial": 0}]}, {"runs": rec["runs"][:1]}):
        with pytest.raises(ValueError, match="record must"):
            report.pipeline_workers_table(bad)


def test_the_workers_projection_divides_each_kinds_recorded_time_by_its_gain():
    took = {"stages": [{"stage": "base", "method": None, "evaluate_s": 10.0, "probe_s": 5.0},
                       {"stage": "sft-s0", "method": "sft", "train_s": 60.0, "evaluate_s": 10.0, "probe_s": 5.0},
                       {"stage": "rl-s0", "method": "grpo", "train_s": 300.0, "evaluate_s": 20.0, "probe_s": 10.0}],
            "studies_s": 100.0}
    got = report.workers_projection(took, {"grpo": 1.2, "fine_tuning": 1.5, "studies": 1.25})
    assert got == pytest.approx({"grpo_s": 250.0, "fine_tuning_s": 80.0, "studies_s": 80.0, "pipeline_s": 410.0})
    for bad in ({"grpo": 1.2}, {"grpo": 1.2, "fine_tuning": 0, "studies": 1.0}, None):
        with pytest.raises(ValueError, match="^gains must"):
            report.workers_projection(took, bad)
    with pytest.raises(ValueError, match="^took must"):
        report.workers_projection({"stages": []}, {"grpo": 1.2, "fine_tuning": 1.5, "studies": 1.25})


def test_a_second_reading_is_compared_stage_by_stage_and_a_moved_rate_shows(tmp_path):
    """The design folder's reader (no dsh imports) and the calibration read the same well-formed laptop responses
    alike; a rate moved in one reading shows as its difference."""
    import gzip
    import importlib.util
    import json

    from dsh.measure.stage import calibrate_stage
    from dsh.task import laptop_task as lt

    spec = importlib.util.spec_from_file_location(
        "independent_reader", Path(__file__).resolve().parents[1] / "book/results/laptop-graded/design/"
        "independent_reader.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    rng = random.Random(0)
    recs = []
    for i in range(120):           # reflection traces (wrong attempts resampled) and fallible one-attempt answers
        p = lt.draw("1x3", rng)
        t = lt.trace(p, "reflection", seed=i) if i % 2 else lt.fallible_attempt(p, rng, 0.4)
        recs.append({"question": p.question, "answer": p.answer, "response": t.text, "level": "1x3",
                     "truncated": False})
    cal = {"sft_reflection": calibrate_stage(recs, seed=0, n_bootstrap=20, task="laptop_task")}
    results = {"summary": {"plan": [{"name": "sft_reflection", "kind": "sft_reflection", "seed": 0}]},
               "calibration": cal}
    path = tmp_path / "g.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    other = {"sft_reflection": reader.stage_numbers(path)}
    got = report.reading_agreement(results, other)
    assert got.loc[0, "levels"] == 1 and got.loc[0, "max |F->T difference|"] == 0
    assert all(got.loc[0, f"max |{k} difference|"] <= 0.001 for k in report.READ_AGAIN), got.T
    assert 0 < cal["sft_reflection"]["all"]["by_level"]["1x3"]["p_d_given_wrong"] < 1     # both kinds present
    other["sft_reflection"]["1x3"]["p_dW"] += 0.2
    assert report.reading_agreement(results, other).loc[0, "max |p_dW difference|"] >= 0.2


def test_a_process_names_one_commit_however_the_checkout_moves(monkeypatch):
    # a long run's records all name the code it loaded, not the HEAD of the moment each is written
    import subprocess

    from dsh.core import provenance

    provenance.git_commit.cache_clear()
    first = provenance.git_commit()

    def moved(*a, **k):
        return subprocess.CompletedProcess(a, 0, stdout="f" * 40 + "\n", stderr="")

    monkeypatch.setattr(provenance.subprocess, "run", moved)
    assert provenance.git_commit() == first
    provenance.git_commit.cache_clear()
    assert provenance.git_commit() == "f" * 40          # a new process would see the new HEAD
    provenance.git_commit.cache_clear()
