"""Verdicts on the paper's empirical claims from calibrated stages (``{stage kind: calibration}``, as
:func:`dsh.measure.stage.calibrate_stage` writes them): (i) the two-stage model predicts accuracy, (i') it predicts
what the fit did not use, (ii) RL improves pi_d more than pi_sample, (iii) out-of-distribution accuracy is limited
by pi_sample; pooled and per level, "cannot tell" where the data cannot tell: a rate that is undefined or rests on
fewer than :data:`MIN_CANDIDATES` candidates (p_s on the responses with an answer, p_dC on the correct candidates,
p_dW on the wrong ones), or a difference whose 95 % interval covers 0. No verdict compares point estimates."""

from __future__ import annotations

import math

from ..task.problems import level_index
from .calibration import Z95
from .stage import preferred

MIN_CANDIDATES = 20     # a rate resting on fewer candidates than this carries no verdict
_BASIS = {"p_s": "n_candidates", "p_d_given_correct": "n_correct_candidates", "p_d_given_wrong": "n_wrong_candidates"}


def _rate(est: dict, key: str):
    """``est[key]`` (p_s, p_d_given_correct, p_d_given_wrong) when defined and resting on at least
    :data:`MIN_CANDIDATES` candidates, else None. Results written before the candidate counts were recorded
    (no ``n_correct_candidates``) are read as they stand."""
    x, n = est.get(key), est.get(_BASIS[key])
    return None if x is None or (n is not None and n < MIN_CANDIDATES) else x


def _se(est: dict, key: str):
    """Standard error read from a bootstrap percentile interval (half-width / 1.96); None if undefined."""
    ci = est.get(f"{key}_ci")
    if est.get(key) is None or not ci or None in ci:
        return None
    return (ci[1] - ci[0]) / (2 * Z95)


def _interval_verdict(diff: float, se: float | None) -> tuple[str, list]:
    """'holds' when the 95 % interval of ``diff`` lies above 0, 'fails' below, 'cannot tell' across it."""
    if se is None:
        return "cannot tell", [None, None]
    lo, hi = diff - Z95 * se, diff + Z95 * se
    return ("holds" if lo > 0 else "fails" if hi < 0 else "cannot tell"), [lo, hi]


def _contrast_se(a: dict, b: dict):
    """Standard error of any difference of differences of p_s and p_dW between estimates ``a`` and ``b``
    (e.g. delta p_dW - delta p_s): the four bootstrap errors combined as if independent; None if undefined."""
    ses = [_se(a, "p_s"), _se(b, "p_s"), _se(a, "p_d_given_wrong"), _se(b, "p_d_given_wrong")]
    return None if None in ses else math.sqrt(sum(x * x for x in ses))


def _levels(cal: dict, stage: str) -> dict:
    """The preferred calibration block's levels of ``stage`` ({} when the results lack it)."""
    return preferred(cal[stage])["by_level"] if cal.get(stage) else {}


def claim_predicts(cal: dict, min_n: int = 30) -> dict:
    """Claim (i): the two-stage model predicts accuracy. Holds when on >= 80 % of the levels of the RL and SFT
    (reflection) stages the prediction lies in the observed accuracy's 95 % interval or the observation in the
    prediction's; "cannot tell" when a level has fewer than ``min_n`` responses or no level has a defined
    prediction with p_s on at least :data:`MIN_CANDIDATES` candidates."""
    rows, small = [], False
    for stage in ("rl", "sft_reflection"):
        for lv, s in _levels(cal, stage).items():
            small |= s["n"] < min_n
            if s["predicted_accuracy"] is None or s["predicted_ci_low"] is None or _rate(s, "p_s") is None:
                continue    # (a small p_dC or p_dW basis widens the prediction's bootstrap interval instead)
            inside = s["ci_low"] <= s["predicted_accuracy"] <= s["ci_high"] or \
                s["predicted_ci_low"] <= s["observed_accuracy"] <= s["predicted_ci_high"]
            rows.append((stage, lv, s["observed_accuracy"], s["predicted_accuracy"], inside))
    if small or not rows:
        verdict = "cannot tell"
    else:
        verdict = "holds" if sum(r[4] for r in rows) >= 0.8 * len(rows) else "fails"
    return {"claim": "(i) the two-stage model predicts accuracy", "verdict": verdict,
            "evidence": "; ".join(f"{s} {lv}: observed {o:.2f}, predicted {p:.2f}" for s, lv, o, p, _ in rows)
            or "no level with defined estimates"}


def claim_predicts_unfitted(cal: dict) -> dict:
    """Claim (i'): the model predicts what the fit did not use (the number of candidates, the F->T rate, the
    accuracy under a cut-off; :mod:`dsh.measure.predictions`), for the RL and SFT (reflection) stages; judged with
    questions allowed to differ (``unfitted_mixture``) where the results hold it, so that "fails" means the
    two-stage assumptions fail, not that questions differ in difficulty."""
    verdicts, ev = [], []
    for stage in ("rl", "sft_reflection"):
        c = cal.get(stage) or {}
        u, mix = c.get("unfitted"), c.get("unfitted_mixture")
        use = mix or u      # questions may differ: "fails" then means the two-stage assumptions fail
        if use:
            verdicts.append(use["verdict"])
            bad = [k for k, x in use.get("checks", {}).items() if not x["agrees"]]
            ev.append(f"{stage}: {use['verdict']}" + (f" ({', '.join(bad)} disagree)" if bad else "")
                      + (f"; with questions alike: {u['verdict']}" if mix and u else ""))
    verdict = ("cannot tell" if not verdicts or "cannot tell" in verdicts
               else "fails" if "fails" in verdicts else "holds")
    return {"claim": "(i') the two-stage model predicts what it was not fitted to", "verdict": verdict,
            "evidence": "; ".join(ev) or "needs the RL and SFT (reflection) stages"}


def claim_rl_improves_decision(cal: dict, min_n: int = 30) -> dict:
    """Claim (ii): RL improves pi_d more than pi_sample: delta p_dW - delta p_s from SFT (reflection) to RL, its
    95 % interval (bootstrap errors) above 0 ("holds"), below ("fails") or across ("cannot tell"); pooled over the
    levels and per level."""
    rl, sr = cal.get("rl"), cal.get("sft_reflection")
    per_level = []
    if not (rl and sr):
        return {"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": "cannot tell",
                "evidence": "needs both the RL and the SFT (reflection) stages", "per_level": per_level}
    a, b = preferred(rl)["overall"], preferred(sr)["overall"]
    need = [_rate(a, "p_s"), _rate(b, "p_s"), _rate(a, "p_d_given_wrong"), _rate(b, "p_d_given_wrong")]
    if any(x is None for x in need) or min(a["n"], b["n"]) < min_n * 3:
        verdict, ev = "cannot tell", (f"n = {a['n']} and {b['n']}; p_s, p_dW undefined or on fewer than "
                                      f"{MIN_CANDIDATES} candidates: {need}")
    else:
        ds, dw = a["p_s"] - b["p_s"], a["p_d_given_wrong"] - b["p_d_given_wrong"]
        verdict, ci = _interval_verdict(dw - ds, _contrast_se(a, b))
        ev = (f"RL minus SFT (reflection): delta p_s = {ds:+.3f}, delta p_dW = {dw:+.3f}; delta p_dW - delta p_s "
              f"= {dw - ds:+.3f}" + (f", 95 % interval [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci[0] is not None else
                                     ", interval undefined"))
    la, lb = _levels(cal, "rl"), _levels(cal, "sft_reflection")
    for lv in sorted(set(la) & set(lb), key=level_index):
        x, y = la[lv], lb[lv]
        if min(x["n"], y["n"]) < min_n or None in (_rate(x, "p_s"), _rate(y, "p_s"), _rate(x, "p_d_given_wrong"),
                                                    _rate(y, "p_d_given_wrong")):
            per_level.append({"level": lv, "verdict": "cannot tell", "difference": None, "interval": [None, None]})
            continue
        diff = (x["p_d_given_wrong"] - y["p_d_given_wrong"]) - (x["p_s"] - y["p_s"])
        level_verdict, ci = _interval_verdict(diff, _contrast_se(x, y))
        per_level.append({"level": lv, "verdict": level_verdict, "difference": diff, "interval": ci})
    return {"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": verdict, "evidence": ev,
            "per_level": per_level}


def claim_ood_limited_by_sampling(cal: dict, min_n: int = 30) -> dict:
    """Claim (iii): out-of-distribution accuracy is limited by pi_sample: from the easiest usable level of the RL
    stage, p_s drops more than p_dW, judged by the 95 % interval of (drop of p_s) - (drop of p_dW) at each level
    (per level) and at the hardest usable level (the claim's verdict). Needs >= 3 levels with ``min_n`` responses
    and p_s, p_dW on at least :data:`MIN_CANDIDATES` candidates."""
    pts = sorted((level_index(lv), lv, s) for lv, s in _levels(cal, "rl").items())
    usable = [(lv, s) for _, lv, s in pts
              if _rate(s, "p_s") is not None and _rate(s, "p_d_given_wrong") is not None and s["n"] >= min_n]
    per_level = []
    if len(usable) < 3:
        verdict, ev = "cannot tell", (f"{len(usable)} levels with enough responses and p_s, p_dW defined on at "
                                      f"least {MIN_CANDIDATES} candidates")
    else:
        base_lv, base = usable[0]
        for lv, s in usable[1:]:
            # drop of p_s minus drop of p_dW from the easiest level: > 0 when pi_sample degrades more
            diff = (base["p_s"] - s["p_s"]) - (base["p_d_given_wrong"] - s["p_d_given_wrong"])
            level_verdict, ci = _interval_verdict(diff, _contrast_se(base, s))
            per_level.append({"level": lv, "verdict": level_verdict, "difference": diff, "interval": ci,
                              "relative_to": base_lv})
        last = per_level[-1]
        verdict = last["verdict"]
        ps, pw = [s["p_s"] for _, s in usable], [s["p_d_given_wrong"] for _, s in usable]
        ev = (f"from the easiest to the hardest usable level ({base_lv} -> {last['level']}): p_s {ps[0]:.2f} -> "
              f"{ps[-1]:.2f}, p_dW {pw[0]:.2f} -> {pw[-1]:.2f}; drop of p_s - drop of p_dW = "
              f"{last['difference']:+.3f}" + (f", 95 % interval [{last['interval'][0]:+.3f}, "
                                             f"{last['interval'][1]:+.3f}]" if last["interval"][0] is not None else ""))
    return {"claim": "(iii) OOD accuracy is limited by pi_sample", "verdict": verdict, "evidence": ev,
            "per_level": per_level}


def verdicts(cal: dict, min_n: int = 30) -> list[dict]:
    """A plain verdict on each empirical claim of the paper from ``{stage kind: calibration}``:
    :func:`claim_predicts` (i), :func:`claim_predicts_unfitted` (i'), :func:`claim_rl_improves_decision` (ii),
    :func:`claim_ood_limited_by_sampling` (iii); (ii) and (iii) also get a verdict per level (``per_level``).
    "cannot tell" when a level has fewer than ``min_n`` responses or a needed estimate is undefined; the evidence
    string carries the numbers."""
    if not isinstance(cal, dict):
        raise ValueError(f"cal must map stage kinds to their calibration, got {type(cal).__name__}")
    return [claim_predicts(cal, min_n), claim_predicts_unfitted(cal), claim_rl_improves_decision(cal, min_n),
            claim_ood_limited_by_sampling(cal, min_n)]
