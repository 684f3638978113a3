"""Verdicts on the paper's empirical claims from calibrated stages (``{stage kind: calibration}``, as
:func:`dsh.measure.stage.calibrate_stage` writes them): (i) the two-stage model predicts accuracy, (i') it predicts
what the fit did not use, (ii) RL improves pi_d more than pi_sample, (iii) out-of-distribution accuracy is limited
by pi_sample, and the KL ablation beyond the paper.

A verdict only where the data could have said the opposite: each claim is judged per level and level-stratified
(equal level weights) over the levels where it can fail - those whose p_s lies in :data:`GRADED` (a level answered
always or never right leaves a decision nothing to change), and for (i) where a correctness-blind decision misses
the observed accuracy by :data:`BLIND_MARGIN` - never on a ratio pooled over levels of different p_s. Elsewhere the
verdict is "not testable here: <reason>", apart from "cannot tell": a rate that is undefined or rests on fewer than
:data:`MIN_CANDIDATES` candidates (p_s on the responses with an answer, p_dC on the correct candidates, p_dW on the
wrong ones), or a difference whose 95 % interval covers 0. Every stage is read from the same block (all responses).
No verdict compares point estimates."""

from __future__ import annotations

import math

from ..task.problems import level_index
from ..theory.two_stage import accuracy
from .calibration import Z95

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
    interval = [diff - Z95 * se, diff + Z95 * se]
    return sign_verdict(interval), interval


def sign_verdict(interval) -> str:
    """'holds' when a 95 % interval lies above 0, 'fails' below, 'cannot tell' across it."""
    lo, hi = interval
    return "holds" if lo > 0 else "fails" if hi < 0 else "cannot tell"


def _contrast_se(a: dict, b: dict):
    """Standard error of any difference of differences of p_s and p_dW between estimates ``a`` and ``b``
    (e.g. delta p_dW - delta p_s): the four bootstrap errors combined as if independent; None if undefined."""
    ses = [_se(a, "p_s"), _se(b, "p_s"), _se(a, "p_d_given_wrong"), _se(b, "p_d_given_wrong")]
    return None if None in ses else math.sqrt(sum(x * x for x in ses))


GRADED = (0.2, 0.8)      # a level whose p_s lies in this band can show a decision's effect on accuracy
BLIND_MARGIN = 0.10      # claim (i) is judged only where a correctness-blind decision misses accuracy by this much
NOT_TESTABLE = "not testable here"


def block(stage: dict) -> dict:
    """The calibration block every claim reads, the same for every stage: all responses (a truncated response's
    first attempt still counts for p_s; dropping them removed different shares of different stages' responses)."""
    return stage["all"]


def _levels(cal: dict, stage: str) -> dict:
    """The levels of ``stage``'s calibration block (:func:`block`; {} when the results lack the stage)."""
    return block(cal[stage])["by_level"] if cal.get(stage) else {}


def graded(est: dict) -> bool:
    """Whether a level's p_s lies in :data:`GRADED` (resampling can then change its accuracy) on at least
    :data:`MIN_CANDIDATES` candidates."""
    x = _rate(est, "p_s")
    return x is not None and GRADED[0] <= x <= GRADED[1]


def stop_rate(est: dict):
    """The share of a level's candidates followed by STOP, right or wrong (None without candidates)."""
    nc, nw = est.get("n_correct_candidates") or 0, est.get("n_wrong_candidates") or 0
    if nc + nw == 0:
        return None
    stops = (nc * est["p_d_given_correct"] if nc else 0.0) + (nw * (1 - est["p_d_given_wrong"]) if nw else 0.0)
    return stops / (nc + nw)


def blind_prediction(est: dict):
    """The accuracy a correctness-blind decision predicts (the two-stage formula with p_dC = 1 - p_dW = the level's
    :func:`stop_rate`): what claim (i)'s prediction must beat to show that the decision reads correctness."""
    q = stop_rate(est)
    if q is None or est.get("p_s") is None:
        return None
    return accuracy(est["p_s"], q, 1 - q, est.get("attempt_budget"))


def _se_obs(est: dict):
    return (est["ci_high"] - est["ci_low"]) / (2 * Z95) if est.get("ci_low") is not None else None


def _se_pred(est: dict):
    if est.get("predicted_ci_low") is None or est.get("predicted_ci_high") is None:
        return None
    return (est["predicted_ci_high"] - est["predicted_ci_low"]) / (2 * Z95)


def stratified(rows: list[dict]) -> dict | None:
    """The level-stratified contrast of per-level ``difference`` / ``se`` rows: their mean with equal level weights
    and its 95 % interval (levels independent), None without rows."""
    rows = [r for r in rows if r.get("difference") is not None and r.get("se") is not None]
    if not rows:
        return None
    k = len(rows)
    mean = sum(r["difference"] for r in rows) / k
    se = math.sqrt(sum(r["se"] ** 2 for r in rows)) / k
    return {"levels": [r["level"] for r in rows], "difference": mean, "interval": [mean - Z95 * se, mean + Z95 * se]}


def _combine(verdicts_: list[str]) -> str:
    """One verdict from several stages' or seeds': theirs when they agree; testable ones decide when some are not
    testable; else "cannot tell"."""
    mine = [x for x in verdicts_ if not x.startswith(NOT_TESTABLE)]
    if not mine:
        return verdicts_[0] if verdicts_ and len(set(verdicts_)) == 1 else NOT_TESTABLE
    return mine[0] if len(set(mine)) == 1 else "cannot tell"


def claim_predicts(cal: dict, min_n: int = 30) -> dict:
    """Claim (i): the two-stage model predicts accuracy, judged per level of the RL and SFT (reflection) stages where
    it can fail: a level with p_s outside :data:`GRADED` is "not testable here" (accuracy is then near p_s whatever
    the decision does), and so is one where the correctness-blind prediction (:func:`blind_prediction`) is within
    :data:`BLIND_MARGIN` of the observed accuracy (any decision would pass). On a testable level: "holds" when the
    prediction lies in the observed accuracy's 95 % interval or the observation in the prediction's, else "fails".
    Per stage, the level-stratified gap (observed - predicted, equal level weights, 95 % interval): "holds" when the
    interval lies within +-:data:`BLIND_MARGIN`, "fails" when it excludes 0 otherwise, else "cannot tell"; the blind
    prediction's stratified gap beside it."""
    per_level, stages = [], {}
    for stage in ("rl", "sft_reflection"):
        gaps, blind_gaps = [], []
        levels = _levels(cal, stage)
        for lv in sorted(levels, key=level_index):
            s = levels[lv]
            row = {"stage": stage, "level": lv, "p_s": s.get("p_s"), "observed": s["observed_accuracy"],
                   "predicted": s.get("predicted_accuracy"), "blind": blind_prediction(s),
                   "difference": None, "interval": [None, None]}
            if s["n"] < min_n or _rate(s, "p_s") is None or s.get("predicted_accuracy") is None:
                row["verdict"] = "cannot tell"
            elif not graded(s):
                row["verdict"] = f"{NOT_TESTABLE}: p_s {s['p_s']:.2f} outside {GRADED[0]}-{GRADED[1]}"
            elif row["blind"] is None:
                row["verdict"] = "cannot tell"
            elif abs(row["blind"] - row["observed"]) < BLIND_MARGIN:
                row["verdict"] = (f"{NOT_TESTABLE}: a correctness-blind decision predicts {row['blind']:.2f}, within "
                                  f"{BLIND_MARGIN} of {row['observed']:.2f}")
            else:
                inside = s["ci_low"] <= s["predicted_accuracy"] <= s["ci_high"] or (
                    s.get("predicted_ci_low") is not None
                    and s["predicted_ci_low"] <= s["observed_accuracy"] <= s["predicted_ci_high"])
                row["verdict"] = "holds" if inside else "fails"
                se_o, se_p = _se_obs(s), _se_pred(s)
                se = math.sqrt(se_o ** 2 + se_p ** 2) if None not in (se_o, se_p) else None
                row["difference"] = s["observed_accuracy"] - s["predicted_accuracy"]
                row["se"] = se
                if se is not None:
                    row["interval"] = [row["difference"] - Z95 * se, row["difference"] + Z95 * se]
                gaps.append(row)
                blind_gaps.append({"level": lv, "difference": s["observed_accuracy"] - row["blind"], "se": se_o})
            per_level.append(row)
        st = stratified(gaps)
        if st is None:
            why = sorted({r["verdict"].split(": ")[0] for r in per_level if r["stage"] == stage})
            stages[stage] = {"verdict": f"{NOT_TESTABLE}: no level of {stage} where the claim could fail"
                             if why == [NOT_TESTABLE] else "cannot tell", "stratified": None}
            continue
        lo, hi = st["interval"]
        verdict = ("holds" if -BLIND_MARGIN <= lo and hi <= BLIND_MARGIN else
                   "fails" if lo > 0 or hi < 0 else "cannot tell")
        stages[stage] = {"verdict": verdict, "stratified": st, "blind": stratified(blind_gaps)}
    verdict = _combine([x["verdict"] for x in stages.values()])
    ev = []
    for stage, x in stages.items():
        st = x["stratified"]
        if st is None:
            ev.append(f"{stage}: {x['verdict']}")
        else:
            b = x["blind"]
            ev.append(f"{stage} on {', '.join(st['levels'])}: observed - predicted {st['difference']:+.3f} "
                      f"[{st['interval'][0]:+.3f}, {st['interval'][1]:+.3f}], correctness-blind "
                      f"{b['difference']:+.3f} [{b['interval'][0]:+.3f}, {b['interval'][1]:+.3f}]")
    return {"claim": "(i) the two-stage model predicts accuracy", "verdict": verdict, "evidence": "; ".join(ev),
            "per_level": per_level, "stages": stages}


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


def _contrast_rows(cal: dict, a: str, b: str, gate: str, key, min_n: int, se=_contrast_se) -> list[dict]:
    """Per level of stages ``a`` and ``b``: ``key(x, y)`` (x of a, y of b) with its standard error ``se(x, y)``
    (default :func:`_contrast_se`), or the reason there is none: a level where stage ``gate``'s p_s lies outside
    :data:`GRADED` is "not testable here", one with too few responses or candidates "cannot tell"."""
    la, lb, lg = _levels(cal, a), _levels(cal, b), _levels(cal, gate)
    rows = []
    for lv in sorted(set(la) & set(lb), key=level_index):
        x, y = la[lv], lb[lv]
        row = {"level": lv, "difference": None, "interval": [None, None], "se": None}
        g = lg.get(lv)
        if g is None or g["n"] < min_n or _rate(g, "p_s") is None:
            row["verdict"] = "cannot tell"          # too few responses to tell whether the level is graded
        elif not graded(g):
            row["verdict"] = f"{NOT_TESTABLE}: {gate} p_s {g['p_s']:.2f} outside {GRADED[0]}-{GRADED[1]}"
        elif min(x["n"], y["n"]) < min_n or None in (_rate(x, "p_s"), _rate(y, "p_s"), _rate(x, "p_d_given_wrong"),
                                                      _rate(y, "p_d_given_wrong")):
            row["verdict"] = "cannot tell"
        else:
            diff, err = key(x, y), se(x, y)
            v_, ci = _interval_verdict(diff, err)
            row.update(verdict=v_, difference=diff, interval=ci, se=err)
        rows.append(row)
    return rows


def _stratified_claim(claim: str, rows: list[dict], what: str) -> dict:
    st = stratified(rows)
    if st is None:
        testable = [r for r in rows if not r["verdict"].startswith(NOT_TESTABLE)]
        verdict = "cannot tell" if testable else f"{NOT_TESTABLE}: no graded level ({len(rows)} levels)"
        ev = verdict if rows else "needs both stages"
    else:
        verdict = sign_verdict(st["interval"])
        ev = (f"{what}, level-stratified over {', '.join(st['levels'])}: {st['difference']:+.3f}, 95 % interval "
              f"[{st['interval'][0]:+.3f}, {st['interval'][1]:+.3f}]")
    for r in rows:
        r.pop("se", None)
    return {"claim": claim, "verdict": verdict, "evidence": ev, "per_level": rows, "stratified": st}


def claim_rl_improves_decision(cal: dict, min_n: int = 30) -> dict:
    """Claim (ii): RL improves pi_d more than pi_sample: delta p_dW - delta p_s from SFT (reflection) to RL per level,
    with its 95 % interval (bootstrap errors), on the levels where SFT (reflection)'s p_s lies in :data:`GRADED`
    (decided before RL: where p_s is 0 or 1 resampling cannot pay, and giving it up is no evidence), and
    level-stratified over those levels: "holds" above 0, "fails" below, "cannot tell" across; "not testable here"
    without a graded level."""
    if not (cal.get("rl") and cal.get("sft_reflection")):
        return {"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": "cannot tell",
                "evidence": "needs both the RL and the SFT (reflection) stages", "per_level": [], "stratified": None}
    rows = _contrast_rows(cal, "rl", "sft_reflection", "sft_reflection",
                          lambda x, y: (x["p_d_given_wrong"] - y["p_d_given_wrong"]) - (x["p_s"] - y["p_s"]), min_n)
    return _stratified_claim("(ii) RL improves pi_d more than pi_sample", rows, "delta p_dW - delta p_s")


def claim_ood_limited_by_sampling(cal: dict, min_n: int = 30) -> dict:
    """Claim (iii): out-of-distribution accuracy is limited by pi_sample: over the RL stage's graded levels (p_s in
    :data:`GRADED`, p_s and p_dW on at least :data:`MIN_CANDIDATES` candidates), from the easiest such level to each
    harder one, (drop of p_s) - (drop of p_dW) with its 95 % interval, and level-stratified over them; "not testable
    here" with fewer than two graded levels."""
    pts = sorted((level_index(lv), lv, s) for lv, s in _levels(cal, "rl").items())
    usable = [(lv, s) for _, lv, s in pts if s["n"] >= min_n and graded(s) and _rate(s, "p_d_given_wrong") is not None]
    claim = "(iii) OOD accuracy is limited by pi_sample"
    if len(usable) < 2:
        unknown = any(s["n"] < min_n or _rate(s, "p_s") is None for _, _, s in pts) or not pts
        return {"claim": claim, "verdict": "cannot tell" if unknown else
                f"{NOT_TESTABLE}: {len(usable)} graded level(s) of RL with p_dW defined",
                "evidence": "RL p_s by level: " + ", ".join(f"{lv} {s.get('p_s'):.2f}" for _, lv, s in pts
                                                             if s.get("p_s") is not None),
                "per_level": [], "stratified": None}
    base_lv, base = usable[0]
    rows = []
    for lv, s in usable[1:]:
        diff = (base["p_s"] - s["p_s"]) - (base["p_d_given_wrong"] - s["p_d_given_wrong"])
        se = _contrast_se(base, s)
        v_, ci = _interval_verdict(diff, se)
        rows.append({"level": lv, "verdict": v_, "difference": diff, "interval": ci, "se": se, "relative_to": base_lv})
    return _stratified_claim(claim, rows, f"drop of p_s - drop of p_dW from {base_lv}")


def claim_kl_keeps_decision(cal: dict, high: str, low: str, min_n: int = 30) -> dict:
    """The KL ablation (beyond the paper; Theorem 3.2 on a real model): RL at the larger KL coefficient (stage kind
    ``high``) keeps more of pi_d than at the smaller (``low``): p_dW(high) - p_dW(low) per level where SFT
    (reflection)'s p_s lies in :data:`GRADED`, with its 95 % interval, and level-stratified."""
    if not (cal.get(high) and cal.get(low) and cal.get("sft_reflection")):
        return {"claim": f"KL ablation: {high} keeps more of pi_d than {low}", "verdict": "cannot tell",
                "evidence": "needs both arms and SFT (reflection)", "per_level": [], "stratified": None}
    def p_dw_se(x, y):      # the p_dW difference's own error (the p_s terms of _contrast_se do not enter)
        ses = [_se(x, "p_d_given_wrong"), _se(y, "p_d_given_wrong")]
        return None if None in ses else math.sqrt(ses[0] ** 2 + ses[1] ** 2)

    rows = _contrast_rows(cal, high, low, "sft_reflection",
                          lambda x, y: x["p_d_given_wrong"] - y["p_d_given_wrong"], min_n, se=p_dw_se)
    return _stratified_claim(f"KL ablation: {high} keeps more of pi_d than {low}", rows, "p_dW difference")


def verdicts(cal: dict, min_n: int = 30) -> list[dict]:
    """A verdict on each empirical claim of the paper from ``{stage kind: calibration}``: :func:`claim_predicts`
    (i), :func:`claim_predicts_unfitted` (i'), :func:`claim_rl_improves_decision` (ii),
    :func:`claim_ood_limited_by_sampling` (iii), each with its per-level verdicts (``per_level``) where it has them;
    the evidence string carries the numbers."""
    if not isinstance(cal, dict):
        raise ValueError(f"cal must map stage kinds to their calibration, got {type(cal).__name__}")
    return [claim_predicts(cal, min_n), claim_predicts_unfitted(cal), claim_rl_improves_decision(cal, min_n),
            claim_ood_limited_by_sampling(cal, min_n)]
