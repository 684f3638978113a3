"""Today's evaluation in ``dsh bench --parts tiny`` run as the reference's is (:mod:`.reference`): in a process of its
own, a 7-question warm-up (the kernels loaded, the threads started), then the laptop preset's evaluation timed. What
the bench's in-process evaluation rows leave out, a fresh process's start (its products' decisions read from this
machine's file, :mod:`dsh.llm.decisions`, or made where they are not there; the fresh pages of its KV cache), is in
it, as it is in a user's ``dsh evaluate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_CHILD = """
import dataclasses, json, sys, time
from dsh.experiment.run.evaluate import evaluate
from dsh.experiment.run.presets import LAPTOP
from dsh.training.laptop_base import SHIPPED_BASE
a = json.load(open(sys.argv[1]))
settings = dataclasses.replace(LAPTOP.evaluation, kv_cache=a["kv_cache"])
if a["n_per_level"]:
    settings = dataclasses.replace(settings, n_per_level=a["n_per_level"])
evaluate(str(SHIPPED_BASE), out=a["out"] + ".warm-up.jsonl", settings=dataclasses.replace(settings, n_per_level=1),
         seed=a["seed"], backend="dsh", progress=False)
from dsh.llm import decisions
before = decisions.stored()
t = time.perf_counter()
evaluate(str(SHIPPED_BASE), out=a["out"], settings=settings, seed=a["seed"], backend="dsh", progress=False)
secs = time.perf_counter() - t
decisions.flush()
json.dump({"seconds": secs, "products_decisions_made": decisions.stored() - before}, open(sys.argv[1], "w"))
"""


def own_process_path(kv_cache: str, rows: int) -> str:
    return f"dsh evaluate, CPU path, {kv_cache} KV cache, {rows} rows, its own process"


def run_evaluation(out: str, n_per_level, seed: int, kv_cache: str) -> dict:
    """The laptop preset's evaluation (``n_per_level`` questions a level, None: the preset's; written to ``out``) in a
    child process of this checkout, after its warm-up: its ``seconds``, and ``products_decisions_made``, how many of
    the products' decisions it made rather than read from this machine's file (:mod:`dsh.llm.decisions`; 0: all
    read, as in a user's later processes)."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-own-") as d:
        io = Path(d) / "io.json"
        io.write_text(json.dumps({"out": out, "n_per_level": n_per_level, "seed": seed, "kv_cache": kv_cache}))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-c", _CHILD, str(io)], env=env, cwd=str(ROOT), capture_output=True,
                           text=True)
        if r.returncode:
            raise RuntimeError(f"the evaluation in its own process failed: {r.stderr.strip().splitlines()[-1:]}")
        return json.loads(io.read_text())
