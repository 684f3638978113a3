"""A results folder for a simulated experiment whose p_s, p_dC, p_dW are known: what the report's tables and figures
look like when the truth is known (chapter 06)."""

from __future__ import annotations

from ...core import validate as v
from ...measure.stage import calibrate_stage
from ...task.synthetic import synthetic_records
from ...theory.two_stage import predicted_accuracy
from ..run.presets import STAGE_LABELS


def synthetic_results(truths: dict, n: int = 200, seed: int = 0, n_bootstrap: int = 100) -> dict:
    """A results folder's contents (as :func:`dsh.experiment.run.pipeline.load_results` returns them) for a simulated
    experiment: ``truths[stage][level] = (p_s, p_dC, p_dW)``, ``n`` responses per level. The tables and figures
    of :mod:`dsh.experiment.report` drawn from it show what they look like when the truth is known."""
    if not isinstance(truths, dict) or not truths:
        raise ValueError("truths must map stages to {level: (p_s, p_dC, p_dW)}")
    calib = {}
    for k, (stage, by_level) in enumerate(truths.items()):
        v.choice("stage", stage, STAGE_LABELS)
        recs = []
        for j, (level, t) in enumerate(by_level.items()):
            recs += synthetic_records(*t, n=n, level=level, seed=seed + 1000 * k + j)
        calib[stage] = calibrate_stage(recs, seed=seed, n_bootstrap=n_bootstrap)
    summary = {"preset": "synthetic", "stages": list(truths), "labels": {s: STAGE_LABELS[s] for s in truths}}
    return {"summary": summary, "calibration": calib}


def plot_recovery(result: dict, truths: dict):
    """Estimates with their bootstrap 95 % intervals against the truth per level (left), and predicted against
    observed and true accuracy (right), for a :func:`dsh.measure.calibration.calibrate` result of responses
    simulated from ``truths`` (``{level: (p_s, p_dC, p_dW)}``)."""
    import matplotlib.pyplot as plt
    import numpy as np

    levels = list(truths)
    x = np.arange(len(levels))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for j, (key, name) in enumerate([("p_s", "$p_s$"), ("p_d_given_correct", "$p_{d|C}$"),
                                     ("p_d_given_wrong", "$p_{d|W}$")]):
        est = np.array([result["by_level"][lv][key] for lv in levels], dtype=float)
        ci = np.array([result["by_level"][lv][key + "_ci"] for lv in levels], dtype=float)
        axes[0].errorbar(x + 0.08 * j, est, yerr=[est - ci[:, 0], ci[:, 1] - est], fmt="o", capsize=3,
                         label=f"{name} estimated", color=f"C{j}")
        axes[0].plot(x + 0.08 * j, [truths[lv][j] for lv in levels], "x", color=f"C{j}", ms=9)
    axes[0].set(xticks=x, xticklabels=levels, ylim=(0, 1.05), title="estimates (o, bootstrap 95%) vs truth (x)")
    axes[0].legend(fontsize=8)
    by = [result["by_level"][lv] for lv in levels]
    axes[1].plot(levels, [predicted_accuracy(*truths[lv]) for lv in levels], "k:", label="true accuracy")
    axes[1].plot(levels, [s["observed_accuracy"] for s in by], "o-", label="observed")
    axes[1].fill_between(levels, [s["predicted_ci_low"] for s in by], [s["predicted_ci_high"] for s in by], alpha=0.3,
                         label="predicted (bootstrap 95%)")
    axes[1].plot(levels, [s["predicted_accuracy"] for s in by], "s--", label="predicted")
    axes[1].set(ylim=(0, 1.05), title="predicted vs observed accuracy")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig
