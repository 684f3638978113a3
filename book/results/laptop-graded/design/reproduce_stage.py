"""Train one committed stage of the graded laptop experiment again at this checkout and compare its final weights
with the committed record's digest (book/results/laptop-graded/summary.json): does today's code reproduce the
committed model bit for bit, and in how much time? Run from the repository root with the project's venv, nothing else
running, round 5's run folders present (runs/graded-r5/runs: the stage's starting model):

    python book/results/laptop-graded/design/reproduce_stage.py rl-s1

Writes reproduce_<stage>.json beside this file (the run goes to /tmp/reproduce-<stage>, not committed). The
committed record's times were measured on another day: the two times compare hosts as well as code."""
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = Path("runs/graded-r5/runs")


def main(stage: str) -> dict:
    from dsh.core.provenance import hardware
    from dsh.training.train import train
    from dsh.training.train_config import TrainConfig

    summary = json.loads((HERE.parent / "summary.json").read_text())
    if stage not in summary["configs"]:
        raise SystemExit(f"stage must be one of {', '.join(summary['configs'])}; got {stage!r}")
    cfg = dict(summary["configs"][stage])
    cfg["model"] = cfg["model"].replace("<runs_dir>", str(RUNS))
    cfg["output_dir"] = f"/tmp/reproduce-{stage}"
    t = time.time()
    out = train(TrainConfig(**cfg))
    rec = summary["training"][stage]
    keys = ("wall_s", "generation_s", "scoring_s", "update_s")
    got = {"stage": stage, "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(time.time() - t, 1),
           "run": {k: out.get(k) for k in keys}, "committed": {k: rec.get(k) for k in keys},
           "final_weights": out.get("final_weights"), "committed_weights": rec["final_weights"],
           "identical": out.get("final_weights") == rec["final_weights"], "hardware": hardware()}
    (HERE / f"reproduce_{stage}.json").write_text(json.dumps(got, indent=1) + "\n")
    return got


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1]), indent=1))
