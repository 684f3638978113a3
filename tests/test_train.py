"""Training through TRL on the embedded model (CPU, `ci` preset), presets, resume, evaluation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from killed_after_save import run_killed_after_save

from dsh.core.paper import paper_results
from dsh.experiment.report.paper_mapping import paper_mapping
from dsh.experiment.run import evaluate, presets
from dsh.llm import models
from dsh.measure import calibration
from dsh.training import run_dir, train, train_config

pytestmark = pytest.mark.slow   # loads or trains the embedded model (make check leaves it out)

ROOT = Path(__file__).resolve().parent.parent


def test_unknown_names_fail_before_loading():
    with pytest.raises(ValueError, match="^preset must be one of ci, gpu-small, paper"):
        presets.resolve("sft", "fast")
    with pytest.raises(ValueError, match="^method must be one of sft, sft_reflection, dft, grpo"):
        presets.resolve("ppo", "ci")
    with pytest.raises(ValueError, match="^unknown field\\(s\\) lr; valid fields: method, model"):
        presets.resolve("sft", "ci", lr=1e-3)
    with pytest.raises(ValueError, match="^learning_rate must be a positive number"):
        presets.resolve("sft", "ci", learning_rate=0)
    with pytest.raises(ValueError, match="^generation_batch_size must be a multiple of num_generations"):
        presets.resolve("grpo", "ci", num_generations=3)


def test_paper_preset_matches_the_papers_tables():
    hp = paper_results()["hyperparameters"]
    sft = train_config.to_trl_config(presets.resolve("sft_reflection", "paper", output_dir="/tmp/never-written"))
    grpo = train_config.to_trl_config(presets.resolve("grpo", "paper", output_dir="/tmp/never-written"))
    assert sft.learning_rate == hp["sft"]["learning_rate"]
    assert sft.per_device_train_batch_size * sft.gradient_accumulation_steps == hp["sft"]["batch_size"]
    assert sft.num_train_epochs == hp["sft"]["epochs"]
    assert sft.weight_decay == 0.0 and "adam" in str(sft.optim).lower()
    assert grpo.learning_rate == hp["grpo"]["learning_rate"]
    assert grpo.num_generations == hp["grpo"]["rollouts_per_query"]
    assert grpo.generation_batch_size == hp["grpo"]["train_batch_size"] * hp["grpo"]["rollouts_per_query"]
    assert grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps == \
        hp["grpo"]["ppo_mini_batch_size"] * hp["grpo"]["rollouts_per_query"]
    assert grpo.beta == hp["grpo"]["kl_loss_coef"] and grpo.use_bias_correction_kl is False
    assert grpo.max_completion_length == hp["grpo"]["max_response_length"]
    assert grpo.num_train_epochs == hp["grpo"]["total_epochs"]
    assert grpo.gradient_checkpointing is hp["grpo"]["gradient_checkpointing"]
    assert grpo.temperature == paper_results()["evaluation"]["temperature"]
    rows = paper_mapping()
    assert {r["hyperparameter"] for r in rows} >= {"Optimizer", "Batch size", "KL loss type", "Max prompt length"}
    assert not Path("/tmp/never-written").exists()


def test_bad_model_writes_nothing(tmp_path):
    cfg = presets.resolve("sft", "ci", model=str(tmp_path / "missing"), output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="does not exist"):
        train.train(cfg)
    assert not (tmp_path / "run").exists()
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text("{}")
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="safetensors only"):
        models.resolve_model(str(tmp_path / "pickled"))
    with pytest.raises(ValueError, match="safetensors only"):                # a pathlib.Path is read the same
        models.resolve_model(tmp_path / "pickled")
    from dsh.training.laptop_base import SHIPPED_BASE

    assert models.resolve_model(SHIPPED_BASE) == models.resolve_model(str(SHIPPED_BASE))
    with pytest.raises(ValueError, match="^model must be 'embedded', 'laptop-base', a Hugging Face id"):
        models.resolve_model(3)


@pytest.fixture(scope="module")
def ci_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for m in ("sft", "sft_reflection", "dft"):
        out[m] = train.train(presets.resolve(m, "ci", output_dir=str(root / m)))
    # 96 new tokens instead of the ci budget: this test is about the update, not the budget (chapter 04 runs
    # the preset as it is), and it keeps the CPU test time down
    out["grpo"] = train.train(presets.resolve("grpo", "ci", model=str(root / "sft_reflection"),
                                              output_dir=str(root / "grpo"), max_completion_length=96))
    return root, out


@pytest.mark.full   # make test-all: the ci preset trains the embedded model (~250 s); make test trains the laptop models
@pytest.mark.parametrize("method", ["sft", "sft_reflection", "dft"])
def test_ci_sft_methods_learn_and_load_back(ci_runs, method):
    root, out = ci_runs
    s = out[method]
    assert s["global_step"] == 4
    assert s["last_loss"] < s["first_loss"]          # the loss moves down
    run = root / method
    assert (run / "run_config.json").is_file() and (run / "summary.json").is_file()
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2, 3, 4]
    assert list((run / "runs").rglob("events.out.tfevents*"))
    cfg = json.loads((run / "run_config.json").read_text())
    assert cfg["trl"]["loss_type"] == ("dft" if method == "dft" else "nll")
    m, tok = models.load(str(run))
    base, _ = models.load("embedded")
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(dict(m.named_parameters())[name], dict(base.named_parameters())[name])
    enc = tok(["Calculate 12 * 34. Think step by step."], return_tensors="pt")
    o = m.generate(**enc, max_new_tokens=8, do_sample=False)
    assert o.shape[1] > enc["input_ids"].shape[1]
@pytest.mark.full   # make test-all: the ci preset trains the embedded model (~250 s); make test trains the laptop models
def test_ci_grpo_moves_the_policy(ci_runs):
    """Two Adam steps with a real gradient move (almost) every parameter by about the learning rate each:
    the largest change is between 0.9 lr and 2 lr (+5 %), and more than 90 % of the parameters changed. Fails if
    no gradient reached the model (all groups without reward variance and no KL), if the learning rate or
    the number of steps is not what the config says, or if only a subset (e.g. a frozen body) trained."""
    root, out = ci_runs
    s = out["grpo"]
    assert s["global_step"] == 2
    metrics = [json.loads(x) for x in (root / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward" in m for m in metrics)
    start, _ = models.load(str(root / "sft_reflection"))
    end, _ = models.load(str(root / "grpo"))
    deltas = [(a - b).detach().abs() for a, b in zip(start.parameters(), end.parameters())]
    cfg = json.loads((root / "grpo" / "run_config.json").read_text())
    lr, steps = cfg["trl"]["learning_rate"], s["global_step"]
    biggest = max(d.max().item() for d in deltas)
    assert 0.9 * lr <= biggest <= steps * lr * 1.05, (biggest, lr)
    changed = sum((d > 0).sum().item() for d in deltas) / sum(d.numel() for d in deltas)
    assert changed > 0.9, changed
    assert cfg["trl"]["beta"] == 0.001 and cfg["trl"]["use_bias_correction_kl"] is False
    assert cfg["trl"]["temperature"] == 1.0
    assert s["generation_backend"] == "dsh" and s["generation_s"] > 0     # rollouts through dsh.llm.engine
    t = s["truncation"]                                                  # GRPO's budget and signal, reported
    assert t["limit"] == 96 and 0 <= t["clipped_rate"] <= 1 and 0 <= t["zero_std_groups_first"] <= 1


@pytest.mark.full   # make test-all: LoRA on the embedded model (~22 s), the GPU presets' option
def test_lora_option(tmp_path):
    s = train.train(presets.resolve("sft", "ci", output_dir=str(tmp_path / "lora"), lora=True, max_steps=2,
                                    learning_rate=1e-3))
    assert s["global_step"] == 2
    m, _ = models.load(str(tmp_path / "lora"))          # merged: loads as a plain model
    assert not any("lora" in n for n, _ in m.named_parameters())


def test_existing_run_is_not_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a run; pass resume=True"):
        train.train(presets.resolve("sft", "ci", output_dir=str(tmp_path / "run")))


@pytest.mark.full   # make test-all: kill and resume on the embedded model (~100 s); make test: on the laptop model, below
def test_resume_after_kill_reaches_the_same_final_step(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dsh", "train", "--method", "sft", "--preset", "ci", "--output-dir", str(run),
           "--set", "max_steps=6"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run_killed_after_save(cmd, 2, env)
    assert (run / "checkpoint-2" / run_dir.TOTALS).is_file() and not (run / "final").exists()
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 6
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert (run / "final" / "model.safetensors").is_file()
    assert not list(run.glob("checkpoint-*"))        # removed once the run finished
@pytest.mark.full   # make test-all: the ci preset trains the embedded model (~250 s); make test trains the laptop models
def test_evaluate_resumes_and_feeds_calibrate(ci_runs, tmp_path):
    root, _ = ci_runs
    out = tmp_path / "gen.jsonl"
    settings = evaluate.EvalSettings(levels=["2x2", "3x3"], n_per_level=2, max_new_tokens=24, batch_size=4)
    evaluate.evaluate(str(root / "sft_reflection"), out=str(out), settings=settings, progress=False)
    lines = out.read_text().splitlines()
    assert len(lines) == 4
    out.write_text("\n".join(lines[:2]) + "\n" + lines[2][:17])     # an interruption mid-line
    evaluate.evaluate(str(root / "sft_reflection"), out=str(out), settings=settings, progress=False)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 4 and len({(r["level"], r["index"]) for r in recs}) == 4
    assert recs[:2] == [json.loads(x) for x in lines[:2]]
    assert all(r["completion_tokens"] <= 24 for r in recs)
    r = subprocess.run([sys.executable, "-m", "dsh", "calibrate", str(out), "--json"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["overall"]["n"] == 4 and set(res["by_level"]) == {"2x2", "3x3"}
    assert calibration.calibrate(recs, n_bootstrap=5)["overall"]["n"] == 4


@pytest.mark.parametrize("kwargs,msg", [
    (dict(model="/no/such/model"), "does not exist"),
    (dict(settings=evaluate.EvalSettings(levels=["3x3", "three"])), "^level must look like '3x5'"),
    (dict(settings=evaluate.EvalSettings(n_per_level=0)), "^n_per_level must be"),
    (dict(settings={"n_per_level": 1}), "^settings must be a dsh.experiment.run.evaluate.EvalSettings"),
    (dict(backend="tgi"), "^backend must be one of auto, dsh, hf, vllm"),
])
def test_evaluate_bad_input_writes_nothing(tmp_path, kwargs, msg):
    out = tmp_path / "gen.jsonl"
    with pytest.raises(ValueError, match=msg):
        evaluate.evaluate(**{"model": "embedded", "out": str(out), **kwargs})
    assert not out.exists()
@pytest.mark.full   # make test-all: the ci preset trains the embedded model (~250 s); make test trains the laptop models
def test_ci_losses_unchanged_by_refactoring(ci_runs):
    """The ci runs' losses equal those recorded before the first refactor (tests/reference/unchanged.json,
    written by the code of that time): same seeds, same data, same training."""
    root, _ = ci_runs
    ref = json.loads((ROOT / "tests" / "reference" / "unchanged.json").read_text())["training_losses"]
    for method, want in ref.items():
        rows = [json.loads(x) for x in (root / method / "metrics.jsonl").read_text().splitlines()]
        got = [[r["step"], r["loss"]] for r in rows if "loss" in r]
        assert [s for s, _ in got] == [s for s, _ in want], method
        assert [x for _, x in got] == pytest.approx([x for _, x in want], rel=2e-3), method


@pytest.mark.slow
def test_a_resumed_run_has_the_summary_of_an_uninterrupted_one(tmp_path):
    """Killed at a checkpoint and resumed, a run's train_loss and real_tokens counted the resumed steps
    only (here: 3.3e-06 vs 5.5e-06 and 844 vs 2,755 tokens); now every field but the wall times (and the tokens/s
    read from them) and the checkpoint it resumed from equals the uninterrupted run's."""
    def cmd(out):
        return [sys.executable, "-m", "dsh", "train", "--method", "sft", "--preset", "laptop", "--output-dir", str(out),
                "--set", "max_steps=6", "--set", "save_steps=2", "--set", "n_train=64", "--set", "logging_steps=1"]

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(cmd(tmp_path / "a"), check=True, capture_output=True, env=env)
    run_killed_after_save(cmd(tmp_path / "b"), 4, env)
    assert not (tmp_path / "b" / "final").exists()
    subprocess.run(cmd(tmp_path / "b") + ["--resume"], check=True, capture_output=True, env=env)
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    assert b["resumed_from"].endswith("checkpoint-4") and a["resumed_from"] is None
    drop = ("wall_s", "tokens_per_s", "resumed_from", "hardware")
    assert {k: x for k, x in b.items() if k not in drop} == {k: x for k, x in a.items() if k not in drop}
    # what the embedded model's kill test (make test-all) asserts, here on the laptop model
    assert b["global_step"] == 6 and (tmp_path / "b" / "final" / "model.safetensors").is_file()
    assert not list((tmp_path / "b").glob("checkpoint-*"))        # removed once the run finished
