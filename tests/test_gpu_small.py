"""The one command of the GPU experiment (python3 -m dsh.experiment.run.gpu_small), run on CPU at ci size: the bundle
set-up, every stage, the results folder's format, resuming, and bad input."""

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.experiment import report
from dsh.experiment.run import pipeline, presets
from dsh.llm import models

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)

STAGES = ["base", "sft", "sft_reflection", "rl", "dft"]
TINY = ["--pipeline-arg=--set=max_steps=1", "--pipeline-arg=--set=max_completion_length=48",
        "--pipeline-arg=--eval-set=n_per_level=1", "--pipeline-arg=--eval-set=max_new_tokens=24"]


def _bundle(root: Path) -> Path:
    """The layout of the project's bundle script: the GGUF split in a/part-aa and b/part-ab, b/sha."""
    gguf = models.embedded_gguf_path().read_bytes()
    b = root / "bundle"
    (b / "a").mkdir(parents=True)
    (b / "b").mkdir()
    (b / "a" / "part-aa").write_bytes(gguf[: len(gguf) // 2])
    (b / "b" / "part-ab").write_bytes(gguf[len(gguf) // 2:])
    (b / "b" / "sha").write_text(hashlib.sha256(gguf).hexdigest() + "  /root/m/smol.gguf\n")
    return b


def _run(*args, env=None):
    env = {**os.environ, "DSH_CACHE": str(models.cache_dir()), **(env or {})}   # the converted model, reused
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run([sys.executable, "-m", "dsh.experiment.run.gpu_small", *args], capture_output=True, text=True,
                          env=env)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_small")
    bundle = _bundle(root)
    args = ["--bundle", str(bundle), "--results", str(root / "results"), "--work", str(root / "work"),
            "--preset", "ci", *TINY]
    first = _run(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return root, args, first


@pytest.mark.full   # make test-all: gpu-small at ci size on the embedded model (~150 s); make test: the laptop pipeline
def test_every_stage_runs_and_prints_its_time(ci_run):
    root, _, first = ci_run
    for st in ["sft", "sft_reflection", "rl", "dft"]:
        assert f"[dsh pipeline] train {st}: trained in" in first.stdout
    for st in STAGES:
        assert f"[dsh pipeline] evaluate {st}: " in first.stdout
    assert "[gpu-small] done:" in first.stdout
    assert (root / "work" / "model.gguf").stat().st_size == models.embedded_gguf_path().stat().st_size


@pytest.mark.full   # make test-all: gpu-small at ci size on the embedded model (~150 s); make test: the laptop pipeline
def test_results_folder_format(ci_run):
    """The format chapter 04 renders: fixed here, on a CPU run of the same command."""
    root, _, _ = ci_run
    res = root / "results"
    files = sorted(str(p.relative_to(res)) for p in res.rglob("*") if p.is_file())
    assert files == sorted([".dsh-pipeline.json", "summary.json", "provenance.json"]   # the folder's claim
                           + [f"calibration/{s}.json" for s in STAGES]
                           + [f"generations/{s}.jsonl.gz" for s in STAGES]
                           + [f"jobs/{s}.json" for s in STAGES])                  # each job's record
    assert sum(p.stat().st_size for p in res.rglob("*") if p.is_file()) < 16e6
    s = json.loads((res / "summary.json").read_text())
    assert set(s) >= {"preset", "stages", "labels", "eval", "seed", "wall_s", "timings_s", "training", "hardware",
                      "commit", "budgets", "truncation", "accuracy", "design", "jobs"}
    assert s["stages"] == STAGES and s["eval"]["max_new_tokens"] == 24
    assert set(s["timings_s"]) == {f"train_{x}" for x in STAGES[1:]} | {f"evaluate_{x}" for x in STAGES}
    assert s["truncation"]["rl"]["train"]["limit"] == 48 and 0 <= s["truncation"]["rl"]["train"]["clipped_rate"] <= 1
    assert s["truncation"]["sft_reflection"]["train"]["rate"] is not None
    assert set(s["design"]["goals"]) == {"base accuracy non-zero on >= 4 test levels",
                                         "base accuracy decays with difficulty",
                                         "GRPO zero-variance groups <= 50 % at step 1",
                                         "RL changes p_dW or p_s measurably"}
    prov = json.loads((res / "provenance.json").read_text())
    assert set(prov) >= {"command", "command_wall_s", "setup_s", "timings_s", "gpu", "hardware", "commit", "date"}
    for st in STAGES:
        cal = json.loads((res / "calibration" / f"{st}.json").read_text())
        assert set(cal) == {"all", "drop_truncated", "faithfulness", "task", "truncated", "unfitted", "unfitted_mixture"}
        assert cal["task"] == "traces" and set(cal["faithfulness"]["overall"]) >= {"has_check", "verdict_follows"}
        lines = gzip.decompress((res / "generations" / f"{st}.jsonl.gz").read_bytes()).decode().splitlines()
        assert len(lines) == len(presets.CI.eval_settings().levels)         # n_per_level=1
        assert all(isinstance(json.loads(x)["response"], str) for x in lines)
    loaded = pipeline.load_results(res)
    assert list(report.table1(loaded).index)[0] == "Base"
    assert report.faithfulness_table(loaded).shape == (5, 9)
    assert report.truncation_table(loaded).loc["RL", "training budget"] == 48


@pytest.mark.full   # make test-all: gpu-small at ci size on the embedded model (~150 s); make test: the laptop pipeline
def test_running_again_resumes_without_redoing_anything(ci_run):
    root, args, _ = ci_run
    made = {p: p.stat().st_mtime_ns for pat in ("*.safetensors", "generations/*.jsonl")
            for p in (root / "work").rglob(pat)}
    assert any(p.suffix == ".jsonl" for p in made) and any(p.suffix == ".safetensors" for p in made)
    again = _run(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    for st in ["sft", "sft_reflection", "rl", "dft"]:
        assert f"[dsh pipeline] train {st}: reused" in again.stdout
    # no weights written and no response generated again (times are the README's business, not a test's)
    assert {p: p.stat().st_mtime_ns for p in made} == made


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    r = _run("--bundle", str(tmp_path / "missing"), "--results", str(tmp_path / "r"), "--work", str(tmp_path / "w"))
    assert r.returncode == 2 and r.stderr.strip() == f"error: bundle must be a folder; {tmp_path / 'missing'} is not one"
    r = _run("--bundle", str(tmp_path), "--preset", "huge", "--results", str(tmp_path / "r"), "--work", str(tmp_path / "w"))
    assert r.returncode == 2 and "preset must be one of ci, gpu-small" in r.stderr
    b = _bundle(tmp_path)
    (b / "b" / "sha").write_text("0" * 64 + "  x\n")
    r = _run("--bundle", str(b), "--results", str(tmp_path / "r"), "--work", str(tmp_path / "w"), "--preset", "ci")
    assert r.returncode == 2 and "does not match its sha256" in r.stderr
    assert not (tmp_path / "r").exists()


def test_stage_table_shows_each_stage_its_own_budget():
    from dsh.training import budgets
    t = report.stage_table("gpu-small")
    assert list(t.index) == STAGES
    assert t.loc["rl", "token_budget"] == budgets.tokens("gpu-small", "grpo.max_completion_length")
    assert t.loc["base", "token_budget"] == budgets.tokens("gpu-small", "base.max_length")
    assert t.loc["rl", "starts from"] == "sft_reflection"


def test_the_bundle_script_makes_what_gpu_small_reads(tmp_path):
    """The offline bundle was hand-built by a script outside the repository."""
    from dsh.experiment.run import gpu_bundle, gpu_small
    from dsh.llm.models import embedded_gguf_path

    got = gpu_bundle.make_bundle(tmp_path / "b", part_mb=20, wheels=False)
    assert len(got["parts"]) > 1 and got["parts"][0] == "a/part-aa"
    joined = gpu_small.find_model(tmp_path / "b", tmp_path)        # joins the parts and checks the sha
    assert joined.read_bytes() == embedded_gguf_path().read_bytes()
    with pytest.raises(ValueError, match=r"^out must be a new or empty folder"):
        gpu_bundle.make_bundle(tmp_path / "b", wheels=False)
    from importlib import metadata

    assert gpu_bundle.pinned(["trl", "dill"]) == [f"trl=={metadata.version('trl')}", f"dill=={metadata.version('dill')}"]
