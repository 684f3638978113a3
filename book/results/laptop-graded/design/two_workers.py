"""Two GRPO stages side by side on one thread each, against one after the other on both threads: does the 2-core
machine do more work as two workers? A measurement for the pipeline's time (not a result of the experiment). Run from
the repository root with the project's venv, nothing else running, round 5's run folders present
(runs/graded-r5/runs: the stages' starting models):

    python book/results/laptop-graded/design/two_workers.py

Each trial trains rl-s1 and rl-s2 (their committed configurations, ``STEPS`` steps: three rounds of 256 rollouts,
no validation passes, no checkpoints) twice: one after the other with two threads, then both at once with one
thread each (each a process of its own; ``OMP_NUM_THREADS`` and torch's threads set), ``TRIALS`` trials; the order of
the two layouts alternates from trial to trial, as the host's speed drifts. Writes two_workers.json beside this
file: each run's wall time, its generation, scoring and update seconds, its final weights' digest, and per trial
the two layouts' wall times (from the first process started to the last one ended)."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = Path("runs/graded-r5/runs")
STAGES = ("rl-s1", "rl-s2")
STEPS = 24
TRIALS = 2

CHILD = r"""
import json, sys, time, torch
stage, threads, steps, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
from dsh.training.train import train
from dsh.training.train_config import TrainConfig
cfg = dict(json.load(open("book/results/laptop-graded/summary.json"))["configs"][stage])
cfg.update(model=cfg["model"].replace("<runs_dir>", "runs/graded-r5/runs"), output_dir=out_dir, max_steps=steps,
           save_steps=100_000, validation_every=100_000)
t = time.time()
out = train(TrainConfig(**cfg))
print(json.dumps({"stage": stage, "threads": torch.get_num_threads(), "train_s": round(time.time() - t, 1),
                  **{k: round(out[k], 1) for k in ("generation_s", "scoring_s", "update_s")},
                  "final_weights": out["final_weights"]}))
"""


def start(stage: str, threads: int, tmp: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-c", CHILD, stage, str(threads), str(STEPS),
                             str(Path(tmp) / f"{stage}-{threads}-{time.time_ns()}")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(procs) -> list[dict]:
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a training run failed (exit {p.returncode})")
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


def layout(kind: str, tmp: str) -> dict:
    load, t0 = os.getloadavg()[0], time.time()
    if kind == "one after the other, 2 threads":
        runs = []
        for s in STAGES:
            runs += finish([start(s, 2, tmp)])
    else:
        runs = finish([start(s, 1, tmp) for s in STAGES])
    return {"layout": kind, "wall_s": round(time.time() - t0, 1), "load_before": round(load, 2), "runs": runs}


def main() -> int:
    from dsh.core.provenance import git_commit, hardware

    kinds = ("one after the other, 2 threads", "side by side, 1 thread each")
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(TRIALS):
            for kind in (kinds if i % 2 == 0 else kinds[::-1]):
                trials.append({"trial": i, **layout(kind, tmp)})
                print(json.dumps({k: x for k, x in trials[-1].items() if k != "runs"}), flush=True)
    out = {"stages": list(STAGES), "steps": STEPS, "trials": trials, "commit": git_commit(), "hardware": hardware(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "two_workers.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
