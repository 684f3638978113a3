"""The length law of Theorem 3.2 as a regression: how a ratio of the attempt's part to the decision's part grows
with the attempt's length L, on a log-log scale, with a bootstrap interval over trajectories.

The theorem says the token-level KL penalty of an attempt is a sum over its L_k tokens while a decision's is one
term (|d_sample| / |d_decision| ~ L_k: slope 1 on a log-log scale), and that the surrogate reward weighs the two
alike (a slope near 0 for its split). :func:`loglog_slope` estimates the slope by least squares of log(ratio) on
log(L) and its 95 % interval by resampling the trajectories; :func:`slope_verdict` reads the interval against the
prediction with a tolerance fixed before any data are seen (:data:`TOLERANCE`).
"""

from __future__ import annotations

import math

import numpy as np

from ..core import validate as v

TOLERANCE = 0.5   # a predicted slope "holds" when the 95 % interval lies within +-0.5 of it, "fails" when it misses


def loglog_slope(lengths, ratios, n_boot: int = 2000, seed: int = 0) -> dict:
    """Least-squares slope of log(ratio) on log(length) over the pairs with both positive and finite, its 95 %
    percentile-bootstrap interval (pairs resampled with replacement), the number of pairs used, and the lengths'
    span (longest / shortest). None for the slope and interval when fewer than 3 pairs or one length remain."""
    v.positive_int("n_boot", n_boot)
    v.length("seed", seed)
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(ratios, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"lengths and ratios must have the same length, got {x.size} and {y.size}")
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = np.log(x[ok]), np.log(y[ok])
    out = {"n": int(ok.sum()), "span": float(math.exp(x.max() - x.min())) if x.size else None,
           "slope": None, "ci": [None, None]}
    if x.size < 3 or np.ptp(x) == 0:
        return out

    def fit(ix):
        xs, ys = x[ix], y[ix]
        d = xs - xs.mean()
        den = float(d @ d)
        return float(d @ (ys - ys.mean())) / den if den > 0 else np.nan

    rng = np.random.default_rng(seed)
    boots = np.array([fit(rng.integers(0, x.size, x.size)) for _ in range(n_boot)])
    boots = boots[np.isfinite(boots)]
    out["slope"] = fit(np.arange(x.size))
    out["ci"] = [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]
    return out


def slope_verdict(ci, predicted: float, tolerance: float = TOLERANCE) -> str:
    """"holds" when the interval ``ci`` lies within ``predicted`` +- ``tolerance``, "fails" when it does not meet
    that band, "cannot tell" otherwise (or when there is no interval)."""
    lo, hi = ci
    if lo is None or hi is None:
        return "cannot tell"
    if predicted - tolerance <= lo and hi <= predicted + tolerance:
        return "holds"
    if hi < predicted - tolerance or lo > predicted + tolerance:
        return "fails"
    return "cannot tell"
