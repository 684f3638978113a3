"""The attribution study's gradient routes in ``dsh bench --parts tiny``: :func:`dsh.experiment.run.attribution_study.
attribute_groups` one trajectory at a time (the baseline) and from packed passes, interleaved, on the same
trajectories: reflection traces of the laptop task written by its generator (a wrong attempt the check catches, the
marker, the right attempt, STOP) on the ladder's levels, half with advantage +1 and half -1 (groups of two), the
shipped base as the policy and the base with seeded noise on its weights as the reference (so every objective,
the KL terms too, has a gradient). Each repeat times both routes with the load beside it; the packed route's rows
are checked against the baseline's (the median and largest relative difference of a gradient norm)."""

from __future__ import annotations

import os
import time

import numpy as np

from ...llm.models import load
from ...training.laptop_base import SHIPPED_BASE
from ..run import attribution_study as st

LEVELS = ("1x2", "1x3", "1x4", "1x5", "1x6", "1x7", "1x8")
ROUTES = ("one trajectory at a time", "packed passes")


def trajectories(per_level: int, seed: int = 0) -> list[dict]:
    """``per_level`` generator traces a level (:func:`dsh.experiment.run.attribution_study.generator_samples`), each
    pair a group with advantages +1 and -1."""
    samples = st.generator_samples(LEVELS, per_level, seed)
    return [{**s, "prompt": i // 2, "advantage": 1.0 if i % 2 == 0 else -1.0, "reward": float(i % 2 == 0)}
            for i, s in enumerate(samples)]


def norm_differences(rows_a: list[dict], rows_b: list[dict]) -> dict:
    """The median and the largest relative difference between two routes' gradient norms of the same trajectories
    (every objective's attempt, check, decision and stage norm that is not 0). The KL terms' are the largest: their
    token weights are functions of log pi - log pi_ref, which rounding moves most where the two are close."""
    rel = [abs(g[k] - y["grad"][o][k]) / g[k] for x, y in zip(rows_a, rows_b) for o, g in x["grad"].items()
           if g is not None for k in ("attempt", "check", "decision", "stage") if g[k] > 0]
    return {"median": float(np.median(rel)), "largest": max(rel)} if rel else {"median": 0.0, "largest": 0.0}


def attribution_rows(per_level: int, repeats: int, seed: int = 0) -> list[dict]:
    """Per repeat and route: seconds, trajectories per second, the 1-minute load before it, and (packed) the ratio to
    the baseline of the same repeat and the relative differences of its rows' gradient norms from the baseline's
    (:func:`norm_differences`)."""
    model, tok = load(str(SHIPPED_BASE), device="cpu")
    reference = st.perturbed(model, 1e-3, seed)
    model.eval()
    reference.eval()
    samples = trajectories(per_level, seed)
    out = []
    for rep in range(repeats):
        got = {}
        for route in ROUTES:
            load_1min, t0 = os.getloadavg()[0], time.perf_counter()
            rows, _, _ = st.attribute_groups(model, reference, tok, samples, st.OBJECTIVES, 1.0,
                                             packed=route == ROUTES[1])
            dt = time.perf_counter() - t0
            got[route] = rows
            out.append({"path": route, "repeat": rep, "trajectories": len(rows), "seconds": round(dt, 3),
                        "trajectories_per_s": len(rows) / dt, "load_1min": load_1min})
        base, packed = out[-2], out[-1]
        packed["ratio_to_one_at_a_time"] = base["seconds"] / packed["seconds"]
        packed["norm_difference"] = norm_differences(got[ROUTES[0]], got[ROUTES[1]])
    return out
