"""The estimators checked against known truth: responses simulated from a two-stage process with known
(p_s, p_dC, p_dW) (:mod:`dsh.task.synthetic`), calibrated (:func:`dsh.measure.calibration.calibrate`), and compared
with the truth: point estimates per level (:func:`recovery`) and interval coverage over many replications
(:func:`coverage`)."""

from __future__ import annotations

import numpy as np

from ..core import validate as v
from ..task.synthetic import synthetic_records
from ..theory.two_stage import predicted_accuracy
from .calibration import calibrate

PARAMETERS = (("p_s", 0), ("p_d_given_correct", 1), ("p_d_given_wrong", 2))


def simulated_levels(truths: dict, n: int, seed: int = 0) -> list[dict]:
    """``n`` records per level of ``truths`` (``{level: (p_s, p_dC, p_dW)}``), level ``i`` from seed ``seed + i``."""
    if not isinstance(truths, dict) or not truths:
        raise ValueError("truths must map levels to (p_s, p_dC, p_dW)")
    out = []
    for i, (level, t) in enumerate(truths.items()):
        out += synthetic_records(*t, n=n, level=level, seed=seed + i)
    return out


def recovery(result: dict, truths: dict) -> list[dict]:
    """Per level and parameter of a :func:`calibrate` ``result``: the truth, the estimate, its bootstrap 95 %
    interval and ``recovered``: the estimate lies within twice the interval's half-width of the truth (about 4
    standard errors; None without an interval, ``n_bootstrap=0``)."""
    rows = []
    for level, t in truths.items():
        s = result["by_level"][level]
        for key, j in PARAMETERS:
            est, ci = s[key], s.get(key + "_ci") or [None, None]
            ok = None if None in (est, *ci) else abs(est - t[j]) <= max(ci[1] - ci[0], 1e-9)
            rows.append({"level": level, "parameter": key, "truth": t[j], "estimate": est, "ci_low": ci[0],
                         "ci_high": ci[1], "recovered": ok})
    return rows


def coverage(truth, replications: int, n: int = 100, n_bootstrap: int = 100, seed: int = 10_000) -> dict:
    """Share of ``replications`` simulated test sets (``n`` responses each, seeds ``seed + r``) whose 95 % intervals
    contain the truth: the bootstrap intervals of p_s, p_dC, p_dW and of the predicted accuracy, and the paper's
    normal-approximation and the Wilson interval of the accuracy (the truth: :func:`predicted_accuracy` of
    ``truth``). An undefined interval counts as a miss."""
    replications = v.positive_int("replications", replications)
    n_bootstrap = v.positive_int("n_bootstrap", n_bootstrap)
    acc = predicted_accuracy(*truth)
    within = lambda lo, hi, x: lo is not None and lo <= x <= hi
    hits = {"p_s": [], "p_dC": [], "p_dW": [], "predicted accuracy (bootstrap)": [], "accuracy (normal, paper)": [],
            "accuracy (Wilson)": []}
    for r in range(replications):
        o = calibrate(synthetic_records(*truth, n=n, seed=seed + r), n_bootstrap=n_bootstrap, seed=r)["overall"]
        hits["p_s"].append(within(*o["p_s_ci"], truth[0]))
        hits["p_dC"].append(within(*o["p_d_given_correct_ci"], truth[1]))
        hits["p_dW"].append(within(*o["p_d_given_wrong_ci"], truth[2]))
        hits["predicted accuracy (bootstrap)"].append(within(o["predicted_ci_low"], o["predicted_ci_high"], acc))
        hits["accuracy (normal, paper)"].append(within(o["ci_low"], o["ci_high"], acc))
        hits["accuracy (Wilson)"].append(within(o["wilson_low"], o["wilson_high"], acc))
    return {k: float(np.mean(x)) for k, x in hits.items()}
