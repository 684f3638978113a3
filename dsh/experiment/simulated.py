"""A results folder for a simulated experiment whose p_s, p_dC, p_dW are known: what the report's tables and figures
look like when the truth is known (chapter 05)."""

from __future__ import annotations

from ..core import validate as v
from ..measure.stage import calibrate_stage
from ..task.synthetic import synthetic_records
from .presets import STAGE_LABELS


def synthetic_results(truths: dict, n: int = 200, seed: int = 0, n_bootstrap: int = 100) -> dict:
    """A results folder's contents (as :func:`dsh.experiment.pipeline.load_results` returns them) for a simulated
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
