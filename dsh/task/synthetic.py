"""Responses written by a two-stage process with known (p_s, p_dC, p_dW): ground truth for checking
the parser and the calibration estimators by simulation."""

from __future__ import annotations

import random

import numpy as np

from ..core import validate as v
from ..theory.two_stage import simulate
from .problems import draw_problems, parse_level

_WRONG_OFFSETS = (-9000, -1000, -90, -10, -9, -1, 1, 9, 10, 90, 100, 1000, 9000)


def synthetic_records(p_s: float, p_dC: float, p_dW: float, n: int, level: str = "3x5", seed: int = 0,
                      max_attempts: int = 64, marker: str = "Let me recheck.",
                      p_s_later: float | None = None, p_s_concentration: float | None = None) -> list[dict]:
    """``n`` records ``{question, answer, response, level, truncated}`` whose responses follow the
    two-stage process: each attempt is correct with probability p_s (``p_s_later`` for the second and later
    attempts, if given), then STOP / RESAMPLE with p_dC / p_dW. A response cut at ``max_attempts`` has
    ``truncated: true``. ``p_s_concentration`` (kappa): questions differ, each with its own p_s drawn from
    Beta(kappa p_s, kappa (1 - p_s)) (mean p_s), each following the two-stage process."""
    parse_level(level)
    n = v.positive_int("n", n)
    if p_s_concentration is not None:
        if v.real("p_s_concentration", p_s_concentration) <= 0:
            raise ValueError(f"p_s_concentration must be a positive number, got {p_s_concentration!r}")
        if not 0 < v.probability("p_s", p_s) < 1:
            raise ValueError(f"p_s must lie strictly between 0 and 1 when questions differ, got {p_s!r}")
        kappa = float(p_s_concentration)
        p_s = np.random.default_rng(seed + 7_919).beta(kappa * p_s, kappa * (1 - p_s), size=n)
    sim = simulate(p_s, p_dC, p_dW, n=n, seed=seed, max_attempts=max_attempts, p_s_later=p_s_later)
    problems = draw_problems(level, n, seed=seed)
    rng = random.Random(seed)
    out = []
    for i, p in enumerate(problems):
        parts = []
        row = [int(x) for x in sim.candidates[i] if x >= 0]
        for k, ok in enumerate(row):
            val = p.answer if ok else p.answer + rng.choice(_WRONG_OFFSETS)
            parts.append(f"Attempt {k + 1}: multiplying {p.a} by the digits of {p.b} and adding up, "
                         f"{p.a} * {p.b} = {val}.")
            last = k == len(row) - 1
            if last and sim.stopped[i]:
                parts.append(f"The answer is {val}.")
            else:
                parts.append(marker)
        out.append({"question": p.question, "answer": p.answer, "response": " ".join(parts),
                    "level": p.level, "truncated": not bool(sim.stopped[i])})
    return out
