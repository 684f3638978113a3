"""A bad-input campaign, kept as tests: every case gets exit code 2 (CLI) or a ValueError (API) with one line that
names the argument and what is valid, before any heavy work; no traceback; the inputs are left as they were and
nothing half-written appears."""

import dataclasses
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dsh.__main__ import main
from dsh.experiment import report
from dsh.experiment.run import attribution_study, evaluate, pipeline, presets, steps
from dsh.measure import calibration, claims, faithfulness, length_law, stage, trend
from dsh.task import parse, problems, traces
from dsh.theory import two_stage
from dsh.training import run_dir, train_config
from dsh.training import train as train_module

ROOT = Path(__file__).resolve().parent.parent
GOOD = {"question": "Calculate 12 * 34. Think step by step.", "answer": 408, "response": "The answer is 408."}


def _line(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


# files a case may need, written into its own folder
FILES = {
    "empty.jsonl": b"",
    "nested.jsonl": b"[" * 5000 + b"]" * 5000 + b"\n",
    "binary.jsonl": bytes(range(256)) * 4,
    "truncated.jsonl": _line(GOOD) + _line(GOOD)[:30],
    "latin1.jsonl": _line(GOOD) + json.dumps({**GOOD, "response": "x"}).replace('"x"', '"caf\xe9"').encode("latin-1") + b"\n",
    "float_answer.jsonl": _line({**GOOD, "answer": 408.0}),
    "word_answer.jsonl": _line({**GOOD, "answer": "four hundred"}),
    "no_response.jsonl": _line({k: v for k, v in GOOD.items() if k != "response"}),
    "no_question.jsonl": _line({k: v for k, v in GOOD.items() if k != "question"}),
    "list_record.jsonl": b"[1, 2, 3]\n",
    "truncated_flag.jsonl": _line({**GOOD, "truncated": "yes"}),
    "level_int.jsonl": _line({**GOOD, "level": 35}),
    "response_int.jsonl": _line({**GOOD, "response": 408}),
    "good.jsonl": _line(GOOD),
    "a_file": b"not a folder\n",
    "config_only/config.json": b"{}",
    "pickled/config.json": b"{}",
    "pickled/pytorch_model.bin": b"\x80\x04pickle",
    "fake_model/config.json": b"{}",
    "fake_model/model.safetensors": b"weights that must not be touched",
}

# (id, argv with {tmp} for the case's folder, expected fragment of the one-line message)
CLI_CASES = [
    ("accuracy-nan", ["accuracy", "--p-s", "nan", "--p-dc", "0.9", "--p-dw", "0.5"], "p_s must be a probability in [0, 1]"),
    ("accuracy-inf", ["accuracy", "--p-s", "0.5", "--p-dc", "inf", "--p-dw", "0.5"], "p_dC must be a probability in [0, 1]"),
    ("accuracy-negative", ["accuracy", "--p-s", "0.5", "--p-dc", "0.9", "--p-dw", "-0.1"], "p_dW must be a probability"),
    ("accuracy-above-one", ["accuracy", "--p-s", "1.5", "--p-dc", "0.9", "--p-dw", "0.5"], "p_s must be a probability"),
    ("accuracy-not-a-number", ["accuracy", "--p-s", "half", "--p-dc", "0.9", "--p-dw", "0.5"], "--p-s: invalid float value"),
    ("accuracy-missing", ["accuracy", "--p-s", "0.5"], "the following arguments are required: --p-dc, --p-dw"),
    ("simulate-n-zero", ["simulate", "--p-s", ".5", "--p-dc", ".9", "--p-dw", ".5", "--n", "0"], "n must be an integer >= 1"),
    ("simulate-seed-negative", ["simulate", "--p-s", ".5", "--p-dc", ".9", "--p-dw", ".5", "--seed", "-1"], "seed must be an integer >= 0"),
    ("simulate-n-float", ["simulate", "--p-s", ".5", "--p-dc", ".9", "--p-dw", ".5", "--n", "1e3"], "--n: invalid int value"),
    ("unknown-command", ["fly"], "invalid choice: 'fly'"),
    ("data-style", ["data", "--out", "{tmp}/d", "--style", "fancy"], "style must be one of no_reflection, reflection"),
    ("data-granularity", ["data", "--out", "{tmp}/d", "--granularity", "huge"], "granularity must be one of compact, digit, lean"),
    ("data-retry-fraction", ["data", "--out", "{tmp}/d", "--retry-fraction", "2"], "retry_fraction must be a probability"),
    ("data-max-attempts", ["data", "--out", "{tmp}/d", "--max-attempts", "0"], "max_attempts must be an integer >= 1"),
    ("data-n-train", ["data", "--out", "{tmp}/d", "--n-train", "-1"], "n_train must be an integer >= 0"),
    ("data-out-is-a-file", ["data", "--out", "{tmp}/a_file"], "out must be a folder path"),
    ("data-out-under-a-file", ["data", "--out", "{tmp}/a_file/d"], "out cannot be written"),
    ("calibrate-missing", ["calibrate", "{tmp}/nothing.jsonl"], "FILE must be an existing JSON-lines file"),
    ("calibrate-folder", ["calibrate", "{tmp}/config_only"], "FILE must be a JSON-lines file"),
    ("calibrate-empty", ["calibrate", "{tmp}/empty.jsonl"], "no records"),
    ("calibrate-binary", ["calibrate", "{tmp}/binary.jsonl"], "line 1: not valid JSON"),
    ("calibrate-truncated-last-line", ["calibrate", "{tmp}/truncated.jsonl"], "line 2: not valid JSON"),
    ("calibrate-not-utf8", ["calibrate", "{tmp}/latin1.jsonl"], "line 2: not UTF-8 text"),
    ("calibrate-huge-line", ["calibrate", "{tmp}/huge.jsonl"], "line 1: longer than 16 MB"),
    ("calibrate-float-answer", ["calibrate", "{tmp}/float_answer.jsonl"], "field 'answer' must be an integer"),
    ("calibrate-word-answer", ["calibrate", "{tmp}/word_answer.jsonl"], "field 'answer' must be an integer"),
    ("calibrate-missing-response", ["calibrate", "{tmp}/no_response.jsonl"], "missing field 'response'"),
    ("calibrate-missing-question", ["calibrate", "{tmp}/no_question.jsonl"], "missing field 'question'"),
    ("calibrate-not-an-object", ["calibrate", "{tmp}/list_record.jsonl"], "must be a JSON object"),
    ("calibrate-truncated-flag", ["calibrate", "{tmp}/truncated_flag.jsonl"], "field 'truncated' must be true or false"),
    ("calibrate-level-type", ["calibrate", "{tmp}/level_int.jsonl"], "field 'level' must be a string"),
    ("calibrate-response-type", ["calibrate", "{tmp}/response_int.jsonl"], "field 'response' must be a string"),
    ("calibrate-bad-marker-pattern", ["calibrate", "{tmp}/good.jsonl", "--marker-pattern", "let me ("], "--marker-pattern must be a regular expression"),
    ("calibrate-bootstrap", ["calibrate", "{tmp}/good.jsonl", "--bootstrap", "-1"], "n_bootstrap must be an integer >= 0"),
    ("calibrate-deeply-nested", ["calibrate", "{tmp}/nested.jsonl"], "line 1: nested too deeply to be a record"),
    ("evaluate-n", ["evaluate", "--n", "0", "--out", "{tmp}/g.jsonl"], "n_per_level must be an integer >= 1"),
    ("evaluate-level", ["evaluate", "--levels", "three", "--out", "{tmp}/g.jsonl"], "level must look like '3x5'"),
    ("evaluate-backend", ["evaluate", "--backend", "tgi", "--out", "{tmp}/g.jsonl"], "backend must be one of auto, dsh, hf, vllm"),
    ("evaluate-kv-cache", ["evaluate", "--kv-cache", "bf16", "--out", "{tmp}/g.jsonl"], "kv_cache must be one of float32, float16"),
    ("evaluate-temperature", ["evaluate", "--temperature", "-1", "--out", "{tmp}/g.jsonl"], "temperature must be a number >= 0"),
    ("evaluate-max-new-tokens", ["evaluate", "--max-new-tokens", "0", "--out", "{tmp}/g.jsonl"], "max_new_tokens must be an integer >= 1"),
    ("evaluate-batch-size", ["evaluate", "--batch-size", "0", "--out", "{tmp}/g.jsonl"], "batch_size must be an integer >= 1"),
    ("evaluate-no-model", ["evaluate", "--model", "{tmp}/nothing", "--out", "{tmp}/g.jsonl"], "does not exist"),
    ("evaluate-model-without-weights", ["evaluate", "--model", "{tmp}/config_only", "--out", "{tmp}/g.jsonl"], "is not a model folder"),
    ("evaluate-pickled-model", ["evaluate", "--model", "{tmp}/pickled", "--out", "{tmp}/g.jsonl"], "safetensors only"),
    ("evaluate-out-is-a-folder", ["evaluate", "--out", "{tmp}/config_only"], "out must be a file path"),
    # a bad out is said before the model is looked for (a hub name would be fetched first otherwise)
    ("evaluate-out-first", ["evaluate", "--model", "{tmp}/nothing", "--out", "{tmp}/config_only"], "out must be a file path"),
    ("evaluate-out-under-a-file", ["evaluate", "--out", "{tmp}/a_file/g.jsonl"], "out cannot be written"),
    ("evaluate-out-is-the-input", ["evaluate", "--out", "{tmp}/a_file"], "holds data dsh evaluate did not write"),
    ("evaluate-out-inside-the-model", ["evaluate", "--model", "{tmp}/fake_model", "--out", "{tmp}/fake_model/model.safetensors"], "out must lie outside the model folder"),
    ("train-method", ["train", "--method", "ppo", "--dry-run"], "method must be one of sft, sft_reflection, dft, grpo"),
    ("train-preset", ["train", "--method", "sft", "--preset", "fast", "--dry-run"], "preset must be one of ci, gpu-small, paper"),
    ("train-unknown-field", ["train", "--method", "sft", "--set", "lr=1e-3", "--dry-run"], "unknown field(s) lr; valid fields"),
    ("train-set-wrong-type", ["train", "--method", "sft", "--set", "learning_rate=fast", "--dry-run"], "learning_rate must be"),
    ("train-set-float-steps", ["train", "--method", "sft", "--set", "max_steps=1.5", "--dry-run"], "max_steps must be an integer; got '1.5'"),
    ("train-set-not-key-value", ["train", "--method", "sft", "--set", "max_steps", "--dry-run"], "--set must look like key=value"),
    ("train-pickled-model", ["train", "--method", "sft", "--model", "{tmp}/pickled", "--output-dir", "{tmp}/run"], "safetensors only"),
    ("pipeline-preset", ["pipeline", "--preset", "fast", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "preset must be one of ci, gpu-small, paper"),
    ("pipeline-stage", ["pipeline", "--stages", "base,xyz", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "stages[i] must be one of base"),
    ("pipeline-eval-field", ["pipeline", "--eval-set", "max_tokens=3", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "unknown evaluation field(s) max_tokens"),
    ("pipeline-same-dirs", ["pipeline", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/r"], "results_dir must differ from runs_dir"),
    ("pipeline-laptop-seeds", ["pipeline", "--preset", "laptop", "--seeds", "0,-1", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "seeds must be a list of integers >= 0"),
    ("pipeline-laptop-seeds-text", ["pipeline", "--preset", "laptop", "--seeds", "all", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "seeds must be comma-separated integers"),
    ("pipeline-laptop-ablation-seeds", ["pipeline", "--preset", "laptop", "--seeds", "1", "--ablation-seeds", "0", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "ablation_seeds must be a subset of seeds [1]"),
    ("pipeline-empty-stages", ["pipeline", "--preset", "laptop", "--stages", " , ", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "stages must name at least one stage"),
    ("pipeline-laptop-loss-option", ["pipeline", "--preset", "laptop", "--set", 'task_options={"loss": "some"}', "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "task_options['loss'] must be one of all, no_wrong_attempts"),
    ("pipeline-laptop-stage", ["pipeline", "--preset", "laptop", "--stages", "rl-s9", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "stages[i] must be one of base, sft-s0"),
    ("pipeline-laptop-task-option", ["pipeline", "--preset", "laptop", "--set", 'task_options={"attempts": "mine"}', "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "task_options['attempts'] must be one of own, injected"),
    ("pipeline-laptop-seed-override", ["pipeline", "--preset", "laptop", "--set", "seed=1", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "overrides must not set seed in a seeded plan"),
    ("pipeline-laptop-model", ["pipeline", "--preset", "laptop", "--model", "{tmp}/pickled", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "safetensors only"),
    ("pipeline-ci-ablation-seeds", ["pipeline", "--preset", "ci", "--ablation-seeds", "0", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "ablation_seeds needs seeds"),
    ("simulate-huge-n", ["simulate", "--p-s", ".5", "--p-dc", ".9", "--p-dw", ".5", "--n", "100000000000"], "n must be an integer in 1..10,000,000"),
    ("calibrate-huge-bootstrap", ["calibrate", "{tmp}/good.jsonl", "--bootstrap", "1000000000000"], "n_bootstrap must be an integer in 0..100,000"),
    ("evaluate-huge-n", ["evaluate", "--n", "100000000", "--out", "{tmp}/g.jsonl"], "n_per_level must be an integer in 1..1,000,000"),
    ("evaluate-huge-max-new-tokens", ["evaluate", "--max-new-tokens", "100000000", "--out", "{tmp}/g.jsonl"], "max_new_tokens must be an integer in 1..1,048,576"),
    ("evaluate-max-new-tokens-beyond-context", ["evaluate", "--max-new-tokens", "100000", "--out", "{tmp}/g.jsonl"], "max_new_tokens must be at most the model's context of 8,192 tokens"),
    ("data-huge-n-train", ["data", "--out", "{tmp}/d", "--n-train", "1000000000000"], "n_train must be an integer in 0..1,000,000"),
    ("pipeline-eval-n-zero", ["pipeline", "--eval-set", "n_per_level=0", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/w"], "n_per_level must be an integer >= 1"),
    ("evaluate-duplicate-levels", ["evaluate", "--levels", "1x1,1x1", "--out", "{tmp}/g.jsonl"], "levels must name each level once"),
    ("base-no-examples", ["base", "--out", "{tmp}/b", "--n-examples", "0"], "n_examples must be an integer >= 1"),
    ("base-huge-examples", ["base", "--out", "{tmp}/b", "--n-examples", "1000000000"], "n_examples must be an integer in 1..5,000,000"),
    ("base-huge-tokens", ["base", "--out", "{tmp}/b", "--tokens", "1000000000000000"], "tokens must be an integer in 1..2,000,000,000"),
    ("bench-size", ["bench", "--size", "huge"], "size must be one of auto, cpu, gpu"),
    ("bench-parts", ["bench", "--parts", "generation,flying"], "parts[i] must be one of generation, sft, grpo"),
    ("bench-out-is-a-folder", ["bench", "--size", "laptop", "--parts", "tiny", "--out", "{tmp}/config_only"], "out must be a file path"),
    ("train-output-dir-under-a-file", ["train", "--method", "sft", "--output-dir", "{tmp}/a_file/run"], "output_dir cannot be written"),
    ("pipeline-results-dir-under-a-file", ["pipeline", "--results-dir", "{tmp}/a_file/r", "--runs-dir", "{tmp}/w"], "results_dir cannot be written"),
    ("pipeline-runs-dir-under-a-file", ["pipeline", "--results-dir", "{tmp}/r", "--runs-dir", "{tmp}/a_file/w"], "runs_dir cannot be written"),
    ("probe-out-under-a-file", ["probe", "--model", "{tmp}/fake_model", "--out", "{tmp}/a_file/p.json"], "out cannot be written"),
    ("bench-out-a-users-file", ["bench", "--size", "laptop", "--parts", "tiny", "--out", "{tmp}/good.jsonl"], "good.jsonl exists and is not a dsh bench result"),
    ("bench-out-under-a-file", ["bench", "--size", "laptop", "--parts", "tiny", "--out", "{tmp}/a_file/bench.json"], "out cannot be written"),
]


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def case_dir(tmp_path):
    for name, data in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("argv,fragment", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case_dir, capsys, argv, fragment):
    if "{tmp}/huge.jsonl" in argv:   # a 50 MB line
        (case_dir / "huge.jsonl").write_bytes(_line({**GOOD, "response": "x" * (50 * 2 ** 20)}))
    before = _snapshot(case_dir)
    try:
        rc = main([a.replace("{tmp}", str(case_dir)) for a in argv])
    except SystemExit as e:          # argparse
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]
    assert _snapshot(case_dir) == before           # inputs untouched, nothing written (not even half)


def test_there_are_at_least_40_cases():
    assert len(CLI_CASES) + len(API_CASES) >= 40 and len({c[0] for c in CLI_CASES}) == len(CLI_CASES)


def test_the_real_cli_prints_one_line_and_no_traceback(tmp_path):
    (tmp_path / "x.jsonl").write_bytes(bytes(range(256)))
    for argv in (["calibrate", str(tmp_path / "x.jsonl")], ["accuracy", "--p-s", "nan", "--p-dc", "1", "--p-dw", "0"]):
        r = subprocess.run([sys.executable, "-m", "dsh", *argv], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


_KEYS = pd.MultiIndex.from_tuples([("kl_k3", "decision")], names=["term", "against"])
_REPRO = pd.DataFrame({"low (t0)": [0.5], "high (t0)": [1.5], "low (t1)": [0.6], "high (t1)": [1.6],
                       "reproduced": [True], "chance": [0.83]}, index=_KEYS)
_CORR = pd.DataFrame([[1.0]], index=_KEYS, columns=_KEYS)

API_CASES = [
    ("predicted_accuracy-nan", lambda: two_stage.predicted_accuracy(math.nan, 0.5, 0.5), "p_s must be a probability"),
    ("predicted_accuracy-str", lambda: two_stage.predicted_accuracy("0.5", 0.5, 0.5), "p_s must be a probability"),
    ("simulate-bool-n", lambda: two_stage.simulate(0.5, 0.5, 0.5, n=True), "n must be an integer"),
    ("calibrate-empty", lambda: calibration.calibrate([]), "no records"),
    ("calibrate-not-dicts", lambda: calibration.calibrate(["x"]), "must be a JSON object"),
    ("parse_level", lambda: problems.parse_level("0x3"), "level must look like '3x5'"),
    ("make_splits-n_test", lambda: problems.make_splits(n_test=-1), "n_test must be an integer >= 0"),
    ("TraceConfig-granularity", lambda: traces.TraceConfig(granularity="huge"), "granularity must be one of"),
    ("TraceConfig-checks", lambda: traces.TraceConfig(checks=("threes",)), "checks must be a non-empty subset"),
    ("make_trace-not-a-problem", lambda: traces.make_trace((12, 34)), "problem must be a dsh.task.problems.Problem"),
    ("presets-get", lambda: presets.get("fast"), "preset must be one of ci, gpu-small, paper"),
    ("eval_settings-field", lambda: presets.CI.eval_settings(tokens=3), "unknown evaluation field(s) tokens"),
    ("resolve-field", lambda: presets.resolve("sft", "ci", lr=1), "unknown field(s) lr"),
    ("evaluate-levels-blank", lambda: evaluate.evaluate(settings=evaluate.EvalSettings(levels=" ")), "levels must be a non-empty list"),
    ("evaluate-levels-empty", lambda: evaluate.evaluate(settings=evaluate.EvalSettings(levels=[])), "levels must be a non-empty list"),
    # the attribution studies' tables and figures (dsh.experiment.report) and their round counts
    ("reproduction-not-a-study", lambda: report.reproduction(1, {"fits": {}}), "first must be a study record"),
    ("reproduction-no-fits", lambda: report.reproduction({"fits": {}}, {}), "second must be a study record"),
    ("attribution_table-not-a-dict", lambda: report.attribution_table(3), "studies must map study names"),
    ("compare_fits-list", lambda: report.compare_fits([], {}), "first must map study names"),
    ("attempt_lengths-no-trajectories", lambda: report.attempt_lengths({"a": {"fits": {}}}), "studies['a'] must be a study record (attribution_study.run_study) holding trajectories"),
    ("kl_profile-width", lambda: report.kl_profile({"kl_positions": {"sum": [], "n": []}}, width=0), "width must be an integer >= 1"),
    ("kl_by_level-not-a-study", lambda: report.kl_by_level([]), "study must be a study record"),
    ("grad_by_level-term", lambda: report.grad_by_level({"trajectories": [{"level": "1x2", "L": 9, "grad": {"reward": {}}}]}, "kl_k3"), "term must be one of reward"),
    ("plot_slopes-empty", lambda: report.plot_slopes({}), "groups must map group labels"),
    ("counts_after-not-a-study", lambda: attribution_study.counts_after({}, 1), "study must be a study record"),
    ("headline-not-results", lambda: report.headline(3), "results must be a results folder loaded by dsh.experiment.run.pipeline.load_results"),
    ("long_table-not-results", lambda: report.long_table({"summary": {}}), "results must be a results folder"),
    ("claims_table-not-verdicts", lambda: report.claims_table([{"claim": "x"}]), "verdicts must be the list claims() returns"),
    ("load_attribution-missing", lambda: report.load_attribution("/nonexistent/results"), "results_dir must be an existing folder"),
    ("load_dynamics-missing", lambda: report.load_dynamics("/nonexistent/results"), "results_dir must be an existing folder"),
    ("dynamics_table-betas", lambda: report.dynamics_table({"a": {"arm": "rl", "step": 0, "trajectories": [], "fits": {}}}, {}), "betas must give every arm's KL coefficient; missing rl"),
    ("slope_verdict-ci", lambda: length_law.slope_verdict(0.5, 1.0), "ci must be an interval [low, high]"),
    ("questions-rounds", lambda: attribution_study.questions(attribution_study.StudySettings(), 0), "rounds must be an integer >= 1"),
    ("enough-min_signal", lambda: attribution_study.enough([], ("reward",), -1), "min_signal must be an integer >= 0"),
    ("fit_counts-rows", lambda: attribution_study.fit_counts([{"L": 3}], ("reward",)), "rows must be a study's trajectory rows"),
    ("resume_point-previous", lambda: attribution_study.resume_point(None, attribution_study.StudySettings(), ("reward",), ("a", "b")), "previous must be a study record"),
    ("load_results-not-a-path", lambda: pipeline.load_results(None), "results_dir must be a folder written by dsh pipeline"),
    ("read_records-not-a-path", lambda: calibration.read_records(3), "FILE must be a JSON-lines file path"),
    ("calibrate-not-a-list", lambda: calibration.calibrate(None), "records must be a list of records"),
    ("calibrate-a-string", lambda: calibration.calibrate("generations.jsonl"), "records must be a list of records"),
    ("question_repeats-not-a-path", lambda: report.question_repeats(3), "results_dir must be a results folder path"),
    ("reproduction_count-not-tables", lambda: report.reproduction_count(None), "tables must be a non-empty list"),
    ("fifths_contrast-not-a-list", lambda: trend.fifths_contrast(None), "values must be a list of numbers"),
    ("stage_label-not-a-kind", lambda: presets.stage_label(3), "kind must be a stage kind"),
    ("to_trl_config-not-a-config", lambda: train_config.to_trl_config({"method": "sft"}), "cfg must be a dsh.training.train_config.TrainConfig"),
    ("build_dataset-not-a-config", lambda: train_module.build_dataset(None), "cfg must be a dsh.training.train_config.TrainConfig"),
    ("check_run_dir-not-a-config", lambda: run_dir.check_run_dir("runs/x"), "cfg must be a dsh.training.train_config.TrainConfig"),
    ("verdicts-not-a-dict", lambda: claims.verdicts([]), "cal must map stage kinds to their calibration"),
    ("calibrate_stage-a-path", lambda: stage.calibrate_stage("generations.jsonl"), "records must be a list of records"),
    ("faithfulness-summarize-not-records", lambda: faithfulness.summarize([3]), "records must be a list of records"),
    ("response_stats-none", lambda: calibration.response_stats(None), "records must be a list of records"),
    ("calibration-summarize-not-stats", lambda: calibration.summarize({}), "s must be the ResponseStats of response_stats()"),
    ("reproduction_count-draws", lambda: report.reproduction_count([_REPRO], [_CORR], draws=0), "draws must be an integer >= 1"),
]


@pytest.mark.parametrize("call,fragment", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_api_bad_input(call, fragment):
    with pytest.raises(ValueError) as e:
        call()
    assert "\n" not in str(e.value) and fragment in str(e.value), str(e.value)


def test_lenient_inputs_are_read_as_clean_ones(tmp_path):
    """A byte-order mark, CRLF line ends, answers "1,234", " 408 " or "408" and extra fields are not errors."""
    clean = calibration.calibrate([GOOD], n_bootstrap=0)
    variants = {"bom.jsonl": b"\xef\xbb\xbf" + _line(GOOD), "crlf.jsonl": _line(GOOD).replace(b"\n", b"\r\n"),
                "spaced.jsonl": _line({**GOOD, "answer": " 408 "}), "string.jsonl": _line({**GOOD, "answer": "408"}),
                "extra.jsonl": _line({**GOOD, "model": "x", "temperature": 1.0})}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        assert calibration.calibrate(calibration.read_records(tmp_path / name), n_bootstrap=0) == clean, name
    sep = {**GOOD, "question": "Calculate 1 * 1234.", "answer": "1,234", "response": "The answer is 1234."}
    assert calibration.calibrate([sep], n_bootstrap=0)["overall"]["observed_accuracy"] == 1.0
    assert parse.is_correct("The answer is 1 234.", "1234") is False   # a plain space is not a separator


def test_a_second_evaluate_on_the_same_out_is_refused(tmp_path):
    """While one dsh evaluate holds an output file, another one with the same --out exits 2 and writes nothing."""
    out = tmp_path / "g.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, signal, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); signal.pause()"), str(tmp_path / ".g.jsonl.lock")], stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match="^out .* is being written by another dsh evaluate"):
            evaluate.evaluate(out=str(out), settings=evaluate.EvalSettings(levels=["1x1"], n_per_level=1, max_new_tokens=4),
                              progress=False)
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def _copy_base(tmp_path):
    import shutil

    from dsh.training.laptop_base import SHIPPED_BASE

    d = tmp_path / "model"
    shutil.copytree(SHIPPED_BASE, d)
    return d


@pytest.mark.slow
def test_a_model_whose_weights_do_not_cover_its_parameters_is_refused(tmp_path):
    """A valid but empty safetensors file: transformers would initialise every tensor at random; dsh refuses it in one
    line naming the missing tensors, before generating or training anything (evaluate writes no output)."""
    import struct

    from dsh.experiment.run import evaluate as E

    d = _copy_base(tmp_path)
    hdr = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr)
    out = tmp_path / "g.jsonl"
    with pytest.raises(ValueError, match=r"^model .*: its weights do not match its parameters: \d+ missing \(e.g. ") as e:
        E.evaluate(str(d), str(out), E.EvalSettings(levels=["1x2"], n_per_level=1, max_new_tokens=8), progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    from dsh.experiment.run import presets
    from dsh.training import train

    cfg = presets.LAPTOP.train_config("sft", model=str(d), output_dir=str(tmp_path / "run"), max_steps=1, n_train=4)
    with pytest.raises(ValueError, match=r"^model .*: its weights do not match its parameters"):
        train.train(cfg)
    assert not (tmp_path / "run").exists()          # no half-made run folder


@pytest.mark.slow
def test_a_truncated_weights_file_is_one_line(tmp_path):
    from dsh.llm import models

    d = _copy_base(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) // 3])
    with pytest.raises(ValueError, match=r"^model .*: its weights cannot be read \(.*\); the folder .* is incomplete") as e:
        models.load(str(d))
    assert "\n" not in str(e.value)


def _eval_args(tmp_path, **kw):
    from dsh.experiment.run import evaluate as E
    from dsh.training.laptop_base import SHIPPED_BASE

    settings = E.EvalSettings(levels=["1x2"], n_per_level=2, max_new_tokens=8, temperature=0.0)
    return E, dict(model=str(SHIPPED_BASE), out=str(tmp_path / "g.jsonl"), settings=settings, progress=False, **kw)


@pytest.mark.slow
def test_evaluate_never_modifies_an_output_it_did_not_write(tmp_path):
    """An --out dsh evaluate did not write (records of another evaluation, a file with other lines after a record, a
    2 MB one-line JSON without a final newline) is refused in one line and left byte-identical; so is its own output
    asked for with another seed; duplicate levels are refused."""
    E, args = _eval_args(tmp_path)
    out = tmp_path / "g.jsonl"
    foreign = {
        "other records": b"".join(json.dumps({"level": "3x3", "index": i, "question": "q", "response": "r"}).encode()
                                  + b"\n" for i in range(3)),
        "a record, then other lines": json.dumps({"level": "1x2", "index": 0, "question": "q", "response": "r"}).encode()
        + b'\n{"level": "3x3", "note": "keep me"}\n',
        "2 MB one-line JSON": b'{"x": "' + b"a" * 2_000_000 + b'"}',
    }
    for name, data in foreign.items():
        out.write_bytes(data)
        with pytest.raises(ValueError, match=r"^out .* (holds data dsh evaluate did not write|is not a record)") as e:
            E.evaluate(**args)
        assert "\n" not in str(e.value) and out.read_bytes() == data, name
    out.unlink()
    E.evaluate(**args)                                            # its own evaluation, with its settings record
    mine = out.read_bytes()
    assert len(mine.splitlines()) == 2 and E.settings_path(out).is_file()
    E.evaluate(**args)                                            # the same again: nothing to do, nothing changed
    assert out.read_bytes() == mine
    with pytest.raises(ValueError, match=r"^out .* holds an evaluation with other seed; resume only continues"):
        E.evaluate(**{**args, "seed": 1})
    assert out.read_bytes() == mine
    with open(out, "ab") as f:
        f.write(b'{"level": "3x3", "note": "keep me"}\n')
    with pytest.raises(ValueError, match=r"^out .* line 3 is not a record of this evaluation"):
        E.evaluate(**args)
    with pytest.raises(ValueError, match=r"^levels must name each level once"):
        E.evaluate(**{**args, "settings": E.EvalSettings(levels=["1x2", "1x2"])})


def test_resume_refuses_a_run_of_other_settings_and_takes_a_path_as_its_folder(tmp_path, monkeypatch):
    """A resume continues only the run it finds (method, settings, starting model); the starting model is
    compared by content, so a relative and an absolute path of the same base are the same model; a run that recorded
    no digest is another run."""
    import shutil

    from dsh.experiment.run import presets
    from dsh.llm.models import model_digest

    base = tmp_path / "base"
    shutil.copytree(_base(), base)
    run = tmp_path / "run"
    run.mkdir()
    cfg = presets.LAPTOP.train_config("sft", model=str(base), output_dir=str(run), resume=True)
    (run / "run_config.json").write_text(json.dumps({"dsh": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
                                                     "resolved_model": str(base), "model_digest": model_digest(base)}))
    monkeypatch.chdir(tmp_path)
    assert run_dir.check_run_dir(dataclasses.replace(cfg, model="base")) == run          # the same folder, relative
    for change, said in ((dict(method="dft"), "method: 'sft' -> 'dft'"), (dict(learning_rate=1e-3), "learning_rate")):
        with pytest.raises(ValueError, match=r"^output_dir .* holds a run with other settings \(.*" + re.escape(said)):
            run_dir.check_run_dir(dataclasses.replace(cfg, **change))
    older = json.loads((run / "run_config.json").read_text())     # recorded before packed_attention existed
    del older["dsh"]["packed_attention"]
    (run / "run_config.json").write_text(json.dumps(older))
    assert run_dir.check_run_dir(cfg) == run                           # its default is what that run did
    with pytest.raises(ValueError, match=r"holds a run with other settings \(packed_attention: 'torch' -> 'kernels'"):
        run_dir.check_run_dir(dataclasses.replace(cfg, packed_attention="kernels"))
    del older["dsh"]["learning_rate"]                                  # not a field added later: another run
    (run / "run_config.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"holds a run with other settings \(learning_rate: None"):
        run_dir.check_run_dir(cfg)
    no_digest = json.loads((run / "run_config.json").read_text())
    no_digest["dsh"]["learning_rate"] = cfg.learning_rate
    del no_digest["model_digest"]
    (run / "run_config.json").write_text(json.dumps(no_digest))
    with pytest.raises(ValueError, match=r"holds a run with other settings \(model: .*\(None\) -> 'base'"):
        run_dir.check_run_dir(dataclasses.replace(cfg, model="base"))
    (run / "run_config.json").write_text("not json")
    with pytest.raises(ValueError, match=r"holds a run with other settings \(run_config.json unreadable\)"):
        run_dir.check_run_dir(cfg)


def test_resume_and_the_pipeline_compare_the_starting_model_by_content(tmp_path):
    """The starting model's identity is its weights' sha256 (run_config.json's model_digest), not its path:
    a copy of the base under another path continues the run (train) and reuses the finished run (pipeline); other
    weights in the same folder are refused by both, naming the model and both digests."""
    import shutil

    from dsh.experiment.run import presets
    from dsh.llm.models import model_digest

    base, copy, run = tmp_path / "base", tmp_path / "elsewhere" / "copy", tmp_path / "run"
    shutil.copytree(_base(), base)
    shutil.copytree(_base(), copy)
    run.mkdir()
    cfg = presets.LAPTOP.train_config("sft", model=str(base), output_dir=str(run), resume=True)
    (run / "run_config.json").write_text(json.dumps({"dsh": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
                                                     "resolved_model": str(base), "model_digest": model_digest(base)}))
    assert model_digest(copy) == model_digest(base) and model_digest(copy).startswith("sha256:")
    assert run_dir.check_run_dir(dataclasses.replace(cfg, model=str(copy))) == run
    assert steps.run_matches(run, dataclasses.replace(cfg, model=str(copy), resume=False))
    weights = base / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                        # one bit of one weight: another model under the same path
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"holds a run with other settings \(model: .*base' \(sha256:.*\) -> .*base' "
                                         r"\(sha256:"):
        run_dir.check_run_dir(cfg)
    assert not steps.run_matches(run, dataclasses.replace(cfg, resume=False))


@pytest.mark.slow
def test_train_resume_refuses_a_folder_that_is_not_a_dsh_run_and_deletes_only_its_own_checkpoints(tmp_path, capsys):
    from dsh.experiment.run import presets
    from dsh.llm.models import model_digest
    from dsh.training import train

    other = tmp_path / "notes"
    (other / "checkpoint-notes").mkdir(parents=True)
    (other / "checkpoint-notes" / "a.txt").write_text("keep me")
    cfg = presets.LAPTOP.train_config("sft", output_dir=str(other), max_steps=1, n_train=4, save_steps=1, resume=True)
    cfg = dataclasses.replace(cfg, model=str(_base()))
    with pytest.raises(ValueError, match=r"^output_dir .* is not a dsh run \(no run_config.json\)"):
        train.train(cfg)
    assert [p.name for p in other.iterdir()] == ["checkpoint-notes"]
    run = tmp_path / "run"
    (run / "checkpoint-notes").mkdir(parents=True)        # a folder of the user's inside a fresh run
    fresh = dataclasses.replace(cfg, output_dir=str(run))
    (run / "run_config.json").write_text(json.dumps({"dsh": json.loads(json.dumps(dataclasses.asdict(fresh), default=str)),
                                                     "resolved_model": str(_base()),
                                                     "model_digest": model_digest(_base())}))
    summary = train.train(fresh)
    assert "nothing to resume" in capsys.readouterr().out and summary["global_step"] == 1
    assert (run / "checkpoint-notes").is_dir() and not list(run.glob("checkpoint-[0-9]*"))


def _base():
    from dsh.training.laptop_base import SHIPPED_BASE

    return SHIPPED_BASE


def test_levels_as_one_string_are_a_comma_separated_list():
    """--eval-set levels=1x1 and levels=1x1,2x2 (strings from the command line) are accepted."""
    from dsh.experiment.run.evaluate import EvalSettings

    assert EvalSettings(levels="1x1").checked().levels == ("1x1",)
    assert EvalSettings(levels="1x1, 2x2").checked().levels == ("1x1", "2x2")


def test_a_second_training_in_the_same_run_folder_is_refused(tmp_path):
    """While one process trains into a run folder (its lock held), another one asking for the same folder
    is refused in one line before it loads anything, and leaves nothing behind."""
    run = tmp_path / "runs" / "sft"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, signal, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); "
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); signal.pause()"),
        str(tmp_path / "runs" / ".sft.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = presets.LAPTOP.train_config("sft", model=str(_base()), output_dir=str(run), max_steps=1, n_train=4)
        from dsh.training import train

        with pytest.raises(ValueError, match=r"^output_dir .*sft is being trained by another dsh process; wait for it "
                                             r"or choose another output_dir \(lock .*\.sft\.lock\)$"):
            train.train(cfg)
        assert not run.exists() and [p.name for p in (tmp_path / "runs").iterdir()] == [".sft.lock"]
    finally:
        holder.kill()
        holder.wait()


def test_a_model_with_nan_weights_is_refused_at_load(tmp_path):
    """A diverged model (NaN weights) used to answer empty strings with exit 0; it is refused at load."""
    import shutil

    from safetensors.torch import load_file, save_file

    from dsh.llm import models

    d = tmp_path / "nan-base"
    shutil.copytree(_base(), d)
    w = load_file(d / "model.safetensors")
    name = sorted(w)[0]
    w[name][0] = float("nan")
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"^model .*nan-base: 1 weight tensors hold NaN or infinite values \(e\.g\. "):
        models.load(str(d))
    assert models.load(str(_base()))[0] is not None


def test_papermill_parameters_refuses_an_injected_name_the_chapter_lacks():
    from dsh.core.validate import papermill_parameters

    known = {"In", "Out", "get_ipython", "_", "_i1", "seed", "n_live"}
    import json as imported_module

    papermill_parameters(known, {**dict.fromkeys(known), "PARAMETERS": set(), "_i2": "", "_2": 1, "book_mode": print,
                                 "json": imported_module, "Path": Path})   # nothing new but imports
    with pytest.raises(ValueError, match=r"^unknown papermill parameter\(s\) preset; this chapter's parameters: "
                                         r"n_live, seed$"):
        papermill_parameters(known, {**dict.fromkeys(known), "preset": "nope"})


@pytest.mark.slow
def test_a_config_of_other_sizes_than_the_weights_is_one_line(tmp_path):
    """A config.json whose sizes do not match the weights gave transformers' RuntimeError pointing at a
    report that was never printed; it is one line naming a tensor, both shapes and the config file, through the
    API and the CLI (exit 2, nothing written)."""
    import subprocess
    import sys

    from dsh.llm import models

    d = _copy_base(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 256
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"^model .*: its config\.json gives \d+ tensors other sizes than its weights "
                                         r"\(e\.g\. model\.layers\.\d+\.mlp\.\w+\.weight: weights \d+x384, config "
                                         r"\d+x256\); .*config\.json belongs to another model$") as e:
        models.load(str(d))
    assert "\n" not in str(e.value)
    out = tmp_path / "g.jsonl"
    r = subprocess.run([sys.executable, "-m", "dsh", "evaluate", "--model", str(d), "--levels", "1x2", "--n", "1",
                        "--max-new-tokens", "16", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "config.json gives" in r.stderr
    assert not out.exists()


def test_a_model_folder_without_a_tokenizer_is_one_line(tmp_path):
    """A folder without tokenizer files was reported as 'install sentencepiece or tiktoken'; it is one line
    naming the folder and the files looked for, and a tokenizer file that cannot be read names the folder too."""
    from dsh.llm import models

    d = _copy_base(tmp_path)
    for f in d.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ValueError, match=r"^model .*: the folder .* holds no tokenizer \(none of tokenizer\.json, "):
        models.load(str(d))
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^model .*: its tokenizer in .* cannot be loaded \(") as e:
        models.load(str(d))
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_failed_evaluation_leaves_no_settings_record_that_blocks_the_next(tmp_path):
    """An evaluation that failed before its first record (here: a model whose weights hold NaN) left
    <out>.settings.json behind, and the next, correct evaluation into the same out was refused as 'another
    evaluation'; now the failed run leaves nothing and the next one runs."""
    import shutil

    from safetensors.torch import load_file, save_file

    from dsh.experiment.run import evaluate as E

    bad = tmp_path / "nan-base"
    shutil.copytree(_base(), bad)
    w = load_file(bad / "model.safetensors")
    w[sorted(w)[0]][0] = float("nan")
    save_file(w, bad / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "g.jsonl"
    settings = E.EvalSettings(levels=["1x2"], n_per_level=2, max_new_tokens=8, temperature=0.0)
    with pytest.raises(ValueError, match="NaN or infinite"):
        E.evaluate(str(bad), str(out), settings, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan-base"]        # no output, no settings record
    E.evaluate(str(_base()), str(out), settings, progress=False)
    assert len(out.read_text().splitlines()) == 2 and E.settings_path(out).is_file()


@pytest.mark.slow
def test_clear_run_removes_only_what_train_wrote(tmp_path):
    """Chapter 04's papermill parameter fresh=True removed its run folder whole, a user's file included.
    run_dir.clear_run (what the chapter calls) removes a real run (checkpoints kept, so every kind of file train writes
    is there) and refuses, byte-identical, a run folder holding a user's file, and a folder that is not a dsh run."""
    from dsh.experiment.run import presets
    from dsh.training import train

    run = tmp_path / "run"
    cfg = presets.LAPTOP.train_config("sft", model=str(_base()), output_dir=str(run), max_steps=2, n_train=16,
                                      save_steps=1, keep_checkpoints=True)
    train.train(cfg)
    assert (run / "final").is_dir() and list(run.glob("checkpoint-*")) and (run / "run_config.json").is_file()

    def snapshot(d):
        return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
                for p in sorted(d.rglob("*"))}

    (run / "important.txt").write_text("my notes")
    before = snapshot(run)
    with pytest.raises(ValueError, match=r"^run folder .*run holds files dsh train did not write \(important\.txt\); "
                                         r"move them or choose another folder; nothing was removed$"):
        run_dir.clear_run(run)
    assert snapshot(run) == before
    (run / "important.txt").unlink()
    run_dir.clear_run(run)
    assert not run.exists()
    run_dir.clear_run(run)                                  # nothing there: nothing to do
    other = tmp_path / "mine"
    (other / "final").mkdir(parents=True)
    (other / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"^run folder .*mine is not a dsh run \(no run_config\.json; it holds final, "
                                         r"notes\.txt\); nothing was removed$"):
        run_dir.clear_run(other)
    assert (other / "notes.txt").read_text() == "x" and (other / "final").is_dir()


def _file_size_limit(limit: int):
    """For a subprocess: files over ``limit`` bytes cannot be written (EFBIG, as a full disk would refuse them)."""
    import resource
    import signal

    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


@pytest.mark.slow
@pytest.mark.parametrize("case", ["base", "train"])
def test_a_full_disk_is_one_line_naming_what_was_being_written(tmp_path, case):
    """A disk that refuses a write (here a file size limit, the same refusal a full disk gives) while
    `dsh base` saves its state or `dsh train` its checkpoint was a traceback (torch's 'unexpected pos',
    SafetensorError); now one line naming the file or the run folder, exit 2."""
    if case == "base":      # the base command's own code (build_base) on a small model, through the CLI's handler
        code = ("import sys\nfrom dsh.__main__ import main\nfrom dsh.llm.tiny import TinyConfig\n"
                "from dsh.training import laptop_base as lb\nfrom dsh.training.pretrain import PretrainConfig\n"
                "spec = lb.BaseSpec(model=TinyConfig(d_model=32, layers=1, heads=2, ffn=64, max_positions=256), "
                "train=PretrainConfig(tokens=3000, tokens_per_batch=512, warmup_steps=2), n_examples=300, "
                "pack_length=256, report_n=1, curve_every=1000, curve_n=1)\n"
                "import dsh.__main__\n"
                "dsh.__main__.BaseSpec = lambda: spec       # the command builds this small spec\n"
                f"sys.exit(main(['base', '--out', {str(tmp_path / 'm')!r}, '--quiet']))\n")
        argv, where, limit = ["-c", code], str(tmp_path / ".m.work" / "state.pt"), 30_000
    else:
        argv, where, limit = ["-m", "dsh", "train", "--preset", "laptop", "--method", "sft", "--output-dir",
                       str(tmp_path / "run"), "--set", "max_steps=2", "--set", "save_steps=1", "--set", "n_train=16"], \
            str(tmp_path / "run"), 1_000_000
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                       preexec_fn=_file_size_limit(limit))
    err = [line for line in r.stderr.splitlines() if line.startswith("error: ")]   # beside the progress bars
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert err[0].endswith(": " + where) and "free space and run again" in err[0], err
