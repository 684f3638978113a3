"""The estimators checked against known truth: responses simulated from a two-stage process with known
(p_s, p_dC, p_dW) (:mod:`dsh.task.synthetic`), calibrated (:func:`dsh.measure.calibration.calibrate`), and compared
with the truth: point estimates per level (:func:`recovery`) and interval coverage over many replications
(:func:`coverage`), also where several responses answer one question (:func:`clustered_coverage`)."""

from __future__ import annotations

import numpy as np

from ..core import validate as v
from ..task.synthetic import synthetic_records
from ..theory.two_stage import predicted_accuracy
from .calibration import ResponseStats, calibrate, summarize

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


def clustered_coverage(p: float, concentration: float, questions: int, samples: int, replications: int,
                       n_bootstrap: int = 100, seed: int = 0) -> dict:
    """Share of ``replications`` simulated evaluations whose 95 % intervals contain the truth ``p`` when questions
    differ: each question right with its own rate drawn from Beta(c p, c (1 - p)) (``concentration`` c; mean p), and
    answered ``samples`` times (one attempt, then STOP). Per replication the same responses are calibrated twice:
    grouped by question (:func:`dsh.measure.calibration.summarize`: the cluster bootstrap for p_s and the clustered
    normal interval for the accuracy) and as if every response answered its own question (the bootstrap of
    independent responses, the binomial interval)."""
    p = v.probability("p", p)
    if not 0 < p < 1 or v.real("concentration", concentration) <= 0:
        raise ValueError(f"p must lie in (0, 1) and concentration be > 0; got {p!r}, {concentration!r}")
    questions, samples = v.positive_int("questions", questions), v.positive_int("samples", samples)
    replications, n_bootstrap = v.positive_int("replications", replications), v.positive_int("n_bootstrap", n_bootstrap)
    rng, n = np.random.default_rng(seed), questions * samples
    within = lambda lo, hi: lo is not None and lo <= p <= hi  # noqa: E731
    hits = {"accuracy, by question": [], "accuracy, as independent": [], "p_s, by question": [],
            "p_s, as independent": []}
    for r in range(replications):
        rate = rng.beta(concentration * p, concentration * (1 - p), size=questions)
        right = (rng.random((questions, samples)) < rate[:, None]).ravel()
        ones, zeros = np.ones(n, dtype=int), np.zeros(n, dtype=int)
        for label, ids in (("by question", np.repeat(np.arange(questions), samples)), ("as independent", np.arange(n))):
            stats = ResponseStats(right, ones.astype(bool), right, right.astype(int), right.astype(int),
                                  (~right).astype(int), zeros, np.zeros((n, 4), dtype=int),
                                  np.full(n, "1x2", dtype=object), ids.astype(str).astype(object), zeros)
            o = summarize(stats, n_bootstrap, seed=r)
            hits[f"accuracy, {label}"].append(within(o["ci_low"], o["ci_high"]))
            hits[f"p_s, {label}"].append(within(*o["p_s_ci"]))
    return {k: float(np.mean(x)) for k, x in hits.items()}
