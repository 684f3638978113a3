"""Calibration estimators checked by simulation against known truth, and the `dsh calibrate` contract."""

import json
import math
import subprocess
import sys

import pytest

import dsh
from dsh.experiment.report import simulated
from dsh.measure import calibration
from dsh.task import synthetic

KEYS = {"n", "observed_accuracy", "ci_low", "ci_high", "p_s", "p_d_given_correct", "p_d_given_wrong",
        "predicted_accuracy", "predicted_ci_low", "predicted_ci_high", "no_answer", "transitions"}


@pytest.mark.slow
@pytest.mark.parametrize("truth", [(0.4, 0.9, 0.7), (0.7, 0.95, 0.3)])
def test_intervals_cover_the_truth(truth):
    p_s, p_dC, p_dW = truth
    acc = dsh.predicted_accuracy(*truth)
    cover = {"p_s": 0, "p_dC": 0, "p_dW": 0, "pred": 0, "wilson": 0, "normal": 0}
    reps = 30
    for r in range(reps):
        recs = synthetic.synthetic_records(*truth, n=300, seed=1000 + r)
        o = calibration.calibrate(recs, n_bootstrap=100, seed=r)["overall"]
        cover["p_s"] += o["p_s_ci"][0] <= p_s <= o["p_s_ci"][1]
        cover["p_dC"] += o["p_d_given_correct_ci"][0] <= p_dC <= o["p_d_given_correct_ci"][1]
        cover["p_dW"] += o["p_d_given_wrong_ci"][0] <= p_dW <= o["p_d_given_wrong_ci"][1]
        cover["pred"] += o["predicted_ci_low"] <= acc <= o["predicted_ci_high"]
        cover["wilson"] += o["wilson_low"] <= acc <= o["wilson_high"]
        cover["normal"] += o["ci_low"] <= acc <= o["ci_high"]
    for k, c in cover.items():
        assert c / reps >= 0.8, (k, c)


@pytest.mark.slow
def test_estimators_recover_the_truth_at_scale():
    """The three estimators against the truth that wrote the responses (p_s from first attempts, p_dC and
    p_dW pooled over candidates). Whether the model *predicts* anything beyond the numbers it was fitted to
    is tested on unfitted statistics in tests/test_predictions.py (predicted = observed accuracy is nearly
    automatic here: every attempt is drawn with the same p_s)."""
    recs = synthetic.synthetic_records(0.3, 0.92, 0.6, n=6000, seed=3)
    o = calibration.calibrate(recs, n_bootstrap=20)["overall"]
    assert abs(o["p_s"] - 0.3) < 0.02 and abs(o["p_d_given_correct"] - 0.92) < 0.02
    assert abs(o["p_d_given_wrong"] - 0.6) < 0.02
    later = calibration.calibrate(synthetic.synthetic_records(0.3, 0.92, 0.6, n=6000, seed=3, p_s_later=0.8),
                                  n_bootstrap=20)["overall"]
    assert abs(later["p_s"] - 0.3) < 0.02                      # p_s is the first attempt's accuracy
    assert later["observed_accuracy"] - later["predicted_accuracy"] > 0.1


def test_transitions_no_answer_and_truncation():
    q = "Calculate 12 * 34. Think step by step."
    recs = [
        {"question": q, "answer": 408, "response": "12 * 34 = 418. Wait. 12 * 34 = 408. The answer is 408."},  # F->T
        {"question": q, "answer": 408, "response": "12 * 34 = 408. Let me recheck. 12 * 34 = 418."},          # T->F
        {"question": q, "answer": "408", "response": "I cannot do this."},                                    # no answer
        {"question": q, "answer": 408, "response": "The answer is 999. Wait.", "truncated": True},
    ]
    o = calibration.calibrate(recs, n_bootstrap=10)["overall"]
    assert o["n"] == 4 and o["no_answer"] == 1 and o["observed_accuracy"] == 0.25
    assert o["transitions"]["F->T"] == 1 and o["transitions"]["T->F"] == 1
    assert o["p_s"] == pytest.approx(1 / 3)        # first candidates: F, T, F
    assert o["p_d_given_correct"] == pytest.approx(1 / 2)   # T's: one RESAMPLE, one STOP
    assert o["p_d_given_wrong"] == pytest.approx(1 / 3)     # F's: RESAMPLE, STOP, STOP
    d = calibration.calibrate(recs, drop_truncated=True, n_bootstrap=10)["overall"]
    assert d["n"] == 3
    assert set(calibration.calibrate(recs, n_bootstrap=0)["by_level"]) == {"2x2"}


def test_intervals_formulas():
    lo, hi = calibration.normal_interval(1, 100)
    assert (round(100 * lo, 1), round(100 * hi, 1)) == (-1.0, 3.0)   # as printed in the paper's Table 1
    lo, hi = calibration.normal_interval(74, 100)
    assert (round(100 * lo, 1), round(100 * hi, 1)) == (65.4, 82.6)
    lo, hi = calibration.wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)


def test_bootstrap_is_seeded():
    recs = synthetic.synthetic_records(0.5, 0.9, 0.5, n=200, seed=0)
    a = calibration.calibrate(recs, seed=1)
    assert a == calibration.calibrate(recs, seed=1)
    assert a != calibration.calibrate(recs, seed=2)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dsh", "calibrate", *args], capture_output=True, text=True)


def test_cli_json_contract(tmp_path):
    recs = synthetic.synthetic_records(0.5, 0.9, 0.6, n=150, level="3x5", seed=2) + \
        synthetic.synthetic_records(0.2, 0.9, 0.6, n=150, level="3x7", seed=3)
    f = tmp_path / "gen.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = run_cli(str(f), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"overall", "by_level"}
    assert set(out["by_level"]) == {"3x5", "3x7"}
    for block in [out["overall"], *out["by_level"].values()]:
        assert KEYS <= set(block)
    assert out["by_level"]["3x5"]["n"] == 150
    table = run_cli(str(f))
    assert table.returncode == 0 and "3x7" in table.stdout and "{" not in table.stdout


@pytest.mark.parametrize("content,msg", [
    ('{"question": "Calculate 1 * 2.", "answer": 2, "response": "x"}\nnot json\n', "line 2: not valid JSON"),
    ('{"question": "Calculate 1 * 2.", "answer": 2}\n', "line 1: missing field 'response'"),
    ('{"answer": 2, "response": "x"}\n', "line 1: missing field 'question'"),
    ('{"question": "q", "answer": "two", "response": "x"}\n', "line 1: field 'answer' must be an integer"),
    ('{"question": "q", "answer": 2, "response": "x", "truncated": "yes"}\n', "line 1: field 'truncated'"),
    ("", "no records"),
    ("\n\n", "no records"),
])
def test_cli_errors_are_one_line(tmp_path, content, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    r = run_cli(str(f), "--json")
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_cli_missing_file(tmp_path):
    r = run_cli(str(tmp_path / "nope.jsonl"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_nan_free_json_when_a_branch_is_empty():
    q = "Calculate 12 * 34. Think step by step."
    recs = [{"question": q, "answer": 408, "response": "The answer is 408."}] * 3
    o = calibration.calibrate(recs, n_bootstrap=5)["overall"]
    assert o["p_d_given_wrong"] is None and o["predicted_accuracy"] == 1.0
    json.dumps(o, allow_nan=False)
    assert not any(isinstance(x, float) and math.isnan(x) for x in o.values())


@pytest.mark.slow
def test_synthetic_results_recover_their_truth_and_draw():
    import matplotlib

    matplotlib.use("Agg")
    from dsh.experiment import report
    known = {"rl": {"3x3": (0.8, 0.9, 0.6), "3x7": (0.2, 0.9, 0.6)}, "sft_reflection": {"3x3": (0.5, 0.7, 0.2)}}
    res = simulated.synthetic_results(known, n=3000, seed=1, n_bootstrap=0)
    for stage, by_level in known.items():
        for level, (p_s, p_dc, p_dw) in by_level.items():
            got = res["calibration"][stage]["all"]["by_level"][level]
            assert abs(got["p_s"] - p_s) < 0.04 and abs(got["p_d_given_wrong"] - p_dw) < 0.04, (stage, level)
            assert abs(got["p_d_given_correct"] - p_dc) < 0.05, (stage, level)
    assert len(report.plot_calibration(res).axes) == 2
    with pytest.raises(ValueError, match="^stage must be one of"):
        simulated.synthetic_results({"ppo": {"3x3": (0.5, 0.5, 0.5)}})


def test_several_samples_a_question_get_intervals_that_cover_the_truth_and_one_sample_is_unchanged():
    """Questions that differ (Beta rates, intra-question correlation 0.5) answered 4 times each: intervals that take
    the 400 responses as independent cover the truth ~80 % of the time; grouped by question (cluster bootstrap for
    p_s, clustered normal interval for the accuracy) they keep ~95 %. With one sample a question both readings are
    the same numbers."""
    from dsh.measure.known_truth import clustered_coverage

    got = clustered_coverage(0.7, 1.0, questions=100, samples=4, replications=300, seed=0)
    for what in ("accuracy", "p_s"):
        assert 0.92 <= got[f"{what}, by question"] <= 0.98, got
        assert got[f"{what}, as independent"] < 0.87, got
    one = clustered_coverage(0.7, 1.0, questions=100, samples=1, replications=20, seed=1)
    assert one["accuracy, by question"] == one["accuracy, as independent"]
    assert one["p_s, by question"] == one["p_s, as independent"]
    assert calibration.design_effect([1, 1, 0, 0], [1, 1, 1, 1], ["a", "b", "c", "d"]) == pytest.approx(1.0)
    assert calibration.design_effect([1, 1, 0, 0], [1, 1, 1, 1], ["a", "a", "b", "b"]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="^questions must be"):
        clustered_coverage(0.7, 1.0, questions=0, samples=2, replications=2)


def test_a_stage_without_truncated_responses_reports_the_same_calibration_twice_and_one_with_them_drops_them():
    from dsh.measure.calibration import calibrate
    from dsh.measure.stage import calibrate_stage
    from dsh.task.synthetic import synthetic_records

    recs = synthetic_records(0.6, 0.9, 0.5, n=120, level="1x3", seed=3)
    assert not any(r["truncated"] for r in recs)
    got = calibrate_stage(recs, n_bootstrap=20)
    assert got["drop_truncated"] == calibrate(recs, drop_truncated=True, n_bootstrap=20) == got["all"]
    assert got["drop_truncated"] is not got["all"]          # two blocks: a reader may change one
    cut = [dict(r, truncated=True) if i % 4 == 0 else r for i, r in enumerate(recs)]
    got = calibrate_stage(cut, n_bootstrap=20)
    assert got["drop_truncated"] == calibrate([r for r in cut if not r["truncated"]], n_bootstrap=20)
    assert got["drop_truncated"]["overall"]["n"] == 90
    assert got["all"]["overall"]["n"] == 120 and got["truncated"] == 0.25
    assert calibrate_stage([dict(r, truncated=True) for r in recs], n_bootstrap=20)["drop_truncated"] is None
