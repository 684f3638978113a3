"""The pipeline's steps on several workers: every step runs once, after the steps it needs; a failing step stops the
run with its own error; two workers of one thread give what one worker of one thread gives, side by side."""

import json
import os
import time
from pathlib import Path

import pytest

from dsh.core.files import read_json
from dsh.experiment.run import pipeline, steps, workers
from dsh.experiment.run.workers import Step, run_steps


def _note(folder, name, needs=(), clock=None):
    """A step that checks what it needs is there, then leaves its own mark (and which process wrote it)."""
    for n in needs:
        assert (Path(folder) / n).is_file(), f"{name} ran before {n}"
    time.sleep(0.2)
    (Path(folder) / name).write_text(str(os.getpid()))
    clock.timings[name] = 0.2
    clock.worked = True
    return name.upper()


def _fail(clock=None):
    raise ValueError("this step fails")


def _chain(folder):
    # a -> b -> d, c alone, e after c and d
    return [Step("a", _note, (folder, "a")), Step("b", _note, (folder, "b", ("a",)), ("a",)),
            Step("c", _note, (folder, "c")), Step("d", _note, (folder, "d", ("b",)), ("b",), cost=5.0),
            Step("e", _note, (folder, "e", ("c", "d")), ("c", "d"))]


@pytest.mark.parametrize("n", [1, 2])
def test_every_step_runs_once_after_what_it_needs(tmp_path, n):
    clock = steps.Clock(False)
    out, schedule = run_steps(_chain(tmp_path), clock, workers=n, threads=1)
    assert out == {k: k.upper() for k in "abcde"}
    assert sorted(r["step"] for r in schedule) == list("abcde") and clock.worked
    assert set(clock.timings) == set("abcde")
    when = {r["step"]: r for r in schedule}
    for first, then in (("a", "b"), ("b", "d"), ("c", "e"), ("d", "e")):
        assert when[first]["end_s"] <= when[then]["start_s"]
    pids = {int((tmp_path / k).read_text()) for k in "abcde"}
    assert (pids == {os.getpid()}) == (n == 1)      # one worker: this process; two: worker processes


def test_the_longest_chain_starts_first():
    chain = _chain("/nowhere")
    prio = workers._priorities(chain)
    assert prio == {"a": 8.0, "b": 7.0, "c": 2.0, "d": 6.0, "e": 1.0}


@pytest.mark.parametrize("n", [1, 2])
def test_a_failing_step_stops_the_run_with_its_error(tmp_path, n):
    chain = [Step("x", _fail, ()), *_chain(tmp_path)[:2]]
    chain[2] = Step("b", _note, (tmp_path, "b", ("a",)), ("a", "x"))
    with pytest.raises(ValueError, match="^this step fails$"):
        run_steps(chain, steps.Clock(False), workers=n, threads=1)
    assert not (tmp_path / "b").exists()       # what needed the failed step never ran


def test_bad_steps_and_layouts_are_refused():
    with pytest.raises(ValueError, match="^a: after must be one of"):
        run_steps([Step("a", _note, (), ("nothing",))], steps.Clock(False))
    n = workers.cores()
    for bad in (0, n + 1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"^workers must be an integer from 1 to {n} "):
            workers.check_workers(bad)
    with pytest.raises(ValueError, match="^threads must be an integer from 1 to "):
        workers.check_workers(1, n + 1)
    assert workers.check_workers(1) == (1, None) and workers.check_workers(1, 1) == (1, 1)


@pytest.mark.slow
@pytest.mark.skipif(workers.cores() < 2, reason="two workers need two cores")
def test_two_workers_give_what_one_worker_of_the_same_threads_gives(tmp_path):
    """Two trainings side by side, each with its evaluation job and study: the same weights, calibrations and
    generations as one worker with one thread, in two processes whose trainings overlap."""
    small = dict(seeds=(0,), ablation_seeds=(), stages=("sft-s0", "dft-s0"), overrides={"max_steps": 2},
                 eval_overrides={"levels": ("1x2",), "n_per_level": 2}, progress=False,
                 attribution_overrides={"levels": ("1x2",), "prompts_per_level": 1, "group": 2, "max_new_tokens": 120,
                                        "min_signal": 0})
    got = {}
    for n in (2, 1):
        root = tmp_path / f"w{n}"
        got[n] = pipeline.run_pipeline("laptop", results_dir=str(root / "results"), runs_dir=str(root / "runs"),
                                       workers=n, threads=1, **small)
    for stage in ("sft-s0", "dft-s0"):
        assert got[2]["training"][stage]["final_weights"] == got[1]["training"][stage]["final_weights"]
        assert got[2]["training"][stage]["hardware"]["torch_threads"] == 1
        for rel in (f"calibration/{stage}.json", f"generations/{stage}.jsonl.gz"):
            assert (tmp_path / "w2" / "results" / rel).read_bytes() == (tmp_path / "w1" / "results" / rel).read_bytes()
        studies = [read_json(tmp_path / f"w{n}" / "results" / "attribution" / f"{stage}.json.gz") for n in (2, 1)]
        assert [s["fits"] for s in studies][0] == [s["fits"] for s in studies][1]
    assert got[2]["workers"]["workers"] == 2 and got[1]["workers"]["threads"] == 1
    rows = {r["step"]: r for r in got[2]["schedule"]}
    assert len(rows) == 6            # two trainings, two jobs, two studies
    a, b = rows["train sft-s0"], rows["train dft-s0"]
    assert a["worker"] != b["worker"] and max(a["start_s"], b["start_s"]) < min(a["end_s"], b["end_s"])
    assert json.loads((tmp_path / "w2" / "results" / "summary.json").read_text())["schedule"]


def test_one_worker_gives_its_threads_back():
    import torch

    before = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    run_steps([Step("t", _threads, ())], steps.Clock(False), workers=1, threads=1)
    assert (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")) == before


def _threads(clock=None):
    import torch

    assert torch.get_num_threads() == 1


def test_the_schedule_is_drawn_one_row_a_worker_one_bar_a_step():
    import matplotlib

    matplotlib.use("Agg")
    from dsh.experiment import report

    schedule = [{"step": "train a", "start_s": 0, "end_s": 60, "worker": 7},
                {"step": "job a", "start_s": 60, "end_s": 90, "worker": 7},
                {"step": "train b", "start_s": 0, "end_s": 120, "worker": 9}]
    ax = report.plot_schedule(schedule).axes[0]
    bars = sorted((p.get_y() + p.get_height() / 2, p.get_x(), p.get_width()) for p in ax.patches)
    assert bars == [(0, 0, 1.0), (0, 1.0, 0.5), (1, 0, 2.0)]     # worker 7 first (ties by first start), minutes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["worker 1", "worker 2"]
    for bad in ([], [{"step": "x"}], None):
        with pytest.raises(ValueError, match="^schedule must be"):
            report.plot_schedule(bad)


def test_the_schedule_summary_gives_the_wall_time_the_filled_share_and_each_kinds_share():
    from dsh.experiment import report

    schedule = [{"step": "train a", "start_s": 0, "end_s": 60, "worker": 7},
                {"step": "job a", "start_s": 60, "end_s": 90, "worker": 7},
                {"step": "study a", "start_s": 90, "end_s": 100, "worker": 7},
                {"step": "train b", "start_s": 0, "end_s": 100, "worker": 9}]
    got = report.schedule_summary(schedule, 2)
    assert got["wall_s"] == 100 and got["busy_s"] == 200 and got["filled"] == 1.0
    assert got["by_kind"] == {"train": 0.8, "job": 0.15, "study": 0.05}
    assert report.schedule_summary(schedule[:1], 2)["filled"] == 0.5
    for bad in ([], [{"step": "x"}], None):
        with pytest.raises(ValueError, match="^schedule must be"):
            report.schedule_summary(bad, 2)
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="^workers must be"):
            report.schedule_summary(schedule, bad)

