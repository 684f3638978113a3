"""p_s, p_dC, p_dW along a training run (dsh.training.validation): measured at the right steps, on questions apart
from the test set, equal to a measurement of the saved model, and not repeated on a resume."""

import json

import pytest

from dsh.experiment.run import presets
from dsh.llm.models import load
from dsh.measure import tasks
from dsh.task import laptop_task as lt
from dsh.training import validation
from dsh.training.laptop_base import SHIPPED_BASE
from dsh.training.train import train


def test_validation_questions_are_fixed_and_apart_from_the_test_questions():
    t = tasks.get("laptop_task")
    qs = t.validation_questions(("1x2", "2x1", "1x3"), 40)
    assert [p.level for p in qs] == ["1x2"] * 40 + ["2x1"] * 40 + ["1x3"] * 40
    assert qs == t.validation_questions(("1x2", "2x1", "1x3"), 40)
    test = lt.held_out(both_orders=True)
    assert not {(p.a, p.b) for p in qs} & test
    # the traces task keeps its own test questions out too, in both orders
    tr = tasks.get("traces")
    assert not {(p.a, p.b) for p in tr.validation_questions(("3x3",), 50)} & tr.held_out()
    with pytest.raises(ValueError, match="^n_per_level must be an integer >= 1"):
        t.validation_questions(("1x2",), 0)


def test_bad_validation_settings_are_refused():
    for k, x in (("validation_every", -1), ("validation_per_level", 0), ("validation_max_new_tokens", 0)):
        with pytest.raises(ValueError, match=f"^{k} must be an integer"):
            presets.LAPTOP.train_config("grpo", output_dir="/tmp/never-written", **{k: x})


@pytest.mark.slow
def test_grpo_measures_along_the_run_and_the_last_row_is_the_saved_model(tmp_path):
    run = tmp_path / "rl"
    cfg = presets.LAPTOP.train_config(
        "grpo", model=str(SHIPPED_BASE), output_dir=str(run), seed=3, train_levels=("1x2", "1x3"), n_train=16,
        max_steps=3, per_device_train_batch_size=8, generation_batch_size=16, num_generations=8,
        max_completion_length=96, save_steps=100, validation_every=2, validation_per_level=6, learning_rate=1e-3)
    train(cfg)
    rows = validation.read_log(run / "validation.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 3]           # before, every 2 steps, after the last
    for r in rows:
        assert r["n"] == 12 and 0 <= r["observed_accuracy"] <= 1 and r["ci_low"] <= r["observed_accuracy"]
    # second route: the saved model measured again on the same questions and streams gives the last row, and the
    # starting model gives the first
    qs = tasks.get("laptop_task").validation_questions(("1x2", "1x3"), 6)
    for model, row in ((run / "final", rows[-1]), (SHIPPED_BASE, rows[0])):
        m, tok = load(str(model))
        again = validation.measure(m, tok, qs, "laptop_task", cfg.temperature, 96, seed=3)
        assert json.dumps(again, sort_keys=True) == json.dumps({k: row[k] for k in again}, sort_keys=True)
    # a step already measured (a resumed run) is not measured twice
    m, tok = load(str(run / "final"))
    cb = validation.make_callback(tok, qs, "laptop_task", 2, cfg.temperature, 96, run / "validation.jsonl", seed=3)

    class State:
        is_world_process_zero, global_step, max_steps = True, 3, 3

    cb.on_step_end(None, State(), None, model=m)
    assert len((run / "validation.jsonl").read_text().splitlines()) == 3


def test_a_resume_drops_the_killed_runs_log_lines_past_its_checkpoint(tmp_path):
    """A resumed run's metrics and validation logs hold each step once (the killed run's lines after the
    checkpoint, and a line the kill cut short, are dropped before the run logs them again)."""
    from dsh.training.run_dir import trim_logs

    rows = [{"step": k, "reward": k / 10} for k in range(1, 8)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "rew')
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps({"step": k}) + "\n" for k in (0, 4, 8)))
    trim_logs(tmp_path, 4)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert [r["step"] for r in validation.read_log(tmp_path / "validation.jsonl")] == [0, 4]
    assert not list(tmp_path.glob("*.tmp"))
    trim_logs(tmp_path / "missing", 4)          # nothing to trim: nothing happens
