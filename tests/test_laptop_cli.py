"""The laptop preset end to end through the CLI at the smallest size, through the same run_pipeline as every preset:
its plan (one seed, no ablations), a kill in the middle of a training stage, and a second run that reuses the
finished stages, resumes the killed one from its checkpoint and writes the results folder of every preset."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from killed_after_save import run_killed_after_save

from dsh.core.files import read_json

pytestmark = pytest.mark.slow   # trains four tiny models through TRL in a subprocess

SMALL = ["--seeds", "0", "--ablation-seeds", "", "--set", "max_steps=3", "--set", "n_train=24", "--set", "save_steps=1",
         "--set", "generation_batch_size=16", "--set", "per_device_train_batch_size=8",
         "--set", "max_completion_length=96", "--eval-set", "n_per_level=2", "--eval-set", "levels=1x2,1x3",
         "--attribution-set", "levels=1x2", "--attribution-set", "prompts_per_level=1", "--attribution-set", "group=2",
         "--attribution-set", "max_new_tokens=120", "--attribution-set", "min_signal=0"]
STAGES = ["base", "sft-s0", "sft_reflection-s0", "dft-s0", "rl-s0"]


def _cmd(root: Path) -> list:
    return [sys.executable, "-m", "dsh", "pipeline", "--preset", "laptop", "--results-dir", str(root / "results"),
            "--runs-dir", str(root / "runs"), *SMALL]


def _env():
    return {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def _checkpointed(run: Path) -> bool:
    """A complete checkpoint: dsh writes its totals last (dsh.training.run_dir.TOTALS)."""
    return any((c / "trainer_state.json").is_file() and (c / "dsh_totals.json").is_file()
               for c in run.glob("checkpoint-*"))


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("laptop_cli")
    target = root / "runs" / "dft-s0"
    first = run_killed_after_save(_cmd(root), 1, _env(), "dft-s0")   # the third training stage, at its first checkpoint
    assert _checkpointed(target)
    killed = {"summary": (root / "results" / "summary.json").exists(),
              "calibrated": sorted(p.stem for p in (root / "results" / "calibration").glob("*.json")),
              "dft_final": (target / "final").exists()}
    again = subprocess.run(_cmd(root), capture_output=True, text=True, env=_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return root, first, killed, again


def test_the_kill_left_the_finished_stages_and_no_summary(killed_and_resumed):
    _, first, killed, _ = killed_and_resumed
    assert "[dsh pipeline] train sft-s0: trained" in first and "[dsh pipeline] train dft-s0 (dft) ..." in first
    assert killed == {"summary": False, "calibrated": ["base", "sft-s0", "sft_reflection-s0"], "dft_final": False}


def test_the_second_run_reuses_resumes_and_finishes(killed_and_resumed):
    root, _, _, again = killed_and_resumed
    out = again.stdout
    for st in ("sft-s0", "sft_reflection-s0"):
        assert f"[dsh pipeline] train {st}: reused" in out
    assert "[dsh pipeline] train dft-s0: trained" in out and "[dsh pipeline] train rl-s0: trained" in out
    s = json.loads((root / "results" / "summary.json").read_text())
    assert s["preset"] == "laptop" and s["task"] == "laptop_task" and s["stages"] == STAGES
    assert [(x["name"], x["kind"], x["seed"]) for x in s["plan"]] == [
        ("base", "base", None), ("sft-s0", "sft", 0), ("sft_reflection-s0", "sft_reflection", 0),
        ("dft-s0", "dft", 0), ("rl-s0", "rl", 0)]
    assert "checkpoint-" in str(s["training"]["dft-s0"]["resumed_from"])      # resumed, not started over
    assert s["training"]["dft-s0"]["global_step"] == 3 and s["training"]["sft-s0"]["resumed_from"] is None
    assert [r["step"] for r in s["reward_curves"]["rl-s0"]] == [1, 3]          # rounds of 16 feed 2 steps of 8
    assert s["model"].endswith("laptop-base")                                  # the preset's base by default
    assert s["hardware"]["torch_threads"] >= 1 and s["date"] and len(s["load_average_1min"]) == 1 + len(STAGES)


def test_the_results_folder_is_every_presets(killed_and_resumed):
    root, _, _, again = killed_and_resumed
    from dsh.experiment import report
    from dsh.experiment.run import pipeline

    res = root / "results"
    assert sorted(p.name for p in (res / "generations").iterdir()) == sorted(f"{s}.jsonl.gz" for s in STAGES)
    for st in STAGES:
        rows = [json.loads(x) for x in gzip.decompress((res / "generations" / f"{st}.jsonl.gz").read_bytes()).splitlines()]
        assert [r["level"] for r in rows] == ["1x2", "1x2", "1x3", "1x3"]
        cal = json.loads((res / "calibration" / f"{st}.json").read_text())
        assert cal["task"] == "laptop_task" and set(cal["faithfulness"]) == {"overall", "by_level"}
    loaded = pipeline.load_results(res)
    assert list(report.table1(loaded).index) == ["Base", "SFT (no reflection) (1 seed)", "SFT (reflection) (1 seed)",
                                                 "DFT (1 seed)", "RL (1 seed)"]
    assert [c["verdict"] for c in report.claims(loaded, seed=0)] == ["cannot tell"] * 4   # 2 questions a level
    # the attribution step, each model against the one its training started from, two repeated
    studies = {p.name[:-len(".json.gz")]: read_json(p) for p in (res / "attribution").glob("*.json.gz")}
    assert sorted(studies) == sorted([*STAGES, "sft_reflection-s0-t1", "rl-s0-t1"])
    assert studies["rl-s0"]["reference"] == "<runs_dir>/sft_reflection-s0" and studies["rl-s0"]["model"] == "<runs_dir>/rl-s0"
    assert studies["base"]["reference"] == studies["base"]["model"] == "<dsh>/assets/laptop-base"
    assert studies["dft-s0"]["reference"] == "<dsh>/assets/laptop-base"
    assert "kl_k3" in studies["rl-s0"]["objectives"] and "kl_k3" not in studies["base"]["objectives"]
    assert studies["rl-s0-t1"]["settings"]["seed"] == 1 and studies["rl-s0"]["settings"]["levels"] == ["1x2"]
    assert studies["rl-s0"]["weights"] != studies["rl-s0"]["reference_weights"]
    assert "[dsh pipeline] attribution rl-s0-t1: " in again.stdout
    configs = loaded["summary"]["configs"]          # each trained stage's configuration, paths from labels
    from dsh.experiment.run.presets import LAPTOP

    assert sorted(configs) == sorted(STAGES[1:]) and configs["rl-s0"]["beta"] == LAPTOP.training["grpo"]["beta"]
    assert configs["rl-s0"]["model"] == "<runs_dir>/sft_reflection-s0" and configs["rl-s0"]["max_steps"] == 3
    umask = os.umask(0)
    os.umask(umask)             # a trained model is readable like any file its user writes (transformers: 0600)
    assert {oct(p.stat().st_mode & 0o777) for p in (root / "runs" / "sft-s0" / "final").iterdir()} == \
        {oct(0o666 & ~umask)}


def test_bad_laptop_input_is_one_line_before_any_work(tmp_path):
    for args, fragment in ((["--seeds", "0,x"], "error: seeds must be comma-separated integers such as 0,1,2"),
                           (["--seeds", "0", "--ablation-seeds", "1"], "error: ablation_seeds must be a subset of seeds"),
                           (["--stages", "rl-s7"], "error: stages[i] must be one of base, sft-s0"),
                           (["--set", "task_options={\"check\": \"both\"}"],
                            "error: task_options['check'] must be one of computed, verdict"),
                           (["--set", "seed=3"], "error: overrides must not set seed in a seeded plan")):
        r = subprocess.run([sys.executable, "-m", "dsh", "pipeline", "--preset", "laptop", "--results-dir",
                            str(tmp_path / "r"), "--runs-dir", str(tmp_path / "w"), *args],
                           capture_output=True, text=True, env=_env())
        assert r.returncode == 2 and r.stderr.strip().startswith(fragment), (args, r.stderr[-500:])
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


# ------------------------------------------------------------------------------------------------
# A killed and resumed pipeline writes the results folder of an uninterrupted one
# ------------------------------------------------------------------------------------------------
VOLATILE = {"wall_s", "timings_s", "schedule", "load_average_1min", "date", "provenance", "hardware"}   # how long, where
TRAIN_VOLATILE = {"wall_s", "tokens_per_s", "resumed_from", "hardware", "generation_s", "scoring_s", "update_s"}
CURVE_VOLATILE = {"rollout_s", "scoring_s", "update_s"}


def _differences(got: dict, want: dict) -> list:
    """Where two :func:`comparable` folders differ: file names, and inside summary.json the keys (and the training
    summaries' keys)."""
    out = [k for k, x in got.items() if k != "summary.json" and x != want.get(k)]
    s, u = got["summary.json"], want["summary.json"]
    out += [f"summary.json:{k}" for k in s if k != "training" and s[k] != u.get(k)]
    out += [f"summary.json:training.{st}.{k}" for st in s["training"] for k in s["training"][st]
            if s["training"][st][k] != u["training"].get(st, {}).get(k)]
    return out


def _without_probe_digest(job: dict) -> dict:
    return {**job, "files": {k: x for k, x in job["files"].items() if not (k.startswith("probe/") and k.endswith(".json"))}}


def comparable(results: Path) -> dict:
    """A results folder as content: every file's bytes, except summary.json read without the wall times (and the
    tokens/s and resume point of its training summaries, the seconds of its reward curves), the probe's summaries
    without their time and date, and the job records without the digest of those summaries."""
    out = {}
    for p in sorted(results.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(results).as_posix()
        if rel.startswith("probe/") and rel.endswith(".json"):     # the probe's summary records its time and date
            out[rel] = {k: x for k, x in json.loads(p.read_text()).items() if k not in ("wall_s", "date")}
            continue
        if rel.startswith("attribution/"):                          # a study records its times and date
            out[rel] = {k: x for k, x in read_json(p).items() if k not in ("wall_s", "sample_s", "date")}
            continue
        if rel.startswith("jobs/"):      # a job's record holds the digest of its probe summary (time and date)
            out[rel] = _without_probe_digest(json.loads(p.read_text()))
            continue
        if rel != "summary.json":
            out[rel] = p.read_bytes()
            continue
        # the runs folder's own path (a stage's starting model) is not content
        s = {k: x for k, x in json.loads(p.read_text().replace(str(results.parent), "ROOT")).items()
             if k not in VOLATILE}
        s["training"] = {st: {k: x for k, x in t.items() if k not in TRAIN_VOLATILE} for st, t in s["training"].items()}
        s["jobs"] = {st: _without_probe_digest(j) for st, j in s["jobs"].items()}
        s["reward_curves"] = {st: [{k: x for k, x in r.items() if k not in CURVE_VOLATILE} for r in rows]
                              for st, rows in s["reward_curves"].items()}
        out[rel] = s
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("laptop_whole")
    r = subprocess.run(_cmd(root), capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return comparable(root / "results")


def _kill_when(root: Path, ready) -> None:
    proc = subprocess.Popen(_cmd(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                            start_new_session=True)
    while proc.poll() is None and not ready():
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the kill point"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    again = subprocess.run(_cmd(root), capture_output=True, text=True, env=_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]


def test_killed_in_a_training_stage_and_resumed_the_folder_is_the_uninterrupted_ones(killed_and_resumed, uninterrupted):
    root, _, _, _ = killed_and_resumed
    got = comparable(root / "results")
    assert sorted(got) == sorted(uninterrupted)
    assert _differences(got, uninterrupted) == []


@pytest.mark.full   # make test-all: two more kill points (~70 s); the training one above runs in make test
@pytest.mark.parametrize("point", ["after the base calibration", "after the last generations, before the summary"])
def test_killed_while_writing_results_and_resumed_the_folder_is_the_uninterrupted_ones(tmp_path, uninterrupted, point):
    res = tmp_path / "results"
    ready = {"after the base calibration": lambda: (res / "calibration" / "base.json").is_file(),
             "after the last generations, before the summary": lambda: (res / "generations" / "rl-s0.jsonl.gz").is_file()}
    _kill_when(tmp_path, ready[point])
    got = comparable(res)
    assert sorted(got) == sorted(uninterrupted)
    assert _differences(got, uninterrupted) == []


def test_a_study_is_added_to_a_finished_folder_by_running_the_pipeline_again(killed_and_resumed, tmp_path):
    """No catch-up command: a finished folder (copied, with its runs) gets a changed study by the same pipeline
    command with other study settings; every training step and every evaluation job (evaluation, calibration, probe)
    is reused, the studies are made again with the new settings, and a bad setting is one line before any work."""
    import shutil

    root = killed_and_resumed[0]
    copy = tmp_path / "copy"
    for part in ("results", "runs"):
        shutil.copytree(root / part, copy / part)
    cmd = [x if x != "levels=1x2" else "levels=1x3" for x in _cmd(copy)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    for stage in STAGES[1:]:
        assert f"train {stage}: reused" in out, out[-3000:]
    assert "sft_reflection-s0: evaluation, calibration and probe reused" in out
    s = read_json(copy / "results" / "attribution" / "rl-s0.json.gz")
    assert s["settings"]["levels"] == ["1x3"] and s["reference"] == "<runs_dir>/sft_reflection-s0"
    assert {x["level"] for x in s["trajectories"]} <= {"1x3"}
    before = sorted(p.name for p in (copy / "results" / "attribution").iterdir())
    bad = subprocess.run([*cmd, "--attribution-set", "prompts=3"], capture_output=True, text=True, env=_env())
    assert bad.returncode == 2 and "attribution_overrides must be one of levels" in bad.stderr, bad.stderr
    assert sorted(p.name for p in (copy / "results" / "attribution").iterdir()) == before
