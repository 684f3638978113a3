"""The statistics of a gradient-attribution study (:mod:`dsh.experiment.run.attribution_study`), read from its record:
the length law's log-log fits per objective term (Theorem 3.2's predicted slopes, :data:`PREDICTED_SLOPE`), the
Theorem 3.1 identity per trajectory, the censoring-robust fit (per-level medians, silent decisions counted as +inf),
the slope in excess of the SFT loss's on the same trajectories (the balanced-weight baseline), and the decision's
per-token KL per level (Theorem 3.2's premise), each with cluster-bootstrap intervals over questions."""

from __future__ import annotations

import math

import numpy as np

from ...core import validate as v
from ...measure.length_law import cluster_draws, cluster_median, joint_cluster_slopes, loglog_slope, median, slope_verdict
from ...task.problems import level_index

PREDICTED_SLOPE = {"reward": 0.0, "kl_reward": 1.0, "kl_k3": 1.0, "sft": None, "dft": None, "kl_immediate": 1.0,
                   "reward_group": 0.0}


MIN_TRAJECTORIES = 200   # a study with fewer trajectories with a decision is reported, not given verdicts
MIN_SPAN = 5.0           # the span of per-level median attempt lengths the length law is fitted over


def study_record(name: str, study, needs=()) -> dict:
    """``study`` checked to be a study record (:func:`run_study`) holding the keys ``needs``."""
    if not isinstance(study, dict) or not all(k in study for k in needs):
        raise ValueError(f"{name} must be a study record (attribution_study.run_study)"
                         + (f" holding {', '.join(needs)}" if needs else f", got {type(study).__name__}"))
    return study


IDENTITY_RTOL = 1e-3   # float32 gradients of one trajectory, summed in another order: agreement to about 1e-4


def reward_identity(study: dict, rtol: float = IDENTITY_RTOL) -> dict:
    """Theorem 3.1 as the per-trajectory identity it is: the surrogate reward weighs every token's score by the same
    advantage, so each part (attempt, check, decision) of a trajectory's reward gradient is |A_i| times that part of
    its SFT-loss gradient. Over a study's trajectories with an advantage and both gradients: how many, the largest
    relative deviation, and how many parts deviate by more than ``rtol``."""
    v.probability("rtol", rtol)
    n, worst, bad = 0, 0.0, 0
    for t in study.get("trajectories", []):
        r, s = t["grad"].get("reward"), t["grad"].get("sft")
        if not r or not s or not t["advantage"]:
            continue
        n += 1
        a = abs(t["advantage"])
        for part in ("attempt", "check", "decision"):
            x, y = r.get(part, 0.0), a * s.get(part, 0.0)
            if x == y:
                continue
            rel = abs(x - y) / max(abs(y), abs(x))
            worst = max(worst, rel)
            bad += rel > rtol
    return {"trajectories": n, "worst": worst, "violations": bad}


SILENT = 1e-6   # a part whose gradient norm is below this share of the attempt's carries none at float32 precision


def carries(split: dict, part: str) -> bool:
    """Whether ``part`` of a gradient split carries a gradient distinguishable from float32 rounding: its norm
    above :data:`SILENT` times the attempt's (a verdict the model is certain of has none)."""
    return split[part] > SILENT * split["attempt"]


def fit_series(rows, group_rows, objectives, against: str) -> dict:
    """Per fit of :func:`fits` against ``against`` (decision or stage), its (L, ratio, question) triples: the
    question is the cluster the bootstrap resamples."""
    series = {o: [(r["L"], r["grad"][o]["attempt"] / r["grad"][o][against], r["prompt"]) for r in rows
                  if r["grad"].get(o) and carries(r["grad"][o], against)] for o in objectives}
    series["reward_group"] = [(g["L"], g["attempt"] / g[against], g["prompt"]) for g in group_rows
                              if carries(g, against)]
    kl_part = (lambda r: r["kl"]["decision"]) if against == "decision" else \
        (lambda r: r["kl"]["decision"] + r["kl"]["check"])
    series["kl_immediate"] = [(r["L"], abs(r["kl"]["attempt"]) / abs(kl_part(r)), r["prompt"]) for r in rows
                              if kl_part(r) != 0]
    return series


def fits(rows, group_rows, objectives, seed: int = 0, by_question: bool = True) -> dict:
    """The length law per objective, keyed ``"<objective> / decision"`` and ``"<objective> / stage"``: the log-log
    slope of |g_attempt| / |g_decision| (the paper's one decision action) and of |g_attempt| / |g_stage| (check and
    decision together) on L over trajectories, with its cluster-bootstrap interval (questions resampled) and,
    against the decision, the verdict on Theorem 3.2's prediction (:data:`PREDICTED_SLOPE`; None: the theorem
    predicts nothing for it); the same for the group-summed reward gradient (``reward_group``) and for the immediate
    KL itself (``kl_immediate``: |k1 sum of the attempt| / |k1 sum of the decision|, or of check and decision).
    Trajectories whose part carries no gradient (:func:`carries`: a verdict the model is certain of) are left out of
    the fit and counted (``silent``). ``by_question=False`` resamples trajectories one by one instead (the design comparison only: a
    question's samples are not independent, :func:`dsh.measure.length_law.bootstrap_coverage`)."""
    out = {}
    for against in ("decision", "stage"):
        series = fit_series(rows, group_rows, objectives, against)
        for o, pairs in series.items():
            got = [r["grad"][o] for r in rows if r["grad"].get(o)] if o in objectives else \
                group_rows if o == "reward_group" else []
            silent = sum(not carries(x, against) for x in got)
            f = loglog_slope([x for x, _, _ in pairs], [y for _, y, _ in pairs], seed=seed,
                             clusters=[q for *_, q in pairs] if by_question else None) if pairs else \
                {"n": 0, "span": None, "slope": None, "ci": [None, None], "clusters": 0}
            # Theorem 3.2 speaks of the decision as one action; with the check counted as pi_d's it predicts nothing
            pred = PREDICTED_SLOPE.get(o) if against == "decision" else None
            f["silent"] = silent        # trajectories whose part carries no gradient at float32 precision
            f["predicted"] = pred
            f["verdict"] = None if pred is None else slope_verdict(f["ci"], pred)
            out[f"{o} / {against}"] = f
    return out


MIN_PER_LEVEL = 10   # trajectories a level needs to enter a fit's own span and its per-level medians


def log_ratios(study: dict, term: str) -> list[tuple]:
    """(level, L, log ratio, question) of every trajectory of a study for ``term`` against the decision: the log of
    |g_attempt| / |g_decision| (``kl_immediate``: of the immediate KL's), +inf where the decision part is silent
    (:func:`carries`; for the immediate KL: exactly 0) - the censored ones kept, with the value they are known to
    exceed."""
    out = []
    for r in study["trajectories"]:
        if term == "kl_immediate":
            a, d = abs(r["kl"]["attempt"]), abs(r["kl"]["decision"])
            if a == 0:
                continue
            out.append((r["level"], r["L"], math.log(a / d) if d else math.inf, r["prompt"]))
        elif r["grad"].get(term):
            g = r["grad"][term]
            if g["attempt"] <= 0:
                continue
            out.append((r["level"], r["L"], math.log(g["attempt"] / g["decision"]) if carries(g, "decision")
                        else math.inf, r["prompt"]))
    return out


def robust_fit(study: dict, term: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """The length law of ``term`` against the decision with nothing censored away: per level with at least
    :data:`MIN_PER_LEVEL` trajectories, the median of log(|g_attempt| / |g_decision|) with a silent decision counted
    as +inf (a median stays defined while fewer than half are silent), regressed on the level's median log L; a 95 %
    interval from resampling questions and the verdict on Theorem 3.2's prediction (:data:`PREDICTED_SLOPE`; None
    without an interval). Also the fit's own span: the longest over the shortest per-level median L of the levels it
    uses (``span``). A level whose median is +inf is left out and named (``censored_levels``)."""
    rows = log_ratios(study, term)
    names = sorted({r[0] for r in rows})
    code = {lv: i for i, lv in enumerate(names)}
    lv_of = np.array([code[r[0]] for r in rows], dtype=int)
    log_l = np.array([math.log(r[1]) for r in rows], dtype=float)
    ys = np.array([r[2] for r in rows], dtype=float)

    def per_level(ix):
        """Per level of the rows ``ix`` (in the order the levels first appear there): its median log L and median
        ratio; the levels whose median ratio is +inf (censored) apart."""
        levels = lv_of[ix]
        found, first = np.unique(levels, return_index=True)
        pts, cens = [], []
        for c in found[np.argsort(first)]:
            sel = ix[levels == c]
            if sel.size < MIN_PER_LEVEL:
                continue
            my = median(ys[sel])
            if math.isinf(my):
                cens.append(names[c])
                continue
            pts.append((names[c], median(log_l[sel]), my))
        return pts, cens

    def slope(pts):
        if len(pts) < 3:
            return None
        x, y = np.array([p[1] for p in pts]), np.array([p[2] for p in pts])
        d = x - x.mean()
        return float(d @ (y - y.mean()) / (d @ d)) if float(d @ d) > 0 else None

    pts, cens = per_level(np.arange(len(rows)))
    out = {"term": term, "levels": [p[0] for p in pts], "censored_levels": sorted(cens),
           "span": float(math.exp(max(p[1] for p in pts) - min(p[1] for p in pts))) if pts else None,
           "silent": sum(math.isinf(y) for *_, y, _ in rows), "n": len(rows), "slope": slope(pts), "ci": [None, None],
           "verdict": None}
    if out["slope"] is None:
        return out
    labels = np.asarray([q for *_, q in rows])
    draws = [b for ix in cluster_draws(labels, n_boot, np.random.default_rng(seed))
             if (b := slope(per_level(ix)[0])) is not None]
    if len(draws) >= n_boot // 2:
        out["ci"] = [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]
        out["verdict"] = slope_verdict(out["ci"], PREDICTED_SLOPE[term])
    return out


def excess_fit(study: dict, term: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """The length law of ``term`` against the balanced-weight baseline: the log-log slope on L of its
    |g_attempt| / |g_decision| divided by the SFT loss's on the same trajectory (every token's score weighted alike,
    so its ratio grows with L by the attempt's sum of L scores alone), over the trajectories where both decisions carry
    a gradient, with the cluster-bootstrap interval (questions resampled). 0: the term weighs attempt and decision as
    SFT does; Theorem 3.2's KL-to-go on the attempt adds one power of L (+1)."""
    pairs = []
    for r in study["trajectories"]:
        g, b = r["grad"].get(term), r["grad"].get("sft")
        if g and b and carries(g, "decision") and carries(b, "decision") and g["attempt"] > 0 and b["attempt"] > 0:
            pairs.append((r["L"], (g["attempt"] / g["decision"]) / (b["attempt"] / b["decision"]), r["prompt"]))
    if not pairs:
        return {"n": 0, "span": None, "slope": None, "ci": [None, None]}
    return loglog_slope([x for x, _, _ in pairs], [y for _, y, _ in pairs], n_boot=n_boot, seed=seed,
                        clusters=[q for *_, q in pairs])


def decision_kl_by_level(study: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """Theorem 3.2's premise, measured: per level, the median per-token k1 of the decision and of the attempt (the
    KL's parts divided by their tokens) with cluster-bootstrap intervals (questions resampled). The theorem takes a
    per-token divergence of one size, the decision's and the attempt's alike, at every length."""
    by = {}
    for r in study["trajectories"]:
        if r["tokens"]["decision"] and r["tokens"]["attempt"]:
            by.setdefault(r["level"], []).append((r["kl"]["decision"] / r["tokens"]["decision"],
                                                  r["kl"]["attempt"] / r["tokens"]["attempt"], r["prompt"]))
    out = {}
    for lv in sorted(by, key=level_index):
        rows = by[lv]
        q = [c for *_, c in rows]
        out[lv] = {"n": len(rows), "decision": cluster_median([d for d, _, _ in rows], q, n_boot, seed),
                   "attempt": cluster_median([a for _, a, _ in rows], q, n_boot, seed)}
    return out


def levels_apart(by_level: dict) -> bool:
    """Whether two levels of :func:`decision_kl_by_level` have the decision's per-token k1 intervals apart: the premise
    of one per-token divergence at every level contradicted beyond the intervals."""
    cis = [lv["decision"]["ci"] for lv in by_level.values()]
    return any(a[1] < b[0] for a in cis for b in cis)


def slope_correlation(study: dict, n_boot: int = 1000, seed: int = 0):
    """The correlation of a study's slopes (every fit of :func:`fits` with a slope, keyed ``(term, against)``): its
    questions resampled jointly for all fits (:func:`dsh.measure.length_law.joint_cluster_slopes`), so that fits
    resting on the same trajectories move together as their estimates do. A DataFrame, fits by fits."""
    import pandas as pd

    study_record("study", study, ("trajectories", "groups", "objectives", "fits"))
    series = {}
    for against in ("decision", "stage"):
        for o, pairs in fit_series(study["trajectories"], study["groups"], study["objectives"], against).items():
            if (study["fits"].get(f"{o} / {against}") or {}).get("slope") is not None:
                series[(o, against)] = tuple(np.array(a) for a in zip(*pairs))
    if not series:
        raise ValueError("study has no fit with a slope")
    keys, boots = joint_cluster_slopes(series, n_boot, seed)
    return pd.DataFrame(boots, columns=pd.MultiIndex.from_tuples(keys, names=["term", "against"])).corr()
