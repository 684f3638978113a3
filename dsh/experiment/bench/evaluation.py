"""The evaluation part of ``dsh bench --parts tiny`` (:mod:`.tiny`'s docstring): ``dsh evaluate`` of the shipped
base on the laptop ladder through the engine's torch path at 64 rows (the baseline), the preset's path, that path with
a float16 KV cache where the CPU has half floats, and that one again in a process of its own as the reference's runs
(:mod:`.own_process`), interleaved with the reference's (:mod:`.reference`) where it runs."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from ...llm import kernels
from ...training.laptop_base import SHIPPED_BASE
from ..run.evaluate import evaluate
from ..run.presets import LAPTOP
from .host import fast_paths, loaded
from .own_process import own_process_path, run_evaluation
from .reference import REFERENCE_PATH, Reference


def evaluation_rows(size, seed: int = 0, ref: Reference | None = None) -> list:
    """Rows of the evaluation comparison (module docstring) at ``size`` (a :class:`.tiny.TinySize`: its
    ``eval_n_per_level`` and ``eval_repeats``); with ``ref`` the reference commit's evaluation as one more path."""
    settings = LAPTOP.evaluation
    if size.eval_n_per_level:
        settings = dataclasses.replace(settings, n_per_level=size.eval_n_per_level)
    kv = fast_paths()["rollout_kv_cache"]
    own = own_process_path(kv, settings.batch_size)
    runs = (("dsh evaluate, the baseline: engine's torch path, 64 rows", 64, True, "float32"),
            (f"dsh evaluate, laptop preset: CPU path, {settings.batch_size} rows", settings.batch_size, False,
             "float32"),
            (f"dsh evaluate, CPU path, {kv} KV cache, {settings.batch_size} rows", settings.batch_size, False, kv),
            (own, settings.batch_size, False, kv))
    out, responses = [], {}
    with tempfile.TemporaryDirectory(prefix="dsh-bench-eval-") as d:
        for rep in range(size.eval_repeats):
            for k, (label, batch, old, cache) in enumerate(runs + ((REFERENCE_PATH, None, False, None),) * bool(ref)):
                path, extra = Path(d) / f"{rep}-{k}.jsonl", {}
                if label == REFERENCE_PATH:
                    secs = ref.run("evaluation", out=str(path), n_per_level=size.eval_n_per_level, seed=seed)["seconds"]
                elif label == own:
                    extra = run_evaluation(str(path), size.eval_n_per_level, seed, cache)
                    secs = extra.pop("seconds")
                else:
                    with kernels.disabled() if old else contextlib.nullcontext():
                        t = time.perf_counter()
                        evaluate(str(SHIPPED_BASE), out=str(path), seed=seed, backend="dsh", progress=False,
                                 settings=dataclasses.replace(settings, batch_size=batch, kv_cache=cache))
                        secs = time.perf_counter() - t
                recs = {(r["level"], r["index"]): r["response"] for r in map(json.loads, path.read_text().splitlines())}
                responses[label] = recs
                load_1min = os.getloadavg()[0]
                out.append({"part": "tiny evaluation", "path": label, "repeat": rep, "questions": len(recs),
                            "seconds": round(secs, 2), "load_1min": load_1min, "loaded": loaded(load_1min), **extra})
    a = responses[runs[0][0]]
    for r in out:
        before = [x for x in out if x["repeat"] == r["repeat"]][0]
        r["time_share_of_before"] = r["seconds"] / before["seconds"]
        if ref is not None:
            r["time_share_of_reference"] = r["seconds"] / next(
                x for x in out if x["repeat"] == r["repeat"] and x["path"] == REFERENCE_PATH)["seconds"]
        b = responses[r["path"]]
        r["identical_responses"] = sum(a[k] == b.get(k) for k in a) / len(a)     # to the baseline's
    return out
