"""The baseline of the performance targets in ``dsh bench --parts tiny``: the sampling engine, the evaluation and the
GRPO path of dsh at :data:`REFERENCE_COMMIT`, run from a git worktree of that commit in processes of their own, so
that each ratio to it is measured in the same bench run as today's paths, interleaved with them.

Each child imports the reference commit's own modules (its ``PYTHONPATH`` is the worktree, not this checkout), times
its own work after a warm-up (start-up, model loading and the first call left out, as today's paths run in the warm
bench process; a GRPO run's first step is timed in both) and answers in JSON. The workloads are the bench's: the same
prompt token ids for sampling, the laptop preset's evaluation settings, the GRPO policy the bench trained. The
reference builds its own C kernels (cached by their source, as today's are).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# dsh on 2026-11-26: its engine (the CPU path, float32 KV cache), evaluation and GRPO preset path are the baseline of
# README "Performance"'s targets
REFERENCE_COMMIT = "7c533bd2c8031f1cb7017bb00d9b1a35cdaa9c0b"
REFERENCE_PATH = f"dsh at {REFERENCE_COMMIT[:7]} (its process)"
ROOT = Path(__file__).resolve().parents[3]

_CHILD = """
import json, sys, time
a = json.load(open(sys.argv[1]))
from dsh.experiment import bench_tiny as bt
from dsh.llm.models import load
from dsh.training.laptop_base import SHIPPED_BASE
if a["what"] == "sampling":
    model, tok = load(str(SHIPPED_BASE))
    model.eval()
    secs, gen = bt._run_engine(model, tok, a["prompts"], a["rows"], a["max_new"], a["seed"], "kernels")
    out = {"seconds": secs, "gen": gen}
elif a["what"] == "evaluation":
    import dataclasses
    from dsh.experiment.evaluate import evaluate
    from dsh.experiment.presets import LAPTOP
    settings = LAPTOP.evaluation
    if a["n_per_level"]:
        settings = dataclasses.replace(settings, n_per_level=a["n_per_level"])
    # warm-up (a fresh process: the kernels loaded, the threads started), as today's paths run warm in the bench's
    evaluate(str(SHIPPED_BASE), out=a["out"] + ".warm-up.jsonl", settings=dataclasses.replace(settings, n_per_level=1),
             seed=a["seed"], backend="dsh", progress=False)
    t = time.perf_counter()
    evaluate(str(SHIPPED_BASE), out=a["out"], settings=settings, seed=a["seed"], backend="dsh", progress=False)
    out = {"seconds": time.perf_counter() - t}
else:
    from dsh.experiment.presets import LAPTOP, resolve
    from dsh.training.train import train
    over = {"max_completion_length": a["max_completion"]} if a["max_completion"] else {}
    cfg = resolve("grpo", LAPTOP.name, model=a["policy"], output_dir=a["out"], max_steps=a["steps"],
                  save_steps=10 ** 6, report_to=(), seed=a["seed"], validation_every=0, **over)
    s = train(cfg)
    out = {k: s[k] for k in ("wall_s", "generation_s", "scoring_s", "update_s", "rollouts", "global_step")}
json.dump(out, open(sys.argv[1], "w"))
"""


def unavailable(commit: str = REFERENCE_COMMIT) -> str | None:
    """Why the reference cannot run here (None when it can): it needs git and this checkout's history holding
    ``commit`` (a package installed without its repository has none)."""
    if shutil.which("git") is None:
        return "git is not installed"
    if not (ROOT / ".git").exists():
        return f"{ROOT} is not a git checkout"
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return None if r.returncode == 0 else f"commit {commit[:7]} is not in this checkout's history"


class Reference:
    """A worktree of ``commit`` under ``workdir`` while the ``with`` block runs (removed after it); :meth:`run` one
    of its workloads in a child process."""

    def __init__(self, workdir, commit: str = REFERENCE_COMMIT):
        why = unavailable(commit)
        if why:
            raise ValueError(f"the reference dsh at {commit[:7]} cannot run here: {why}")
        self.commit, self.path = commit, Path(workdir) / f"dsh-{commit[:7]}"

    def __enter__(self):
        r = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(self.path),
                            self.commit], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"git worktree add failed: {r.stderr.strip().splitlines()[-1:]}")
        return self

    def __exit__(self, *exc):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.path)], capture_output=True)
        shutil.rmtree(self.path, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)

    def run(self, what: str, **payload) -> dict:
        """One workload (``sampling``: prompts, rows, max_new, seed; ``evaluation``: out, n_per_level, seed;
        ``grpo``: policy, out, steps, max_completion, seed) in a child process of the reference; its JSON answer."""
        if what not in ("sampling", "evaluation", "grpo"):
            raise ValueError(f"what must be one of sampling, evaluation, grpo; got {what!r}")
        with tempfile.TemporaryDirectory(prefix="dsh-bench-reference-") as d:
            io = Path(d) / "io.json"
            io.write_text(json.dumps({"what": what, **payload}))
            env = {**os.environ, "PYTHONPATH": str(self.path)}
            r = subprocess.run([sys.executable, "-c", _CHILD, str(io)], env=env, cwd=str(self.path),
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"the reference's {what} failed: {r.stderr.strip().splitlines()[-1:]}")
            return json.loads(io.read_text())
