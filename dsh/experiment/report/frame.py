"""The long table every report reads: a results folder (:func:`dsh.experiment.run.pipeline.load_results`) checked,
its plan's stage kinds and seeds, its calibrations as one row per (stage, kind, seed, level), and the small helpers
the tables share (labels, intervals, a GRPO curve's fifths, a level's wrong first attempts).

A stage of a seeded plan (``rl-s1``) is one seed of its kind (``rl``), so that every table shows the mean over seeds
with each seed beside it, and a one-seed run shows its single stage."""

from __future__ import annotations

import pandas as pd

from ...measure.stage import preferred
from ...measure.trend import fifths_contrast, proportion_rise
from ...task.problems import level_index
from ..run.pipeline import plan_of
from ..run.presets import stage_label

TABLE1_KINDS = ("base", "sft", "sft_reflection", "rl", "dft")


def check_results(results) -> dict:
    """``results`` checked to be a results folder as :func:`dsh.experiment.run.pipeline.load_results` returns it."""
    if not isinstance(results, dict) or not {"summary", "calibration"} <= set(results):
        raise ValueError("results must be a results folder loaded by dsh.experiment.run.pipeline.load_results (a dict "
                         "with 'summary' and 'calibration')")
    return results


def results_first(fn):
    """``fn(results, ...)``, refusing in one line a ``results`` that is not a results folder (:func:`check_results`)."""
    import functools

    @functools.wraps(fn)
    def checked(results, *args, **kwargs):
        return fn(check_results(results), *args, **kwargs)

    return checked


@results_first
def seeds_of(results: dict) -> list:
    """The training seeds of a results folder (``[None]`` for an unseeded one)."""
    seeds = sorted({x["seed"] for x in plan_of(results) if x["seed"] is not None})
    return seeds or [None]


@results_first
def calibration_by_kind(results: dict, seed=None) -> dict:
    """``{kind: calibration}`` of one seed's stages and the unseeded ones (the base), the shape the claims read."""
    seeds = seeds_of(results)
    if seed is None and seeds != [None]:
        raise ValueError(f"seed must be one of {seeds} for results with several training seeds")
    if seed is not None and seed not in seeds:
        raise ValueError(f"seed must be one of {seeds}; got {seed!r}")
    return {x["kind"]: results["calibration"][x["name"]] for x in plan_of(results) if x["seed"] in (None, seed)}


@results_first
def long_table(results: dict, drop_truncated: bool = False) -> pd.DataFrame:
    """One row per stage and level: kind, seed, responses (and as independent ones: :func:`effective`), accuracy
    with its 95 % interval, p_s, p_dC, p_dW (with bootstrap
    intervals), predicted accuracy, transitions and unanswered responses, over every response (or without the
    truncated ones: ``drop_truncated``, the preferred block of :func:`dsh.measure.stage.preferred`)."""
    rows = []
    for x in plan_of(results):
        c = results["calibration"][x["name"]]
        block = preferred(c) if drop_truncated else c["all"]
        for lv, s in block["by_level"].items():
            t = s["transitions"]
            rows.append({"stage": x["name"], "kind": x["kind"], "seed": x["seed"], "level": lv, "n": s["n"],
                         "n_effective": effective(s, "accuracy", s["n"]),
                         "accuracy": s["observed_accuracy"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                         "p_s": s["p_s"], "p_s_ci": s.get("p_s_ci"), "p_dC": s["p_d_given_correct"],
                         "p_dC_ci": s.get("p_d_given_correct_ci"), "p_dW": s["p_d_given_wrong"],
                         "p_dW_ci": s.get("p_d_given_wrong_ci"), "predicted": s["predicted_accuracy"],
                         "predicted_low": s["predicted_ci_low"], "predicted_high": s["predicted_ci_high"],
                         "F->T": t["F->T"], "T->F": t["T->F"], "p(F->T)": t["p(F->T)"], "p(T->F)": t["p(T->F)"],
                         "no_answer": s["no_answer"]})
    return pd.DataFrame(rows)


def kinds_in(results: dict, kinds=None) -> list:
    present = list(dict.fromkeys(x["kind"] for x in plan_of(results)))
    return present if kinds is None else [k for k in kinds if k in present]


def levels_sorted(df) -> list:
    return sorted(set(df.level), key=level_index)


def recorded_label(results: dict, name: str) -> str:
    """A stage's label as its run recorded it (its kind's label, and its seed), else its name's label."""
    return results["summary"].get("labels", {}).get(name) or stage_label(name)


def row_label(df, kind) -> str:
    n = df[df.kind == kind].seed.dropna().nunique()
    return stage_label(kind) + (f" ({n} seed{'s' if n > 1 else ''})" if n else "")


def fmt_interval(acc, lo, hi):
    return f"{100 * acc:.1f} ({100 * lo:.1f}, {100 * hi:.1f})"


def signed_interval(x, ci) -> str:
    """A signed estimate and its interval to three decimals: ``+0.125 (+0.046, +0.202)``."""
    return f"{x:+.3f} ({ci[0]:+.3f}, {ci[1]:+.3f})"


def reward_trend(curve: list[dict]) -> tuple:
    """A GRPO reward curve's last-fifth-minus-first-fifth contrasts (:func:`dsh.measure.trend.fifths_contrast`) of
    its mean reward and of its share of zero-variance groups."""
    return (fifths_contrast([r["reward"] for r in curve]), fifths_contrast([r["frac_reward_zero_std"] for r in curve]))


def validation_rise(stage: str, curve: list[dict] | None) -> dict | None:
    """The rise of a GRPO run's validation accuracy (:mod:`dsh.training.validation`: the share of right final
    answers on fixed validation questions, sampled as the evaluation samples) from step 0 to its last measurement,
    with Newcombe's hybrid score 95 % interval (:func:`dsh.measure.trend.proportion_rise`; the two measurements
    taken as independent samples, which widens the interval); None without a curve. A curve that does not run from
    step 0 to a later step, or an accuracy that is no count of its responses, is refused in one line."""
    if not curve:
        return None
    first, last = curve[0], curve[-1]
    if first["step"] != 0 or last["step"] <= 0:
        raise ValueError(f"{stage}'s validation curve must run from step 0 to a later step; its steps are "
                         f"{[r['step'] for r in curve]}")
    k0, k1 = (_right(stage, r) for r in (first, last))
    return {**proportion_rise(k0, first["n"], k1, last["n"]), "n": first["n"], "last step": last["step"]}


def _right(stage: str, record: dict) -> int:
    """The number of right final answers of one validation measurement (its accuracy times its responses)."""
    k = record["observed_accuracy"] * record["n"]
    if abs(k - round(k)) > 1e-6:
        raise ValueError(f"{stage}'s validation at step {record['step']}: accuracy {record['observed_accuracy']} is "
                         f"not a count of its {record['n']} responses")
    return int(round(k))


def effective(level: dict, what: str, n: float) -> float:
    """``n`` trials of a calibrated level's ``what`` (accuracy, p_s, p(F->T)) as independent ones: n over the
    level's design effect (:func:`dsh.measure.calibration.design_effect`; a level with one response a question
    records none: n)."""
    d = (level.get("design_effects") or {}).get(what)
    return n / d if d else n


def first_wrong(level: dict) -> int:
    """The responses of a calibrated level whose first answer is wrong (answered responses times 1 - p_s)."""
    return round((level["n"] - level["no_answer"]) * (1 - level["p_s"])) if level.get("p_s") is not None else 0
