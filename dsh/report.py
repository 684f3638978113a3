"""Tables and figures of the empirical chapters, from a results folder (dsh.pipeline) and the paper's
printed numbers (dsh/paper_results.yaml, always labelled as the paper's)."""

from __future__ import annotations

import pandas as pd

from .paper import paper_results
from .pipeline import STAGE_LABELS


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
    block = (c["drop_truncated"] if drop_truncated and c["drop_truncated"] else c["all"])["by_level"]
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
    """Decision faithfulness per stage (dsh.faithfulness) next to p_dC and p_dW: the share of attempts
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
    """The design goals of the small-scale analogue (dsh.pipeline.design_checks) and whether the run met them."""
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


def stage_table(preset: str) -> pd.DataFrame:
    """The stages of ``preset``'s pipeline: method, starting point, training levels and size, learning rate
    and each stage's own token budget (max_length for SFT, max_completion_length for GRPO)."""
    from .pipeline import PIPELINES, plan

    cfgs = plan(preset, "runs/" + preset)
    rows = []
    for s in PIPELINES[preset][0]:
        row = {"stage": s.name, "method": s.method or "(none)", "starts from": s.init or "the model"}
        c = cfgs.get(s.name)
        if c is not None:
            row.update(levels=", ".join(c.train_levels), n_train=c.n_train, max_steps=c.max_steps,
                       learning_rate=c.learning_rate,
                       token_budget=c.max_completion_length if c.method == "grpo" else c.max_length)
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")
