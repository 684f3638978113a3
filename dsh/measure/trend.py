"""Did a training curve rise? The mean of its last fifth against its first fifth, with a 95 % interval; or a
measured share at a run's end against its start (:func:`proportion_rise`).

GRPO logs one mean reward per rollout round (:func:`dsh.experiment.run.steps.reward_curve`). Within a round the
rollouts are not independent (a group shares its prompt), so the unit here is the round: the two fifths' round
means are compared by Welch's two-sample t interval (unequal variances, Welch-Satterthwaite degrees of freedom).
A fifth holds at least two rounds; a shorter curve has no verdict.
"""

from __future__ import annotations

import math

from ..core import validate as v
from .calibration import wilson_interval


def fifths_contrast(values, level: float = 0.95) -> dict | None:
    """``{"first": mean of the first fifth, "last": mean of the last fifth, "delta": last - first, "ci": Welch's
    ``level`` interval of delta, "n": rounds in each fifth, "df": its degrees of freedom}`` of a curve (one value a
    round, in order); None when a fifth would hold fewer than 2 rounds. Equal rounds give a zero-width interval."""
    from scipy import stats

    xs = [v.real("values[i]", x) for x in v.collection("values", values, "numbers (one a round)")]
    if not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    k = len(xs) // 5
    if k < 2:
        return None
    a, b = xs[:k], xs[-k:]
    ma, mb = sum(a) / k, sum(b) / k
    va = sum((x - ma) ** 2 for x in a) / (k - 1)
    vb = sum((x - mb) ** 2 for x in b) / (k - 1)
    se2 = va / k + vb / k
    if se2 == 0:
        return {"first": ma, "last": mb, "delta": mb - ma, "ci": [mb - ma, mb - ma], "n": k, "df": None}
    df = se2 ** 2 / ((va / k) ** 2 / (k - 1) + (vb / k) ** 2 / (k - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return {"first": ma, "last": mb, "delta": mb - ma, "ci": [mb - ma - half, mb - ma + half], "n": k, "df": df}


def proportion_rise(k_first, n_first, k_last, n_last, level: float = 0.95) -> dict:
    """``{"first": k_first / n_first, "last": k_last / n_last, "delta": last - first, "ci": Newcombe's hybrid score
    ``level`` interval of delta}`` for two independent binomial samples (Newcombe 1998, method 10: each share's
    Wilson interval, :func:`dsh.measure.calibration.wilson_interval`, combined by the square-and-add rule). Where the
    two samples answer the same questions and their outcomes correlate positively, the interval is wider than a
    paired one would be (conservative)."""
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    counts = []
    for kn, nn, k, n in (("k_first", "n_first", k_first, n_first), ("k_last", "n_last", k_last, n_last)):
        n = v.length(nn, n, 1)
        k = v.length(kn, k, 0)
        if k > n:
            raise ValueError(f"{kn} must be a count between 0 and {nn} ({n}), got {k}")
        counts.append((k, n))
    z = float(stats.norm.ppf(0.5 + level / 2))
    (k0, n0), (k1, n1) = counts
    p0, p1 = k0 / n0, k1 / n1
    (l0, u0), (l1, u1) = wilson_interval(k0, n0, z), wilson_interval(k1, n1, z)
    d = p1 - p0
    return {"first": p0, "last": p1, "delta": d,
            "ci": [d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)]}


def verdict(contrast: dict | None) -> str:
    """"rises" when the interval lies above 0, "falls" when below, "cannot tell" otherwise (or without a contrast)."""
    if contrast is None:
        return "cannot tell"
    lo, hi = contrast["ci"]
    return "rises" if lo > 0 else "falls" if hi < 0 else "cannot tell"


def _count(name: str, n) -> float:
    """A level's number of trials: a real >= 1 (a count, or one of independent trials: n over a design effect)."""
    x = v.real(name, n)
    if x < 1:
        raise ValueError(f"{name} must be a number of trials >= 1, got {n!r}")
    return x


def level_slope(digits, rates, ns, level: float = 0.95) -> dict | None:
    """Does a rate fall with difficulty? The weighted least-squares slope of per-level rates (e.g. p_s) on the
    levels' difficulty (the multiplicand's digits), each level weighted by the inverse of its binomial variance
    n / (p (1 - p)) (p kept in [0.5/n, 1 - 0.5/n]; n the level's trials, or its independent ones where several
    responses answer one question), with the normal ``level`` interval of the slope. ``{"slope",
    "ci", "levels"}``; None with fewer than 3 levels."""
    from scipy import stats

    xs = [v.real("digits[i]", x) for x in v.collection("digits", digits, "numbers (one a level)")]
    ps = [v.probability("rates[i]", p) for p in v.collection("rates", rates, "rates in [0, 1] (one a level)")]
    ms = [_count("ns[i]", n) for n in v.collection("ns", ns, "counts (one a level)")]
    if not len(xs) == len(ps) == len(ms):
        raise ValueError(f"digits, rates and ns must have one value a level; got {len(xs)}, {len(ps)}, {len(ms)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    if len(xs) < 3:
        return None
    if len(set(xs)) < 2:
        raise ValueError("digits must differ between levels to fit a slope")
    w = []
    for p, n in zip(ps, ms):
        q = min(max(p, 0.5 / n), 1 - 0.5 / n)
        w.append(n / (q * (1 - q)))
    sw = sum(w)
    xb = sum(wi * x for wi, x in zip(w, xs)) / sw
    yb = sum(wi * y for wi, y in zip(w, ps)) / sw
    sxx = sum(wi * (x - xb) ** 2 for wi, x in zip(w, xs))
    slope = sum(wi * (x - xb) * (y - yb) for wi, x, y in zip(w, xs, ps)) / sxx
    half = float(stats.norm.ppf(0.5 + level / 2)) * math.sqrt(1 / sxx)
    return {"slope": slope, "ci": [slope - half, slope + half], "levels": len(xs)}
