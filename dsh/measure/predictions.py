"""Claim (i) on predictions the calibration did not fit.

The calibration fits ``p_s`` (first-candidate accuracy), ``p_dC`` and ``p_dW`` and predicts the final
accuracy. Without truncation that prediction equals the observed accuracy whenever the first attempt is as
accurate as the later ones, so agreement there says little. The two-stage model predicts more, from the same
three numbers, under its assumption that every attempt is an independent draw from one pi_sample:

* the number of candidates N is geometric: ``P(N = k) = r^(k-1) (1 - r)`` with
  ``r = p_s (1 - p_dC) + (1 - p_s) p_dW`` (Pearson chi-square over ``N = 1, ..., K-1, >= K``);
* a RESAMPLE after a wrong candidate is followed by a correct one with probability ``p_s`` (the F->T rate);
* cut after ``cutoff`` candidates, the accuracy is :func:`dsh.theory.two_stage.accuracy_within`.

With ``mixture=True`` the questions may differ: each question has its own p_s, drawn from a Beta(alpha, beta) fitted
per level by maximum likelihood to the correctness of the candidates of each response (attempts of one question are
exchangeable draws given its p_s, and stopping depends only on correctness, so the likelihood of a response is
``B(alpha + s, beta + f) / B(alpha, beta)`` with s right and f wrong candidates). The predictions average the
two-stage model over that Beta (exactly, through its moments); the F->T prediction of each pair is the posterior mean
of the question's p_s given the candidates before it. Questions that differ then do not make the checks fail; a
process whose later attempts are *better* than its first ones (a model that learned to check and fix) still does.

Each observed value gets a Wilson interval; a check agrees when the prediction lies inside it (the
chi-square: p-value above the same level). The three checks share a 5 % family-wise error (Bonferroni:
each at 5/3 %), so data from the model itself "fails" about one time in twenty. Truncated records are left
out (their N is censored).
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import polynomial as npoly
from scipy.optimize import minimize
from scipy.special import betaln
from scipy.stats import chi2, norm

from ..core import validate as v
from ..task.parse import DEFAULT_MARKERS, operands, parse_response, truth_value
from ..theory.two_stage import accuracy_within
from .calibration import calibrate, validate_records, wilson_interval

ALPHA = 0.05 / 3  # per check (three checks, 5 % family-wise)
Z = float(norm.ppf(1 - ALPHA / 2))


def candidate_lists(records, markers=DEFAULT_MARKERS, parse=parse_response) -> list[list[bool]]:
    """Per record, the correctness of each candidate answer in order (the parser of the calibration)."""
    out = []
    for r in records:
        a, b = operands(r["question"])
        truth = truth_value(r["answer"])
        out.append([c == truth for c in parse(r["response"], a, b, markers).candidates])
    return out


def _fit(recs, markers, parse=parse_response):
    """(p_s, p_dC, p_dW) of a group of records; an undefined p_dC / p_dW whose branch has probability 0 is 0."""
    o = calibrate(recs, n_bootstrap=0, markers=markers, parse=parse)["overall"]
    p_s, p_dC, p_dW = o["p_s"], o["p_d_given_correct"], o["p_d_given_wrong"]
    if p_s is None:
        return None
    p_dC = 0.0 if p_dC is None and p_s == 0 else p_dC
    p_dW = 0.0 if p_dW is None and p_s == 1 else p_dW
    return None if None in (p_dC, p_dW) else (p_s, p_dC, p_dW)


LOG_BOUNDS = (-9.0, 11.5)      # log alpha and log beta of the fit: 1.2e-4 ... 9.9e4


def fit_beta(lists) -> tuple[float, float]:
    """Maximum-likelihood (alpha, beta) of a Beta distribution of per-question p_s from the candidates' correctness
    of each response (``lists``: one list of bools per response); the concentration alpha + beta is capped at 1e5
    (questions that do not differ)."""
    s = np.array([sum(c) for c in lists], dtype=float)
    f = np.array([len(c) - sum(c) for c in lists], dtype=float)
    lo, hi = LOG_BOUNDS
    # every candidate right (or every one wrong): the likelihood rises towards beta -> 0 (alpha -> 0) whatever the
    # other parameter, a flat ridge on which the optimizer would stop at a point that depends on the machine's
    # floating point; the answer is the bound it tends to, with the concentration at the cap
    if not f.sum():
        return float(np.exp(hi)), float(np.exp(lo))
    if not s.sum():
        return float(np.exp(lo)), float(np.exp(hi))
    nll = lambda x: -float(np.sum(betaln(np.exp(x[0]) + s, np.exp(x[1]) + f) - betaln(np.exp(x[0]), np.exp(x[1]))))
    m = float(np.clip(s.sum() / max(s.sum() + f.sum(), 1), 1e-3, 1 - 1e-3))
    # converged tightly, so that machines whose floating point differs in the last bits agree to far below the
    # printed precision (the default tolerances left 1e-5 relative differences in the predictions)
    runs = [minimize(nll, np.log([m * k, (1 - m) * k]), method="L-BFGS-B", bounds=[LOG_BOUNDS] * 2,
                     options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000}) for k in (2.0, 20.0, 2000.0)]
    # starts whose optima tie (the data do not tell the concentration apart: a flat direction) are decided by the
    # higher concentration, the direction the likelihood rises in, not by last-bit differences between machines
    top = min(r.fun for r in runs)
    best = max((r for r in runs if r.fun <= top + 1e-9 * max(1.0, abs(top))), key=lambda r: float(np.sum(np.exp(r.x))))
    return float(np.exp(best.x[0])), float(np.exp(best.x[1]))


def _beta_moments(alpha: float, beta: float, degree: int) -> np.ndarray:
    """E[p^j], j = 0..degree, under Beta(alpha, beta)."""
    out = [1.0]
    for j in range(degree):
        out.append(out[-1] * (alpha + j) / (alpha + beta + j))
    return np.array(out)


def _expect(poly, moments) -> float:
    return float(np.dot(poly, moments[:len(poly)]))


def _mixture_predictions(lists, alpha, beta, p_dC, p_dW, K, cutoff):
    """Under p_s ~ Beta(alpha, beta): P(N = k) for k < K and P(N >= K) per response, the expected F->T count over the
    observed pairs, and the accuracy within ``cutoff`` candidates (the polynomials in p averaged by moments)."""
    r = np.array([p_dW, 1 - p_dC - p_dW])                  # r(p) = p (1 - p_dC) + (1 - p) p_dW, as a polynomial
    mom = _beta_moments(alpha, beta, max(K, cutoff) + 1)
    power = lambda m: npoly.polypow(r, m) if m else np.array([1.0])  # noqa: E731
    probs = [_expect(npoly.polymul(power(k - 1), npoly.polysub([1.0], r)), mom) for k in range(1, K)]
    probs.append(_expect(power(K - 1), mom))
    acc = sum(npoly.polymul(power(k - 1), [0.0, p_dC]) for k in range(1, cutoff)) if cutoff > 1 else np.array([0.0])
    acc = npoly.polyadd(acc, npoly.polymul(power(cutoff - 1), [0.0, 1.0]))
    ft = 0.0
    for c in lists:
        for j in range(1, len(c)):
            if not c[j - 1]:
                ft += (alpha + sum(c[:j])) / (alpha + beta + j)     # posterior mean of p_s given the candidates before
    return probs, ft, _expect(acc, mom)


def unfitted_predictions(records, markers=DEFAULT_MARKERS, max_attempts: int = 4, cutoff: int = 2,
                         min_n: int = 30, mixture: bool = False, parse=parse_response) -> dict:
    """Observed against predicted for the statistics the fit did not use (module docstring), with a
    verdict: "holds" when every check agrees, "fails" when one does not, "cannot tell" with fewer than
    ``min_n`` answered, untruncated responses or fewer than ``min_n`` wrong candidates followed by another.

    The model is fitted per level (the levels differ in p_s), and each prediction is the mixture of the
    levels' predictions, weighted as the observations are (responses; wrong candidates followed by another
    for the F->T rate). ``mixture``: questions within a level may differ too (module docstring)."""
    if not isinstance(mixture, bool):
        raise ValueError(f"mixture must be True or False, got {mixture!r}")
    K = v.positive_int("max_attempts", max_attempts)
    if K < 2:
        raise ValueError(f"max_attempts must be an integer >= 2, got {max_attempts}")
    cutoff = v.positive_int("cutoff", cutoff)
    min_n = v.positive_int("min_n", min_n)
    recs = [r for r in validate_records(records) if not r.get("truncated", False)]
    by_level = {}
    for r, c in zip(recs, candidate_lists(recs, markers, parse)):
        if c:
            by_level.setdefault(r.get("level", "all"), []).append((r, c))
    counts = [0] * K
    probs = [0.0] * K
    k_ft = n_pairs = 0
    pred_ft = 0.0
    k_cut = 0
    pred_cut = 0.0
    fits, skipped = {}, []
    for lv, rows in sorted(by_level.items()):
        fit = _fit([r for r, _ in rows], markers, parse)
        if fit is None:
            skipped.append(lv)
            continue
        fits[lv] = dict(zip(("p_s", "p_dC", "p_dW"), fit))
        p_s, p_dC, p_dW = fit
        lists = [c for _, c in rows]
        for c in lists:
            counts[min(len(c), K) - 1] += 1
        pairs = [y for c in lists for x, y in zip(c, c[1:]) if not x]
        k_ft += sum(pairs)
        n_pairs += len(pairs)
        k_cut += sum(c[min(len(c), cutoff) - 1] for c in lists)
        if mixture:
            alpha, beta = fit_beta(lists)
            fits[lv].update(alpha=alpha, beta=beta)
            per, ft, acc = _mixture_predictions(lists, alpha, beta, p_dC, p_dW, K, cutoff)
            probs = [x + len(lists) * y for x, y in zip(probs, per)]
            pred_ft += ft
            pred_cut += len(lists) * acc
            continue
        r = p_s * (1 - p_dC) + (1 - p_s) * p_dW
        for k in range(1, K):
            probs[k - 1] += len(lists) * r ** (k - 1) * (1 - r)
        probs[K - 1] += len(lists) * r ** (K - 1)
        pred_ft += len(pairs) * p_s
        pred_cut += len(lists) * accuracy_within(p_s, p_dC, p_dW, cutoff)
    n = sum(counts)
    out = {"n": n, "fit": fits, "levels_without_fit": skipped, "mixture": mixture, "checks": {}}
    if n < min_n or n_pairs < min_n:
        out["verdict"] = "cannot tell"
        return out
    stat = sum((o - e) ** 2 / e for o, e in zip(counts, probs) if e > 0)
    pval = float(chi2.sf(stat, df=K - 1))
    out["checks"]["number of candidates"] = {"observed": counts, "predicted": probs, "chi2": stat,
                                             "p_value": pval, "agrees": pval > ALPHA}
    lo, hi = wilson_interval(k_ft, n_pairs, Z)
    pred = pred_ft / n_pairs
    out["checks"]["F->T rate"] = {"observed": k_ft / n_pairs, "predicted": pred, "interval": [lo, hi],
                                  "n": n_pairs, "agrees": lo <= pred <= hi}
    lo, hi = wilson_interval(k_cut, n, Z)
    pred = pred_cut / n
    out["checks"][f"accuracy within {cutoff} candidates"] = {"observed": k_cut / n, "predicted": pred,
                                                             "interval": [lo, hi], "n": n, "agrees": lo <= pred <= hi}
    out["verdict"] = "holds" if all(c["agrees"] for c in out["checks"].values()) else "fails"
    return out


def format_checks(result: dict) -> str:
    """One line per check: observed, predicted and whether they agree."""
    lines = []
    for name, c in result.get("checks", {}).items():
        if name == "number of candidates":
            lines.append(f"{name}: observed {c['observed']}, predicted {[round(x, 1) for x in c['predicted']]}, "
                         f"chi2 p = {c['p_value']:.3g} ({'agrees' if c['agrees'] else 'disagrees'})")
        else:
            lines.append(f"{name}: observed {c['observed']:.3f} [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}], "
                         f"predicted {c['predicted']:.3f} ({'agrees' if c['agrees'] else 'disagrees'})")
    return "\n".join(lines) or f"verdict {result.get('verdict')}: too few responses"
