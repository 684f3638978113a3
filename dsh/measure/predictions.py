"""Claim (i) on predictions the calibration did not fit.

The calibration fits ``p_s`` (first-candidate accuracy), ``p_dC`` and ``p_dW`` and predicts the final
accuracy. Without truncation that prediction equals the observed accuracy whenever the first attempt is as
accurate as the later ones, so agreement there says little. The two-stage model predicts more, from the same
three numbers, under its assumption that every attempt is an independent draw from one pi_sample:

* the number of candidates N is geometric: ``P(N = k) = r^(k-1) (1 - r)`` with
  ``r = p_s (1 - p_dC) + (1 - p_s) p_dW`` (Pearson chi-square over ``N = 1, ..., K-1, >= K``);
* a RESAMPLE after a wrong candidate is followed by a correct one with probability ``p_s`` (the F->T rate);
* cut after ``cutoff`` candidates, the accuracy is :func:`dsh.theory.two_stage.accuracy_within`.

Each observed value gets a Wilson interval; a check agrees when the prediction lies inside it (the
chi-square: p-value above the same level). The three checks share a 5 % family-wise error (Bonferroni:
each at 5/3 %), so data from the model itself "fails" about one time in twenty. Truncated records are left
out (their N is censored).
"""

from __future__ import annotations

from scipy.stats import chi2, norm

from ..core import validate as v
from ..task.parse import DEFAULT_MARKERS, operands, parse_response, truth_value
from ..theory.two_stage import accuracy_within
from .calibration import calibrate, validate_records, wilson_interval

ALPHA = 0.05 / 3  # per check (three checks, 5 % family-wise)
Z = float(norm.ppf(1 - ALPHA / 2))


def candidate_lists(records, markers=DEFAULT_MARKERS) -> list[list[bool]]:
    """Per record, the correctness of each candidate answer in order (the parser of the calibration)."""
    out = []
    for r in records:
        a, b = operands(r["question"])
        truth = truth_value(r["answer"])
        out.append([c == truth for c in parse_response(r["response"], a, b, markers).candidates])
    return out


def _fit(recs, markers):
    """(p_s, p_dC, p_dW) of a group of records; an undefined p_dC / p_dW whose branch has probability 0 is 0."""
    o = calibrate(recs, n_bootstrap=0, markers=markers)["overall"]
    p_s, p_dC, p_dW = o["p_s"], o["p_d_given_correct"], o["p_d_given_wrong"]
    if p_s is None:
        return None
    p_dC = 0.0 if p_dC is None and p_s == 0 else p_dC
    p_dW = 0.0 if p_dW is None and p_s == 1 else p_dW
    return None if None in (p_dC, p_dW) else (p_s, p_dC, p_dW)


def unfitted_predictions(records, markers=DEFAULT_MARKERS, max_attempts: int = 4, cutoff: int = 2,
                         min_n: int = 30) -> dict:
    """Observed against predicted for the statistics the fit did not use (module docstring), with a
    verdict: "holds" when every check agrees, "fails" when one does not, "cannot tell" with fewer than
    ``min_n`` answered, untruncated responses or fewer than ``min_n`` wrong candidates followed by another.

    The model is fitted per level (the levels differ in p_s), and each prediction is the mixture of the
    levels' predictions, weighted as the observations are (responses; wrong candidates followed by another
    for the F->T rate)."""
    K = v.positive_int("max_attempts", max_attempts)
    if K < 2:
        raise ValueError(f"max_attempts must be an integer >= 2, got {max_attempts}")
    cutoff = v.positive_int("cutoff", cutoff)
    min_n = v.positive_int("min_n", min_n)
    recs = [r for r in validate_records(records) if not r.get("truncated", False)]
    by_level = {}
    for r, c in zip(recs, candidate_lists(recs, markers)):
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
        fit = _fit([r for r, _ in rows], markers)
        if fit is None:
            skipped.append(lv)
            continue
        fits[lv] = dict(zip(("p_s", "p_dC", "p_dW"), fit))
        p_s, p_dC, p_dW = fit
        lists = [c for _, c in rows]
        r = p_s * (1 - p_dC) + (1 - p_s) * p_dW
        for c in lists:
            counts[min(len(c), K) - 1] += 1
        for k in range(1, K):
            probs[k - 1] += len(lists) * r ** (k - 1) * (1 - r)
        probs[K - 1] += len(lists) * r ** (K - 1)
        pairs = [y for c in lists for x, y in zip(c, c[1:]) if not x]
        k_ft += sum(pairs)
        n_pairs += len(pairs)
        pred_ft += len(pairs) * p_s
        k_cut += sum(c[min(len(c), cutoff) - 1] for c in lists)
        pred_cut += len(lists) * accuracy_within(p_s, p_dC, p_dW, cutoff)
    n = sum(counts)
    out = {"n": n, "fit": fits, "levels_without_fit": skipped, "checks": {}}
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
