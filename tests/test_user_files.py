"""Settings that mean what they say, and nothing of the user's touched: a hostile or careless user's cases, each kept
as a test (through the command line where the case is a command-line case). Every refusal is one line, exit 2,
before any work, with the folders byte-identical."""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.__main__ import main
from dsh.experiment.run import folders, pipeline, presets, steps
from dsh.training import run_dir, train_config
from dsh.training.laptop_base import SHIPPED_BASE

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["train", "--preset", "laptop", "--method", "sft", "--set", "max_steps=2", "--set", "save_steps=1",
         "--set", "n_train=16"]
PIPELINE = ["pipeline", "--preset", "laptop", "--seeds", "0", "--ablation-seeds", "", "--stages", "sft-s0",
            "--set", "max_steps=1", "--set", "n_train=32", "--eval-set", "n_per_level=1", "--eval-set", "levels=1x2",
            "--quiet"]


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def refused(capsys, argv, fragment: str) -> str:
    """Run the command line in-process; it must exit 2 with one 'error:' line holding ``fragment`` (what earlier
    commands of the test printed is not this command's)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("error: ")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert fragment in lines[0], lines[0]
    return lines[0]


def trained(run: Path, *extra) -> Path:
    """A finished laptop SFT run with its checkpoints kept (every kind of file train writes is there)."""
    assert main([*TRAIN, "--output-dir", str(run), "--set", "keep_checkpoints=true", *extra]) == 0
    return run


def killed(run: Path, *extra) -> Path:
    """A run as a kill after its last checkpoint leaves it: checkpoints, logs and settings, no final/ or summary."""
    trained(run, *extra)
    shutil.rmtree(run / "final")
    (run / "summary.json").unlink()
    return run


# ---------------------------------------------------------------- 1. code execution

def _planted_model(tmp_path: Path) -> tuple[Path, Path]:
    """The shipped base with an ``auto_map`` in its config pointing at a module that creates a file when imported."""
    model, sentinel = tmp_path / "planted", tmp_path / "SENTINEL"
    shutil.copytree(SHIPPED_BASE, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('ran')\n"
                                   "from transformers import LlamaConfig, LlamaForCausalLM\n"
                                   "class EvilConfig(LlamaConfig):\n    pass\n"
                                   "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n")
    return model, sentinel


@pytest.mark.parametrize("text", [pytest.param(t, marks=pytest.mark.slow) for t in ("False", "no", "off")]
                         + ["none", "maybe"])   # the ones that train are slow; the refusals are not
def test_trust_remote_code_other_than_true_never_runs_a_model_folders_code(tmp_path, text):
    """`--set trust_remote_code=False` was kept as the truthy string "False": transformers imported the folder's
    module. Now False (or, for 'none' and 'maybe', refused in one line); the module never runs, in train and in the
    pipeline."""
    model, sentinel = _planted_model(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_MODULES_CACHE=str(tmp_path / "modules"))
    commands = [[*TRAIN, "--model", model, "--output-dir", tmp_path / "run"]]
    if text in ("False", "maybe"):       # the pipeline reads --set by the same reader; one spelling each way
        commands.append([*PIPELINE, "--model", model, "--results-dir", tmp_path / "r", "--runs-dir", tmp_path / "w",
                         "--attribution-set", "levels=1x2", "--attribution-set", "prompts_per_level=1",
                         "--attribution-set", "group=2", "--attribution-set", "max_new_tokens=24",
                         "--attribution-set", "min_signal=0", "--attribution-set", "max_rounds=1"])
    for argv in commands:
        r = subprocess.run([sys.executable, "-m", "dsh", *map(str, argv), "--set", f"trust_remote_code={text}"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
        assert not sentinel.exists(), r.stderr[-2000:]
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        if text in ("none", "maybe"):
            assert r.returncode == 2 and f"error: trust_remote_code must be true or false; got '{text}'" in r.stderr
        elif argv[0] == "train":
            assert "trust_remote_code=False" in r.stdout, r.stdout[-2000:]    # the run prints it
        else:                   # the pipeline ran --quiet: its training's record says it
            assert r.returncode == 0, r.stderr[-2000:]
            run = json.loads((tmp_path / "w" / "sft-s0" / "run_config.json").read_text())
            assert run["dsh"]["trust_remote_code"] is False


# ---------------------------------------------------------------- 2. nothing of the user's deleted

def test_pipeline_fresh_refuses_a_users_file_inside_a_stages_final(tmp_path, capsys):
    runs, results = tmp_path / "w", tmp_path / "r"
    trained(runs / "sft-s0")
    (runs / "sft-s0" / "final" / "mine.txt").write_text("my notes")
    other = folders.identity("laptop", [], ["x"], "m", {}, 0)
    (runs / folders.CLAIM).write_text(json.dumps({"written_by": "dsh pipeline", "identity": other}))
    before = snapshot(tmp_path)
    for fresh in (["--fresh"], []):
        refused(capsys, [*PIPELINE, "--results-dir", results, "--runs-dir", runs, *fresh],
                "holds files dsh pipeline did not write (sft-s0/final/mine.txt")
        assert snapshot(tmp_path) == before


def test_a_resume_refuses_a_users_file_inside_a_checkpoint(tmp_path, capsys):
    """The user's file went with the checkpoint when the resumed stage finished."""
    run = killed(tmp_path / "run")
    (run / "checkpoint-1" / "mine.txt").write_text("my notes")
    before = snapshot(tmp_path)
    refused(capsys, [*TRAIN, "--output-dir", run, "--set", "keep_checkpoints=true", "--resume"],
            "holds files dsh train did not write (checkpoint-1/mine.txt); move them")
    assert snapshot(tmp_path) == before


def test_clear_run_refuses_a_users_file_in_final_and_a_user_made_checkpoint(tmp_path):
    run = trained(tmp_path / "run")
    (run / "final" / "mine.txt").write_text("x")
    (run / "checkpoint-7").mkdir()
    (run / "checkpoint-7" / "notes.md").write_text("x")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"holds files dsh train did not write \(checkpoint-7/notes\.md, "
                                         r"final/mine\.txt\); move them or choose another folder; nothing was removed$"):
        run_dir.clear_run(run)
    assert snapshot(tmp_path) == before
    assert run_dir.run_foreign_files(trained(tmp_path / "clean")) == []     # what train writes is its own


def test_base_refuses_a_users_files_in_its_saving_and_work_folders(tmp_path, capsys):
    (tmp_path / ".k7.saving").mkdir()
    (tmp_path / ".k7.saving" / "mine.txt").write_text("x")
    before = snapshot(tmp_path)
    refused(capsys, ["base", "--out", tmp_path / "k7", "--quiet"], ".k7.saving holds files dsh base did not write "
                                                                   "(mine.txt)")
    assert snapshot(tmp_path) == before
    shutil.rmtree(tmp_path / ".k7.saving")
    (tmp_path / ".k7.work").mkdir()
    (tmp_path / ".k7.work" / "train_stats.json").write_text("{\"mine\": 1}")
    before = snapshot(tmp_path)
    refused(capsys, ["base", "--out", tmp_path / "k7", "--quiet"], "holds train_stats.json that dsh did not write")
    assert snapshot(tmp_path) == before


def test_probe_and_data_refuse_an_existing_file_they_did_not_write(tmp_path, capsys):
    (tmp_path / "p.json").write_text("{\"mine\": true}")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "test.jsonl").write_text("my data\n")
    before = snapshot(tmp_path)
    refused(capsys, ["probe", "--model", SHIPPED_BASE, "--out", tmp_path / "p.json", "--quiet"],
            "p.json exists and is not a dsh probe's output")
    refused(capsys, ["data", "--out", tmp_path / "d", "--n-train", "4", "--n-test", "2"],
            "holds test.jsonl with other contents than dsh data writes")
    assert snapshot(tmp_path) == before
    (tmp_path / "d" / "test.jsonl").unlink()
    assert main(["data", "--out", str(tmp_path / "d"), "--n-train", "4", "--n-test", "2"]) == 0
    again = snapshot(tmp_path / "d")
    assert main(["data", "--out", str(tmp_path / "d"), "--n-train", "4", "--n-test", "2"]) == 0   # its own bytes
    assert snapshot(tmp_path / "d") == again


def test_evaluate_repairs_a_cut_first_record(tmp_path):
    out = tmp_path / "g.jsonl"
    argv = ["evaluate", "--model", str(SHIPPED_BASE), "--levels", "1x2", "--n", "2", "--max-new-tokens", "24",
            "--out", str(out)]
    assert main(argv) == 0
    whole = out.read_bytes()
    out.write_bytes(whole[:20])                 # the first record cut by a kill
    assert main(argv) == 0
    assert out.read_bytes() == whole            # the same records, no line glued onto the cut one
    assert main(argv) == 0                      # and the file is taken again


def test_an_evaluation_names_its_model_by_content_so_a_moved_copy_resumes_and_other_weights_are_refused(tmp_path, capsys):
    """The same weights under another path are the same model (the evaluation is taken, nothing rewritten); a model
    with other weights is refused in one line, the file untouched."""
    copy, other = tmp_path / "copy", tmp_path / "other"
    shutil.copytree(SHIPPED_BASE, copy)
    shutil.copytree(SHIPPED_BASE, other)
    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(other / "model.safetensors")
    name = sorted(w)[0]
    w[name] = w[name] + torch.ones_like(w[name])
    save_file(w, other / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "g.jsonl"
    argv = ["evaluate", "--levels", "1x2", "--n", "2", "--max-new-tokens", "24", "--out", str(out)]
    assert main([*argv, "--model", str(SHIPPED_BASE)]) == 0
    whole = out.read_bytes()
    os.utime(copy / "model.safetensors", (1, 1))                       # another path, another modification time
    assert main([*argv, "--model", str(copy)]) == 0
    assert out.read_bytes() == whole
    capsys.readouterr()
    assert main([*argv, "--model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "holds an evaluation with other model" in err and len(err.strip().splitlines()) == 1, err
    assert out.read_bytes() == whole


# ---------------------------------------------------------------- 3. records that say what happened

@pytest.mark.slow
def test_a_resumed_grpo_run_logs_the_validation_curve_of_the_uninterrupted_run(tmp_path):
    """A resumed GRPO stage measured again at its resume step: one more validation point than the uninterrupted run."""
    grpo = ["train", "--preset", "laptop", "--method", "grpo", "--set", "max_steps=3", "--set", "save_steps=1",
            "--set", "n_train=16", "--set", "generation_batch_size=16", "--set", "per_device_train_batch_size=8",
            "--set", "max_completion_length=48", "--set", "validation_every=2", "--set", "validation_per_level=1",
            "--set", "validation_max_new_tokens=16", "--set", "keep_checkpoints=true", "--set", "save_total_limit=none"]
    whole, run = tmp_path / "whole", tmp_path / "cut"
    for r in (whole, run):
        assert main([*grpo, "--output-dir", str(r)]) == 0
    for p in (run / "checkpoint-2", run / "checkpoint-3", run / "final", run / "summary.json"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()         # killed after checkpoint-1
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert main([*grpo, "--output-dir", str(run), "--resume"]) == 0
    assert json.loads((run / "summary.json").read_text())["resumed_from"].endswith("checkpoint-1")

    def steps(r, log):
        return [json.loads(x)["step"] for x in (r / log).read_text().splitlines()]

    assert steps(whole, "validation.jsonl") == [0, 2, 3] and steps(run, "validation.jsonl") == [0, 2, 3]
    assert steps(run, "metrics.jsonl") == steps(whole, "metrics.jsonl")


def test_weights_swapped_into_a_finished_stages_final_are_refused(tmp_path):
    cfg = presets.LAPTOP.train_config("sft", model=str(SHIPPED_BASE), output_dir=str(tmp_path / "run"), max_steps=1,
                                      n_train=8)
    clock = steps.Clock(False)
    first = steps.train_stage(cfg, "sft", clock)
    assert first["final_weights"].startswith("sha256:")
    assert steps.train_stage(cfg, "sft", clock) == first            # reused as it is
    weights = tmp_path / "run" / "final" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                                       # other weights, the same size
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"run/final holds other weights than its training wrote .*--fresh$"):
        steps.train_stage(cfg, "sft", clock)


# ---------------------------------------------------------------- 4. one line, not a traceback

class _Planted:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "ran"))


@pytest.mark.parametrize("name,how", [("rng_state.pth", "pickle"), ("optimizer.pt", "pickle"),
                                      ("scheduler.pt", "pickle"), ("optimizer.pt", "cut"),
                                      ("model.safetensors", "cut")])
def test_a_planted_or_cut_checkpoint_file_is_one_line(tmp_path, capsys, name, how):
    run = killed(tmp_path / "run")
    f, sentinel = run / "checkpoint-2" / name, tmp_path / "SENTINEL"
    if how == "pickle":
        import torch

        torch.save({"state": _Planted(sentinel)}, f)
    else:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    before = snapshot(tmp_path)
    line = refused(capsys, [*TRAIN, "--output-dir", run, "--set", "keep_checkpoints=true", "--resume"],
                   f"checkpoint-2: {name} cannot be read safely")
    assert "delete" in line and not sentinel.exists()
    assert snapshot(tmp_path) == before


def test_pipeline_set_of_a_field_the_command_sets_names_the_flag(tmp_path, capsys):
    for key, flag in (("output_dir", "--runs-dir"), ("model", "--model"), ("method", "--stages"),
                      ("resume", "--fresh")):
        refused(capsys, [*PIPELINE, "--set", f"{key}=x", "--results-dir", tmp_path / "r", "--runs-dir", tmp_path / "w"],
                f"--set {key}=... is not taken by this command: use {flag}")
    refused(capsys, ["train", "--method", "sft", "--set", "method=dft", "--dry-run"], "use --method")
    refused(capsys, ["train", "--method", "sft", "--set", "output_dir=a", "--output-dir", tmp_path / "b", "--dry-run"],
            "output_dir is given twice (--set output_dir=... and --output-dir); give it once")
    with pytest.raises(ValueError, match=r"^overrides must not set output_dir: the plan sets each stage's; use runs_dir"):
        pipeline.plan("laptop", "runs", overrides={"output_dir": "x"})
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


def test_calibrate_a_cut_gzip_is_one_line(tmp_path, capsys):
    recs = "".join(json.dumps({"question": f"Calculate {a} * {a + 3}.", "answer": a * (a + 3),
                               "response": f"The answer is {a * (a + 3)}."}) + "\n" for a in range(10, 400))
    data = gzip.compress(recs.encode())
    (tmp_path / "g.jsonl.gz").write_bytes(data[: len(data) // 2])
    refused(capsys, ["calibrate", tmp_path / "g.jsonl.gz"], "g.jsonl.gz: the gzip data is cut or damaged")
    (tmp_path / "n.jsonl.gz").write_bytes(b"not gzip at all")
    refused(capsys, ["calibrate", tmp_path / "n.jsonl.gz"], "n.jsonl.gz: the gzip data is cut or damaged")


def test_load_results_on_a_deeply_nested_summary_is_one_line(tmp_path):
    (tmp_path / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"summary\.json cannot be read as a dsh record \(nested too deeply\)$"):
        pipeline.load_results(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"summary\.json is not a dsh record \(a JSON list\)$"):
        pipeline.load_results(tmp_path)


# ---------------------------------------------------------------- 5. bounds; 6. checks before work

@pytest.mark.parametrize("flag,setting,fragment", [
    ("--set", "max_steps=1e18", "max_steps must be an integer; got '1e18'"),
    ("--set", "max_steps=1000000000000000000", "max_steps must be an integer of at most 1,000,000 (optimizer steps: time)"),
    ("--set", "n_train=1e12", "n_train must be an integer; got '1e12'"),
    ("--set", "n_train=1000000000000", "n_train must be an integer of at most 1,000,000 (training problems built in memory)"),
    ("--attribution-set", "prompts_per_level=1e9", "prompts_per_level must be an integer; got '1e9'"),
    ("--attribution-set", "prompts_per_level=1000000000", "prompts_per_level must be an integer in 1..10,000"),
    ("--eval-set", "max_new_tokens=1e8", "max_new_tokens must be an integer; got '1e8'"),
    ("--eval-set", "max_new_tokens=100000000", "max_new_tokens must be an integer in 1..1,048,576"),
    ("--eval-set", "max_new_tokens=100000", "max_new_tokens must be at most the model's context of"),
    ("--eval-set", "levels=1x9", "levels[i] must be one of 1x2, 1x3"),
    ("--set", "trust_remote_code=maybe", "trust_remote_code must be true or false; got 'maybe'"),
])
def test_pipeline_sizes_and_settings_are_refused_before_any_stage_trains(tmp_path, capsys, flag, setting, fragment):
    refused(capsys, [*PIPELINE, flag, setting, "--results-dir", tmp_path / "r", "--runs-dir", tmp_path / "w"], fragment)
    assert list(tmp_path.iterdir()) == []                   # nothing trained, nothing written


def test_nested_results_and_runs_folders_are_refused(tmp_path, capsys):
    for results, runs in ((tmp_path / "w" / "r", tmp_path / "w"), (tmp_path / "r", tmp_path / "r" / "w")):
        refused(capsys, [*PIPELINE, "--results-dir", results, "--runs-dir", runs], "must not lie inside")
    assert list(tmp_path.iterdir()) == []


def test_a_second_pipeline_on_a_runs_folder_in_use_is_refused(tmp_path, capsys):
    """A second pipeline with --fresh deleted the first one's run folder; the first then died."""
    runs = tmp_path / "w"
    runs.mkdir()
    (runs / "keep.txt").write_text("x")       # would be refused by the claim check too; the lock comes first
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, signal, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); signal.pause()"), str(tmp_path / ".w.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        refused(capsys, [*PIPELINE, "--fresh", "--results-dir", tmp_path / "r", "--runs-dir", runs],
                f"runs_dir {runs} is in use by another dsh pipeline; wait for it or choose another runs_dir")
    finally:
        holder.kill()
        holder.wait()
    assert (runs / "keep.txt").read_text() == "x"


def test_chapter_sizes_are_bounded_in_the_functions_they_call():
    from dsh.theory import mdp, toy_grpo

    with pytest.raises(ValueError, match=r"^steps must be an integer in 1\.\.100,000 \(simulated steps: time\); "
                                         r"got 1,000,000,000$"):
        toy_grpo.ToyGRPOConfig(steps=10 ** 9)
    with pytest.raises(ValueError, match=r"^the MDP has more than 200000 trajectories"):
        mdp.FiniteTwoStageMDP(vocab_size=10 ** 9, attempt_length=10 ** 9)
    with pytest.raises(ValueError, match=r"^n_train must be an integer of at most 1,000,000 \(training problems"):
        train_config.TrainConfig(n_train=10 ** 12)


@pytest.mark.parametrize("argv,fragment", [
    (["probe", "--model", "laptop-base", "--out", "{tmp}/p.json", "--n", "100000000"],
     "n_per_level must be an integer in 1..1,000,000"),
    (["budgets", "--n", "1000000000"], "n_per_level must be an integer in 1..100,000"),
])
def test_the_other_commands_sizes_are_bounded(tmp_path, capsys, argv, fragment):
    refused(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv], fragment)
    assert list(tmp_path.iterdir()) == []
