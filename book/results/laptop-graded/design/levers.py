"""Three levers for the pipeline's time, measured on the committed models (not results of the experiment). Run from
the repository root with the project's venv, nothing else running, round 5's run folders present
(runs/graded-r5/runs):

    python book/results/laptop-graded/design/levers.py

- ``scoring``: GRPO's reference scoring with bfloat16 products (``scoring_precision``) against float32: rl-s1's
  committed configuration from its committed starting model, ``GRPO_STEPS`` steps (two rounds), one thread (a
  worker's), no validation passes; the two alternate ``TRIALS`` times.
- ``sft_attention``: a fine-tuning stage's packed attention by dsh's C kernels against torch's call per example
  (``packed_attention``): sft_reflection-s1's configuration, ``SFT_STEPS`` steps, one thread, alternating.
- ``studies``: two attribution studies' first round (sft-s0's and dft-s0's committed settings, ``max_rounds`` 1) one
  after the other on two threads against side by side on one thread each, alternating.
Each run is a process of its own (``OMP_NUM_THREADS`` and torch's threads set). Writes levers.json beside this file:
every run's wall time and its parts, and the layouts' wall times per trial."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRPO_STEPS, SFT_STEPS, TRIALS = 16, 150, 2

TRAIN = r"""
import json, sys, time, torch
stage, threads, steps, out_dir, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
torch.set_num_threads(threads)
from dsh.training.train import train
from dsh.training.train_config import TrainConfig
cfg = dict(json.load(open("book/results/laptop-graded/summary.json"))["configs"][stage])
cfg.update(model=cfg["model"].replace("<runs_dir>", "runs/graded-r5/runs"), output_dir=out_dir, max_steps=steps,
           save_steps=100_000,
           validation_every=100_000 if cfg["method"] == "grpo" else cfg["validation_every"], **extra)
t = time.time()
out = train(TrainConfig(**cfg))
print(json.dumps({"stage": stage, "threads": torch.get_num_threads(), **extra, "train_s": round(time.time() - t, 1),
                  **{k: round(out[k], 1) for k in ("generation_s", "scoring_s", "update_s") if out.get(k) is not None},
                  "tokens_per_s": out.get("tokens_per_s"), "final_weights": out["final_weights"]}))
"""

STUDY = r"""
import gzip, json, sys, time, torch
stage, threads, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(threads)
from dsh.experiment.run import attribution_study as st
rec = json.load(gzip.open(f"book/results/laptop-graded/attribution/{stage}.json.gz"))
where = lambda m: "runs/graded-r5/runs/" + m.split("/", 1)[1] if m.startswith("<runs_dir>/") else m
settings = st.StudySettings(**{**{k: tuple(x) if isinstance(x, list) else x for k, x in rec["settings"].items()},
                               "max_rounds": 1})
t = time.time()
got = st.run_study(where(rec["model"]), where(rec["reference"]), out, settings, bars=False)
print(json.dumps({"stage": stage, "threads": torch.get_num_threads(), "wall_s": round(time.time() - t, 1),
                  "trajectories": len(got["trajectories"])}))
"""


def start(code: str, threads: int, *args) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-c", code, args[0], str(threads), *map(str, args[1:])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(procs) -> list[dict]:
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a run failed (exit {p.returncode})")
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


def alternate(name: str, runs_of: dict) -> list[dict]:
    """Each of ``runs_of``'s variants (name -> a function giving its runs) once a trial, the order alternating."""
    rows, kinds = [], list(runs_of)
    for i in range(TRIALS):
        for k in (kinds if i % 2 == 0 else kinds[::-1]):
            load, t0 = os.getloadavg()[0], time.time()
            runs = runs_of[k]()
            rows.append({"lever": name, "trial": i, "variant": k, "wall_s": round(time.time() - t0, 1),
                         "load_before": round(load, 2), "runs": runs})
            print(json.dumps({x: rows[-1][x] for x in ("lever", "trial", "variant", "wall_s", "load_before")}),
                  flush=True)
    return rows


def main() -> int:
    from dsh.core.provenance import git_commit, hardware

    with tempfile.TemporaryDirectory() as tmp:
        def train(stage, steps, extra):
            return lambda: finish([start(TRAIN, 1, stage, steps, Path(tmp) / str(time.time_ns()), json.dumps(extra))])

        def studies(threads):
            def go():
                procs = [(s, Path(tmp) / f"{s}-{time.time_ns()}.json.gz") for s in ("sft-s0", "dft-s0")]
                if threads == 2:
                    return [r for s, o in procs for r in finish([start(STUDY, 2, s, o)])]
                return finish([start(STUDY, 1, s, o) for s, o in procs])
            return go

        rows = alternate("scoring", {f: train("rl-s1", GRPO_STEPS, {"scoring_precision": f})
                                     for f in ("float32", "bfloat16")})
        rows += alternate("sft_attention", {a: train("sft_reflection-s1", SFT_STEPS, {"packed_attention": a})
                                            for a in ("torch", "kernels")})
        rows += alternate("studies", {"one after the other, 2 threads": studies(2),
                                      "side by side, 1 thread each": studies(1)})
    out = {"grpo_steps": GRPO_STEPS, "sft_steps": SFT_STEPS, "trials": rows, "commit": git_commit(),
           "hardware": hardware(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / "levers.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
