"""Tables, figures and verdicts on the paper's claims, from a results folder (dsh.experiment.pipeline) and the paper's
printed numbers (dsh/core/paper_results.yaml, always labelled as the paper's)."""

from __future__ import annotations

import math

import pandas as pd

from ..core.paper import paper_results
from ..measure.calibration import Z95
from ..measure.stage import preferred
from ..task.problems import level_index
from .presets import STAGE_LABELS, get


def _fmt(acc, lo, hi):
    return f"{100 * acc:.1f} ({100 * lo:.1f}, {100 * hi:.1f})"


def table1(results: dict) -> pd.DataFrame:
    """Accuracy (%) with the paper's 95% normal-approximation interval, by stage and level."""
    rows = {}
    for stage, by_level in results["summary"]["accuracy"].items():
        rows[STAGE_LABELS[stage]] = {lv: _fmt(s["observed_accuracy"], s["ci_low"], s["ci_high"]) + f" n={s['n']}"
                                     for lv, s in by_level.items()}
    return pd.DataFrame(rows).T


def paper_table1() -> pd.DataFrame:
    """The paper's Table 1 (Qwen2.5-7B-Instruct), as printed."""
    t = paper_results()["table1"]
    rows = {}
    for name, r in t["models"].items():
        rows[name] = {lv: f"{a:.1f} ({lo:.1f}, {hi:.1f})" for lv, a, (lo, hi) in zip(t["levels"], r["accuracy"], r["ci"])}
    return pd.DataFrame(rows).T


def calibration_frame(results: dict, stage: str, drop_truncated: bool = True) -> pd.DataFrame:
    """p_s, p_dC, p_dW, observed and predicted accuracy (with intervals) by level for one stage."""
    c = results["calibration"][stage]
    block = (preferred(c) if drop_truncated else c["all"])["by_level"]
    keys = ["n", "p_s", "p_d_given_correct", "p_d_given_wrong", "observed_accuracy", "predicted_accuracy",
            "predicted_ci_low", "predicted_ci_high", "no_answer"]
    return pd.DataFrame({lv: {k: s[k] for k in keys} for lv, s in block.items()}).T


def plot_calibration(results: dict, stages=("rl", "sft_reflection")):
    """The paper's Figure 3: p_s, p_dC, p_dW and predicted vs observed accuracy by level, per stage."""
    import matplotlib.pyplot as plt
    import numpy as np

    stages = [s for s in stages if s in results["calibration"]]
    fig, axes = plt.subplots(1, len(stages), figsize=(5.5 * len(stages), 4), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        df = calibration_frame(results, stage).astype(float)
        x = np.arange(len(df))
        for key, lab, st in (("p_s", "$p_s$", "o-"), ("p_d_given_correct", "$p_{d|C}$", "s-"),
                             ("p_d_given_wrong", "$p_{d|W}$", "^-")):
            ax.plot(x, df[key], st, label=lab)
        ax.plot(x, df["observed_accuracy"], "k*", ms=9, label="observed accuracy")
        ax.plot(x, df["predicted_accuracy"], "k--", label="predicted accuracy")
        ax.fill_between(x, df["predicted_ci_low"], df["predicted_ci_high"], color="0.8", label="predicted (bootstrap 95%)")
        ax.set(xticks=x, xticklabels=df.index, ylim=(-0.02, 1.02), title=STAGE_LABELS[stage])
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def echo_table(results: dict) -> pd.DataFrame:
    """F->T and T->F counts and rates per stage (the 'echo chamber', Kang et al. 2025)."""
    rows = {}
    for stage, c in results["calibration"].items():
        t = c["all"]["overall"]["transitions"]
        rows[STAGE_LABELS[stage]] = {"F->T": t["F->T"], "F->F": t["F->F"], "p(F->T)": t["p(F->T)"],
                                     "T->F": t["T->F"], "T->T": t["T->T"], "p(T->F)": t["p(T->F)"]}
    return pd.DataFrame(rows).T


def kang_table() -> pd.DataFrame:
    """Kang et al. (2025)'s table as printed in the paper."""
    return pd.DataFrame(paper_results()["kang2025"]["rows"]).set_index("ft_ratio_in_data")


def faithfulness_table(results: dict) -> pd.DataFrame:
    """Decision faithfulness per stage (dsh.measure.faithfulness) next to p_dC and p_dW: the share of attempts
    with a check, and over those, right check arithmetic, a verdict that follows from the written
    comparison, a verdict that is true of the answer, and a decision that follows from the verdict."""
    rows = {}
    for stage, c in results["calibration"].items():
        f = (c.get("faithfulness") or {}).get("overall") or {}
        o = c["all"]["overall"]
        rows[STAGE_LABELS[stage]] = {
            "p_dC": o["p_d_given_correct"], "p_dW": o["p_d_given_wrong"], "attempts": f.get("attempts"),
            "with a check": f.get("has_check"), "check arithmetic right": f.get("arithmetic_right"),
            "verdict follows from it": f.get("verdict_follows"), "verdict true": f.get("verdict_true"),
            "decision follows verdict": f.get("decision_follows"),
            "verdict true | wrong answer": f.get("verdict_true_wrong")}
    return pd.DataFrame(rows).T


def design_table(results: dict) -> pd.DataFrame:
    """The design goals of the small-scale analogue (dsh.experiment.pipeline.design_checks) and whether the run met them."""
    from .pipeline import design_checks

    d = results["summary"].get("design") or design_checks(results)
    return pd.DataFrame({"met": {k: ("cannot tell" if x is None else ("yes" if x else "no"))
                                 for k, x in d["goals"].items()}})


def truncation_table(results: dict) -> pd.DataFrame:
    """Budget and truncation per stage: training examples over max_length (SFT), rollouts clipped at
    max_completion_length (GRPO, mean and first step) and evaluation responses cut at max_new_tokens."""
    s = results["summary"]
    rows = {}
    for stage, t in (s.get("truncation") or {}).items():
        tr = t.get("train") or {}
        rows[STAGE_LABELS[stage]] = {
            "training budget": tr.get("limit"),
            "training cut": tr.get("rate", tr.get("clipped_rate")),
            "GRPO clipped at step 1": tr.get("clipped_rate_first"),
            "evaluation budget": s["eval"]["max_new_tokens"], "evaluation cut": t.get("eval")}
    return pd.DataFrame(rows).T


def stage_table(preset) -> pd.DataFrame:
    """The stages of ``preset``'s pipeline (a name or a :class:`dsh.experiment.presets.Preset`): method, starting point,
    training levels and size, learning rate and each stage's own token budget (max_length for SFT,
    max_completion_length for GRPO)."""
    from .pipeline import plan

    p = get(preset)
    cfgs = plan(p, p.runs_dir)
    rows = []
    for s in p.stages:
        row = {"stage": s.name, "method": s.method or "(none)", "starts from": s.init or "the model"}
        c = cfgs.get(s.name)
        if c is not None:
            row.update(levels=", ".join(c.train_levels), n_train=c.n_train, max_steps=c.max_steps,
                       learning_rate=c.learning_rate,
                       token_budget=c.max_completion_length if c.method == "grpo" else c.max_length)
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


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
    prediction's; "cannot tell" when a level has fewer than ``min_n`` responses or no level has defined estimates."""
    rows, small = [], False
    for stage in ("rl", "sft_reflection"):
        for lv, s in _levels(cal, stage).items():
            small |= s["n"] < min_n
            if s["predicted_accuracy"] is None or s["predicted_ci_low"] is None:
                continue
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
    """Claim (ii): RL improves pi_d more than pi_sample. Pooled: delta p_dW > delta p_s from SFT (reflection) to
    RL; per level: the 95 % interval of delta p_dW - delta p_s (bootstrap errors)."""
    rl, sr = cal.get("rl"), cal.get("sft_reflection")
    per_level = []
    if not (rl and sr):
        return {"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": "cannot tell",
                "evidence": "needs both the RL and the SFT (reflection) stages", "per_level": per_level}
    a, b = preferred(rl)["overall"], preferred(sr)["overall"]
    need = [a["p_s"], b["p_s"], a["p_d_given_wrong"], b["p_d_given_wrong"]]
    if any(x is None for x in need) or min(a["n"], b["n"]) < min_n * 3:
        verdict, ev = "cannot tell", f"n = {a['n']} and {b['n']}; estimates {need}"
    else:
        ds, dw = a["p_s"] - b["p_s"], a["p_d_given_wrong"] - b["p_d_given_wrong"]
        verdict = "holds" if dw > ds else "fails"
        ev = f"RL minus SFT (reflection): delta p_s = {ds:+.3f}, delta p_dW = {dw:+.3f}"
    la, lb = _levels(cal, "rl"), _levels(cal, "sft_reflection")
    for lv in sorted(set(la) & set(lb), key=level_index):
        x, y = la[lv], lb[lv]
        if min(x["n"], y["n"]) < min_n or None in (x["p_s"], y["p_s"], x["p_d_given_wrong"], y["p_d_given_wrong"]):
            per_level.append({"level": lv, "verdict": "cannot tell", "difference": None, "interval": [None, None]})
            continue
        diff = (x["p_d_given_wrong"] - y["p_d_given_wrong"]) - (x["p_s"] - y["p_s"])
        level_verdict, ci = _interval_verdict(diff, _contrast_se(x, y))
        per_level.append({"level": lv, "verdict": level_verdict, "difference": diff, "interval": ci})
    return {"claim": "(ii) RL improves pi_d more than pi_sample", "verdict": verdict, "evidence": ev,
            "per_level": per_level}


def claim_ood_limited_by_sampling(cal: dict, min_n: int = 30) -> dict:
    """Claim (iii): out-of-distribution accuracy is limited by pi_sample. Pooled: from the easiest to the hardest
    usable level of the RL stage p_s drops, and more than p_dW; per level: the 95 % interval of (drop of p_s) -
    (drop of p_dW) from the easiest level. Needs >= 3 levels with ``min_n`` responses and defined estimates."""
    pts = sorted((level_index(lv), lv, s) for lv, s in _levels(cal, "rl").items())
    usable = [(lv, s) for _, lv, s in pts if s["p_s"] is not None and s["p_d_given_wrong"] is not None and s["n"] >= min_n]
    per_level = []
    if len(usable) < 3:
        verdict, ev = "cannot tell", f"{len(usable)} levels with enough responses and defined p_s, p_dW"
    else:
        ps = [s["p_s"] for _, s in usable]
        pw = [s["p_d_given_wrong"] for _, s in usable]
        drop_s, drop_w = ps[0] - ps[-1], pw[0] - pw[-1]
        verdict = "holds" if drop_s > 0 and drop_s > drop_w else "fails"
        ev = f"from the easiest to the hardest level: p_s {ps[0]:.2f} -> {ps[-1]:.2f}, p_dW {pw[0]:.2f} -> {pw[-1]:.2f}"
        base_lv, base = usable[0]
        for lv, s in usable[1:]:
            # drop of p_s minus drop of p_dW from the easiest level: > 0 when pi_sample degrades more
            diff = (base["p_s"] - s["p_s"]) - (base["p_d_given_wrong"] - s["p_d_given_wrong"])
            level_verdict, ci = _interval_verdict(diff, _contrast_se(base, s))
            per_level.append({"level": lv, "verdict": level_verdict, "difference": diff, "interval": ci,
                              "relative_to": base_lv})
    return {"claim": "(iii) OOD accuracy is limited by pi_sample", "verdict": verdict, "evidence": ev,
            "per_level": per_level}


def claims(results: dict, min_n: int = 30) -> list[dict]:
    """A plain verdict on each empirical claim of the paper from a results folder (:func:`load_results`):
    :func:`claim_predicts` (i), :func:`claim_predicts_unfitted` (i'), :func:`claim_rl_improves_decision` (ii),
    :func:`claim_ood_limited_by_sampling` (iii); (ii) and (iii) also get a verdict per level (``per_level``).
    "cannot tell" when a level has fewer than ``min_n`` responses or a needed estimate is undefined; the evidence
    string carries the numbers."""
    cal = results["calibration"]
    return [claim_predicts(cal, min_n), claim_predicts_unfitted(cal), claim_rl_improves_decision(cal, min_n),
            claim_ood_limited_by_sampling(cal, min_n)]


def claims_table(verdicts: list[dict]) -> pd.DataFrame:
    """The pooled verdicts of :func:`claims` (claim, verdict, evidence), one row per claim."""
    return pd.DataFrame([{k: c[k] for k in ("claim", "verdict", "evidence")} for c in verdicts])


def per_level_table(verdicts: list[dict]) -> pd.DataFrame:
    """The per-level verdicts of claims (ii) and (iii) as a table (difference with its 95 % interval)."""
    rows = []
    for c in verdicts:
        for r in c.get("per_level", []):
            lo, hi = r["interval"]
            rows.append({"claim": c["claim"].split(" ")[0], "level": r["level"],
                         "difference": None if r["difference"] is None else round(r["difference"], 3),
                         "95% interval": "-" if lo is None else f"({lo:+.3f}, {hi:+.3f})", "verdict": r["verdict"]})
    return pd.DataFrame(rows, columns=["claim", "level", "difference", "95% interval", "verdict"])
