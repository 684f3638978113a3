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
from statistics import NormalDist

import numpy as np

from ..core import validate as v

TOLERANCE = 0.5   # a predicted slope "holds" when the 95 % interval lies within +-0.5 of it, "fails" when it misses


def usable(lengths, ratios) -> np.ndarray:
    """Which (length, ratio) pairs a log-log fit can take: both positive and finite."""
    x, y = np.asarray(lengths, dtype=float), np.asarray(ratios, dtype=float)
    return np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)


def loglog_slope(lengths, ratios, n_boot: int = 2000, seed: int = 0, clusters=None) -> dict:
    """Least-squares slope of log(ratio) on log(length) over the pairs with both positive and finite, its 95 %
    percentile-bootstrap interval, the number of pairs used (and of clusters), and the lengths' span (longest /
    shortest). The bootstrap resamples pairs with replacement, or, given ``clusters`` (one label per pair, e.g. the
    question a trajectory answers), whole clusters with replacement (the cluster bootstrap: pairs of one cluster are
    not independent). None for the slope and interval when fewer than 3 pairs or one length remain."""
    v.positive_int("n_boot", n_boot)
    v.length("seed", seed)
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(ratios, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"lengths and ratios must have the same length, got {x.size} and {y.size}")
    if clusters is not None and len(clusters) != x.size:
        raise ValueError(f"clusters must give one label per pair ({x.size}), got {len(clusters)}")
    ok = usable(x, y)
    labels = None if clusters is None else np.asarray(clusters)[ok]
    x, y = np.log(x[ok]), np.log(y[ok])
    out = {"n": int(ok.sum()), "span": float(math.exp(x.max() - x.min())) if x.size else None,
           "slope": None, "ci": [None, None]}
    if labels is not None:
        out["clusters"] = int(np.unique(labels).size)
    if x.size < 3 or np.ptp(x) == 0:
        return out

    def fit(ix):
        xs, ys = x[ix], y[ix]
        d = xs - xs.mean()
        den = float(d @ d)
        return float(d @ (ys - ys.mean())) / den if den > 0 else np.nan

    rng = np.random.default_rng(seed)
    draws = (rng.integers(0, x.size, x.size) for _ in range(n_boot)) if labels is None else \
        cluster_draws(labels, n_boot, rng)
    boots = np.array([fit(ix) for ix in draws])
    boots = boots[np.isfinite(boots)]
    out["slope"] = fit(np.arange(x.size))
    out["ci"] = [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]
    return out


def joint_cluster_slopes(series: dict, n_boot: int = 1000, seed: int = 0) -> tuple[list, np.ndarray]:
    """Bootstrap slopes of several log-log fits on one sample of clusters, resampled jointly: ``series`` maps a
    fit's name to its (lengths, ratios, clusters); each draw takes the clusters of all fits together with
    replacement (a question drawn twice counts twice in every fit that holds it) and refits each fit's least-squares
    slope of log(ratio) on log(length) over its usable pairs (:func:`usable`). Returns the fits' names (sorted) and
    the ``[n_boot, fits]`` slopes, NaN where a draw leaves a fit one length or none; their correlation is the
    correlation of the fits' estimates (:func:`loglog_slope`'s cluster bootstrap is one column: the same draws when
    every fit holds every cluster)."""
    v.positive_int("n_boot", n_boot)
    v.length("seed", seed)
    if not isinstance(series, dict) or not series:
        raise ValueError("series must map at least one fit's name to its (lengths, ratios, clusters)")
    keys, cols = sorted(series), []
    for k in keys:
        if len(series[k]) != 3:
            raise ValueError(f"series[{k!r}] must be (lengths, ratios, clusters), got {len(series[k])} items")
        x, y, c = (np.asarray(a) for a in series[k])
        if not x.shape == y.shape == c.shape or x.ndim != 1:
            raise ValueError(f"series[{k!r}] must give lengths, ratios and clusters of one length, got "
                             f"{x.shape}, {y.shape}, {c.shape}")
        ok = usable(x, y)
        cols.append((np.log(x[ok].astype(float)), np.log(y[ok].astype(float)), c[ok]))
    labels = np.unique(np.concatenate([c for *_, c in cols]))
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, labels.size, labels.size), minlength=labels.size)
                        for _ in range(n_boot)]).astype(float)
    out = np.full((n_boot, len(keys)), np.nan)
    for j, (lx, ly, c) in enumerate(cols):
        w = weights[:, np.searchsorted(labels, c)]             # each pair's multiplicity in each draw
        m = w.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mx, my = (w @ lx) / m, (w @ ly) / m
            sxx = w @ (lx * lx) - m * mx * mx
            sxy = w @ (lx * ly) - m * mx * my
            slope = sxy / sxx
        good = (m > 0) & (sxx > 1e-12 * np.maximum(1.0, w @ (lx * lx)))
        out[good, j] = slope[good]
    return keys, out


def median(values) -> float:
    """``np.median`` of a non-empty sample of finite or infinite floats (the middle value, or the mean of the two middle
    ones; the same float), without its per-call overhead: a bootstrap takes thousands of medians of short samples."""
    s = sorted(values.tolist() if isinstance(values, np.ndarray) else values)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else float((s[k - 1] + s[k]) / 2)


def cluster_draws(labels, n_boot: int, rng):
    """``n_boot`` bootstrap index sets that resample whole clusters (the indices of each drawn cluster's members)."""
    members = [np.nonzero(labels == k)[0] for k in np.unique(labels)]
    flat = np.concatenate(members) if members else np.zeros(0, dtype=int)
    sizes = np.array([m.size for m in members], dtype=int)
    starts = np.cumsum(sizes) - sizes

    def draw(ks):                  # the members of clusters ks, cluster after cluster (np.concatenate's order)
        n = sizes[ks]
        return flat[np.repeat(starts[ks] - (np.cumsum(n) - n), n) + np.arange(n.sum())]

    return (draw(rng.integers(0, len(members), len(members))) for _ in range(n_boot))


def slope_verdict(ci, predicted: float, tolerance: float = TOLERANCE) -> str:
    """"holds" when the interval ``ci`` lies within ``predicted`` +- ``tolerance``, "fails" when it does not meet
    that band, "cannot tell" otherwise (or when there is no interval)."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        raise ValueError(f"ci must be an interval [low, high] (None, None without one), got {ci!r}")
    v.real("predicted", predicted)
    v.real("tolerance", tolerance)
    lo, hi = ci
    if lo is None or hi is None:
        return "cannot tell"
    if predicted - tolerance <= lo and hi <= predicted + tolerance:
        return "holds"
    if hi < predicted - tolerance or lo > predicted + tolerance:
        return "fails"
    return "cannot tell"


def bootstrap_coverage(n_rep: int = 200, questions: int = 40, per_question: int = 8, slope: float = 1.0,
                       question_sd: float = 0.5, sample_sd: float = 0.3, n_boot: int = 300, seed: int = 0) -> dict:
    """How often the 95 % intervals of :func:`loglog_slope` contain the true slope, resampling pairs and resampling
    questions, on simulated studies whose truth is known: ``questions`` attempt lengths drawn from 15 to 90 tokens,
    ``per_question`` samples each (their lengths within 5 % of the question's), log ratio = slope * log L + what the
    question adds to all its samples (N(0, question_sd^2)) + each sample's own N(0, sample_sd^2). Returns
    ``{"pairs": share, "questions": share, "n_rep": n_rep}``."""
    for name, x in (("n_rep", n_rep), ("questions", questions), ("per_question", per_question), ("n_boot", n_boot)):
        v.positive_int(name, x)
    if v.real("question_sd", question_sd) < 0 or v.real("sample_sd", sample_sd) < 0:
        raise ValueError(f"question_sd and sample_sd must be numbers >= 0, got {question_sd!r} and {sample_sd!r}")
    v.length("seed", seed)
    rng = np.random.default_rng(seed)
    n = questions * per_question
    labels = np.repeat(np.arange(questions), per_question)
    hits = {"pairs": 0, "questions": 0}
    for rep in range(n_rep):
        L = np.repeat(rng.uniform(15, 90, questions), per_question) * np.exp(rng.normal(0, 0.05, n))
        ratio = L ** v.real("slope", slope) * np.exp(np.repeat(rng.normal(0, question_sd, questions), per_question)
                                                     + rng.normal(0, sample_sd, n))
        for kind, cl in (("pairs", None), ("questions", labels)):
            f = loglog_slope(L, ratio, n_boot=n_boot, seed=rep, clusters=cl)
            hits[kind] += f["ci"][0] <= slope <= f["ci"][1]
    return {"pairs": hits["pairs"] / n_rep, "questions": hits["questions"] / n_rep, "n_rep": n_rep}


def mutual_inclusion(ci0, ci1, level: float = 0.95) -> float:
    """Chance that two independent, unbiased, normal estimates of one slope, whose ``level`` intervals have the
    widths of ``ci0`` and ``ci1``, each lie inside the other's interval (the reproduction check of chapter 08):
    P(|Z| <= z * min(s0, s1) / sqrt(s0^2 + s1^2)) with s = width / (2 z), z the normal quantile of ``level``. For
    equal widths at 95 %: P(|Z| <= 1.386) = 0.834, so even a study that reproduces exactly misses about 1 slope in 6."""
    if not 0 < v.real("level", level) < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    widths = []
    for name, ci in (("ci0", ci0), ("ci1", ci1)):
        if len(ci) != 2 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in ci) or ci[1] <= ci[0]:
            raise ValueError(f"{name} must be an interval [low, high] of finite numbers with low < high, got {ci!r}")
        widths.append(ci[1] - ci[0])
    z = NormalDist().inv_cdf(0.5 + level / 2)
    s0, s1 = (w / (2 * z) for w in widths)
    return 2 * NormalDist().cdf(z * min(s0, s1) / math.hypot(s0, s1)) - 1


def cluster_median(values, clusters, n_boot: int = 2000, seed: int = 0) -> dict:
    """The median of ``values`` with its 95 % percentile-bootstrap interval, whole clusters resampled (one label per
    value in ``clusters``, e.g. the question a trajectory answers). Non-finite values are left out; None for the
    median and interval when no value remains."""
    v.positive_int("n_boot", n_boot)
    v.length("seed", seed)
    x = np.asarray(values, dtype=float)
    if len(clusters) != x.size:
        raise ValueError(f"clusters must give one label per value ({x.size}), got {len(clusters)}")
    ok = np.isfinite(x)
    x, labels = x[ok], np.asarray(clusters)[ok]
    if not x.size:
        return {"n": 0, "median": None, "ci": [None, None]}
    boots = [median(x[ix]) for ix in cluster_draws(labels, n_boot, np.random.default_rng(seed))]
    return {"n": int(x.size), "median": float(np.median(x)),
            "ci": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]}
