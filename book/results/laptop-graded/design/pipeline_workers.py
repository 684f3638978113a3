"""The pipeline on two workers of one thread each against one worker of two threads, on the stages two_workers.py
did not measure: the fine-tuning stages and their evaluation jobs. A measurement for the pipeline's time (not a
result of the experiment). Run from the repository root with the project's venv, nothing else running:

    python book/results/laptop-graded/design/pipeline_workers.py

Each trial runs ``python -m dsh pipeline --preset laptop-graded --stages STAGES`` into fresh folders twice: with
``--workers 1`` (torch's two threads) and with ``--workers 2`` (one thread each); the order of the two layouts
alternates from trial to trial, as the host's speed drifts. STAGES are SFT, SFT (reflection) and DFT of seeds 1 and 2
(the seed-0 stages carry attribution studies, which two_workers.py's GRPO measurement and restudy.json already
time): six trainings from the shipped graded base and six evaluation jobs (evaluation, calibration, probe).
Writes pipeline_workers.json beside this file: per run its wall time (the command's), load before it, each step's
time and worker from the run's summary, and each stage's final weights digest, which chapter 07 sets against the
committed run's (the two-thread runs should give the committed weights; the one-thread runs other ones)."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = ("sft-s1", "sft_reflection-s1", "dft-s1", "sft-s2", "sft_reflection-s2", "dft-s2")
TRIALS = 2
LAYOUTS = (1, 2)      # --workers


def run(workers: int, tmp: str) -> dict:
    out = Path(tmp) / f"w{workers}-{time.time_ns()}"
    load, t0 = os.getloadavg()[0], time.time()
    subprocess.run([sys.executable, "-m", "dsh", "pipeline", "--preset", "laptop-graded", "--stages", ",".join(STAGES),
                    "--results-dir", str(out / "results"), "--runs-dir", str(out / "runs"), "--workers", str(workers),
                    "--quiet"], check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    s = json.loads((out / "results" / "summary.json").read_text())
    return {"workers": workers, "threads": s["workers"]["threads"], "wall_s": round(wall, 1),
            "load_before": round(load, 2), "schedule": s["schedule"],
            "final_weights": {k: x["final_weights"] for k, x in s["training"].items()},
            "train_s": {k: x["wall_s"] for k, x in s["training"].items()},
            "jobs": {k: x["model"] for k, x in s["jobs"].items()}}


def main() -> int:
    from dsh.core.provenance import git_commit, hardware

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(TRIALS):
            for w in (LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]):
                runs.append({"trial": i, **run(w, tmp)})
                print(json.dumps({k: runs[-1][k] for k in ("trial", "workers", "wall_s", "load_before")}), flush=True)
    out = {"stages": list(STAGES), "runs": runs, "commit": git_commit(), "hardware": hardware(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "pipeline_workers.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
