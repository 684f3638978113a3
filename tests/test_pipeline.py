"""The pipeline (train -> evaluate -> calibrate into one results folder) and the report tables."""

import json
import math

import pytest

from dsh.core.paper import paper_results
from dsh.experiment import report
from dsh.experiment.report import simulated
from dsh.experiment.run import pipeline, presets, steps
from dsh.measure.calibration import Z95

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)


@pytest.fixture(scope="module")
def small_pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    kw = dict(preset="ci", results_dir=str(root / "results"), runs_dir=str(root / "runs"),
              stages=("base", "sft"), overrides={"max_steps": 2},
              eval_overrides={"levels": ("2x2", "3x3"), "n_per_level": 2, "max_new_tokens": 16, "batch_size": 4},
              progress=False)
    summary = pipeline.run_pipeline(**kw)
    return root, kw, summary


def test_results_folder(small_pipeline):
    root, _, summary = small_pipeline
    res = root / "results"
    assert sorted(p.name for p in (res / "generations").iterdir()) == ["base.jsonl.gz", "sft.jsonl.gz"]
    assert sorted(p.name for p in (root / "runs" / "generations").glob("*.jsonl")) == ["base.jsonl", "sft.jsonl"]
    assert json.loads((res / "summary.json").read_text())["stages"] == ["base", "sft"]
    assert summary["training"]["sft"]["global_step"] == 2
    assert set(summary["accuracy"]["sft"]) == {"2x2", "3x3"}
    assert summary["hardware"]["cpus"] >= 1 and "wall_s" in summary
    loaded = pipeline.load_results(res)
    t = report.table1(loaded)
    assert list(t.index) == ["Base", "SFT (no reflection)"] and list(t.columns) == ["2x2", "3x3"]
    assert report.echo_table(loaded).shape[0] == 2
    verdicts = report.claims(loaded)    # 2 responses per level: nothing can be told (branches: test_claims_*)
    assert [c["verdict"] for c in verdicts] == ["cannot tell"] * 4


def test_finished_stages_are_reused_and_mismatches_refused(small_pipeline):
    root, kw, first = small_pipeline
    mtime = (root / "runs" / "sft" / "final" / "model.safetensors").stat().st_mtime
    again = pipeline.run_pipeline(**kw)
    assert again["training"]["sft"] == json.loads(json.dumps(first["training"]["sft"]))   # its own summary, reused
    assert (root / "runs" / "sft" / "final" / "model.safetensors").stat().st_mtime == mtime
    with pytest.raises(ValueError, match="holds a pipeline run with another overrides; run it with the same options"):
        pipeline.run_pipeline(**{**kw, "overrides": {"max_steps": 3}})     # the folder's claim refuses it


def test_generations_are_kept_for_the_same_weights_and_redone_for_another_model(small_pipeline):
    """The pipeline's working generations file names its model by content: the same weights (touched, or under
    another path) keep it; another model's evaluation into it starts it over."""
    root, kw, _ = small_pipeline
    gen = root / "runs" / "generations" / "sft.jsonl"
    gen.write_text(gen.read_text().replace('"level"', '"stale": true, "level"', 1))
    pipeline.run_pipeline(**kw)          # same model, same settings: the file is kept as it is
    assert '"stale": true' in gen.read_text()
    (root / "runs" / "sft" / "final" / "model.safetensors").touch()    # a new modification time, the same weights
    pipeline.run_pipeline(**kw)
    assert '"stale": true' in gen.read_text()
    settings = presets.get(kw["preset"]).eval_settings(**kw["eval_overrides"])
    recs = steps.evaluate_model("embedded", gen, settings, 0, "sft", steps.Clock(False))   # another model
    assert '"stale": true' not in gen.read_text() and len(recs) == len(gen.read_text().splitlines()) == 4


def test_paper_tables_are_consistent_with_their_own_intervals():
    """The paper's Table 1 as shown: every printed interval is the normal approximation of its printed
    accuracy at n = 100 (to the printed rounding), recomputed here, and the shown cell carries both."""
    t = report.paper_table1()
    printed = paper_results()["table1"]
    for model, row in printed["models"].items():
        for lv, acc, (lo, hi) in zip(printed["levels"], row["accuracy"], row["ci"]):
            p = acc / 100
            half = 100 * Z95 * math.sqrt(p * (1 - p) / 100)
            if acc > 0:
                assert lo == pytest.approx(acc - half, abs=0.06) and hi == pytest.approx(acc + half, abs=0.06), (model, lv)
            assert t.loc[model if model != "RL" else "RL", lv] == f"{acc:.1f} ({lo:.1f}, {hi:.1f})"
    assert list(report.kang_table().columns) == ["llama3_1_8b", "qwen2_5_7b"]


LEVELS = ["3x3", "3x5", "3x7", "3x9"]


def _claims(truth_rl, truth_sr, n=300, **kw):
    res = simulated.synthetic_results({"sft_reflection": dict(zip(LEVELS, truth_sr)), "rl": dict(zip(LEVELS, truth_rl))},
                                      n=n, seed=1, n_bootstrap=50, **kw)
    return {c["claim"].split(" ")[0]: c for c in report.claims(res)}


def test_claims_hold_on_results_built_to_hold():
    """Simulated results on graded levels (p_s 0.31-0.75) in which RL raises p_dW far more than p_s and p_s falls
    with difficulty while p_dW does not: (i), (ii), (iii) hold, level-stratified and at every level."""
    c = _claims([(0.75 - 0.13 * i, 0.9, 0.85) for i in range(4)], [(0.7 - 0.13 * i, 0.9, 0.3) for i in range(4)])
    assert {k: v["verdict"] for k, v in c.items() if k != "(i')"} == {"(i)": "holds", "(ii)": "holds", "(iii)": "holds"}
    assert [r["verdict"] for r in c["(ii)"]["per_level"]] == ["holds"] * 4
    assert [r["verdict"] for r in c["(iii)"]["per_level"]] == ["holds"] * 3
    assert all(r["interval"][0] > 0 for r in c["(ii)"]["per_level"])
    assert c["(ii)"]["stratified"]["levels"] == LEVELS


def test_claims_fail_on_results_built_to_fail():
    """RL raises p_s and leaves p_dW alone, p_dW (not p_s) falls with difficulty: (ii) and (iii) fail,
    level-stratified and at every level (for (iii): at the levels far enough from the easiest to tell)."""
    rl = [(0.75 - 0.05 * i, 0.9, 0.8 - 0.25 * i) for i in range(4)]
    c = _claims(rl, [(0.55 - 0.05 * i, 0.9, 0.8 - 0.25 * i) for i in range(4)], n=500)
    assert c["(ii)"]["verdict"] == "fails" and c["(iii)"]["verdict"] == "fails"
    assert [r["verdict"] for r in c["(ii)"]["per_level"]] == ["fails"] * 4
    assert [r["verdict"] for r in c["(iii)"]["per_level"]][-2:] == ["fails"] * 2
    table = report.per_level_table(list(c.values()))
    assert list(table.columns) == ["claim", "stage", "level", "p_s", "observed", "predicted", "correctness-blind",
                                   "difference", "95% interval", "verdict"]
    assert (table.claim == "(ii)").sum() == 4 and (table.claim == "(iii)").sum() == 3 and (table.claim == "(i)").sum() == 8


def test_bad_pipeline_input(tmp_path):
    with pytest.raises(ValueError, match="^preset must be one of ci, gpu-small, paper"):
        pipeline.run_pipeline("fast", results_dir=str(tmp_path / "r"), runs_dir=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"^stages\[i\] must be one of base, sft"):
        pipeline.run_pipeline("ci", results_dir=str(tmp_path / "r"), runs_dir=str(tmp_path / "x"), stages=("ppo",))
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="^results_dir must be a folder written by dsh pipeline"):
        pipeline.load_results(tmp_path)


def _level(acc, n=100):
    return {"n": n, "observed_accuracy": acc, "ci_low": acc - 0.05, "ci_high": acc + 0.05}


def test_design_checks_on_known_outcomes():
    """Each goal flips when its input does: decaying vs rising Base accuracy, zero-variance groups at GRPO's
    first step above or below one half, RL's interval apart from or overlapping SFT (reflection)'s."""
    levels = [f"3x{n}" for n in range(3, 10)]

    def results(base_acc, zero, rl_pw, rl_ci):
        sr = {"p_s": 0.5, "p_s_ci": [0.45, 0.55], "p_d_given_wrong": 0.2, "p_d_given_wrong_ci": [0.15, 0.25]}
        rl = {"p_s": 0.5, "p_s_ci": [0.45, 0.55], "p_d_given_wrong": rl_pw, "p_d_given_wrong_ci": rl_ci}
        cal = {"base": {"all": {"by_level": {lv: _level(a) for lv, a in zip(levels, base_acc)}}},
               "sft_reflection": {"all": {"overall": sr}, "drop_truncated": None},
               "rl": {"all": {"overall": rl}, "drop_truncated": None}}
        return {"calibration": cal, "summary": {"training": {"rl": {"truncation": {"zero_std_groups_first": zero}}}}}

    good = pipeline.design_checks(results([0.7, 0.5, 0.3, 0.2, 0.1, 0.05, 0.0], 0.3, 0.5, [0.4, 0.6]))["goals"]
    assert all(good.values()), good
    bad = pipeline.design_checks(results([0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.3], 0.9, 0.22, [0.1, 0.3]))["goals"]
    assert not any(bad.values()), bad
    assert pipeline.design_checks(results([0.7] * 7, None, 0.5, [None, None]))["goals"] == {
        "base accuracy non-zero on >= 4 test levels": True, "base accuracy decays with difficulty": False,
        "GRPO zero-variance groups <= 50 % at step 1": None, "RL changes p_dW or p_s measurably": False}


def test_grpo_diagnostics_read_the_logs():
    from dsh.training import train
    logs = [{"loss": 0.1}, {"frac_reward_zero_std": 0.75, "completions/clipped_ratio": 0.5, "reward": 0.1},
            {"frac_reward_zero_std": 0.25, "completions/clipped_ratio": 0.0, "reward": 0.3}]
    d = train.grpo_diagnostics(logs)
    assert d == {"clipped_rate": 0.25, "clipped_rate_first": 0.5, "zero_std_groups_first": 0.75,
                 "zero_std_groups_mean": 0.5, "reward_first": 0.1, "reward_last": 0.3, "steps_logged": 2}
    assert train.grpo_diagnostics([{"loss": 1.0}]) == {}


def test_claims_say_cannot_tell_on_small_differences_and_few_candidates():
    """No verdict from point estimates: RL raising p_dW by 0.02 more than p_s (far inside the noise of 300
    responses a level) gives "cannot tell" pooled and per level, where comparing the point estimates would say
    "holds"; a level whose p_dW rests on fewer than 20 wrong candidates (p_s 0.98) has no verdict."""
    c = _claims([(0.50, 0.9, 0.52)] * 4, [(0.50, 0.9, 0.50)] * 4)
    ii = c["(ii)"]
    assert ii["verdict"] == "cannot tell" and "95 % interval" in ii["evidence"]
    lo, hi = (float(x) for x in ii["evidence"].split("95 % interval [")[1].rstrip("]").split(", "))
    assert lo < 0 < hi
    assert {r["verdict"] for r in ii["per_level"]} == {"cannot tell"}
    c = _claims([(0.98, 0.9, 0.9)] + [(0.5, 0.9, 0.9)] * 3, [(0.98, 0.9, 0.2)] + [(0.5, 0.9, 0.2)] * 3, n=300)
    first = c["(ii)"]["per_level"][0]      # p_s 0.98: a level a decision cannot change, not a finding either way
    assert first["level"] == "3x3" and first["verdict"].startswith("not testable here") and first["difference"] is None
    assert [r["verdict"] for r in c["(ii)"]["per_level"][1:]] == ["holds"] * 3
    assert c["(iii)"]["per_level"][0]["relative_to"] == "3x5"      # 3x3 is not usable: too few wrong candidates
