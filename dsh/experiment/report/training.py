"""Tables and figures of the training runs: the change of p_s, p_dC and p_dW per seed from a stage's starting model,
the KL ablation, the GRPO reward curves and whether the reward rose, validation curves and step timings."""

from __future__ import annotations

import re

import pandas as pd

from ...core import validate as v
from ...measure.trend import verdict as trend_verdict
from ..run.pipeline import plan_of
from ..run.presets import get
from .frame import calibration_by_kind, results_first, reward_trend, seeds_of, signed_interval, validation_rise

DELTA_KEYS = (("p_s", "Δp_s"), ("p_d_given_correct", "Δp_dC"), ("p_d_given_wrong", "Δp_dW"),
              ("observed_accuracy", "Δaccuracy"))


@results_first
def seed_estimates(results: dict, kind: str) -> dict:
    """``{seed: estimates}``: the estimates over every response (p_s, p_d_given_correct, p_d_given_wrong,
    observed_accuracy, ...: the calibration's ``all`` / ``overall`` block) of stage kind ``kind`` for each training
    seed that has it, in seed order."""
    out = {}
    for s in seeds_of(results):
        cal = calibration_by_kind(results, s)
        if kind in cal:
            out[s] = cal[kind]["all"]["overall"]
    return out


@results_first
def seed_deltas(results: dict, kind: str, init: str) -> dict:
    """``{"Δp_s": [...], "Δp_dC": [...], "Δp_dW": [...], "Δaccuracy": [...]}``: the change of each estimate (over
    every response) from stage kind ``init`` to ``kind`` of the same training seed, one value a seed that has both
    (a quantity undefined for one of the two is left out for that seed; :func:`seed_estimates`)."""
    out = {}
    before = seed_estimates(results, init)
    for s, a in seed_estimates(results, kind).items():
        if s not in before:
            continue
        b = before[s]
        for key, name in DELTA_KEYS:
            if a[key] is not None and b[key] is not None:
                out.setdefault(name, []).append(a[key] - b[key])
    return out


@results_first
def delta_table(results: dict, pairs) -> pd.DataFrame:
    """For (label, kind, init kind) pairs: the change of p_s, p_dC, p_dW and accuracy (over every response) from
    the init stage of the same seed, mean and range over seeds (:func:`seed_deltas`)."""
    rows = []
    for label, kind, init in pairs:
        deltas = seed_deltas(results, kind, init)
        row = {"comparison": label, "seeds": len(next(iter(deltas.values()), []))}
        for name, xs in deltas.items():
            row[name] = f"{sum(xs) / len(xs):+.3f} [{min(xs):+.3f}, {max(xs):+.3f}]"
        rows.append(row)
    return pd.DataFrame(rows)


def _curves(results: dict, kind: str) -> list:
    curves = results["summary"].get("reward_curves") or {}
    return [curves[x["name"]] for x in plan_of(results) if x["kind"] == kind and curves.get(x["name"])]


@results_first
def kl_arms(results: dict) -> list:
    """The KL ablation's arms as (beta, kind): the ``rl_beta<b>`` kinds and, where they exist, the RL arm itself at
    the coefficient it trained with (the summary's ``configs``; for results written before it recorded them, its
    preset's), sorted by beta."""
    kinds = {x["kind"] for x in plan_of(results)}
    arms = {float(k[len("rl_beta"):]): k for k in kinds if k.startswith("rl_beta")}
    configs = results["summary"].get("configs") or {}
    recorded = {configs[x["name"]].get("beta") for x in plan_of(results) if x["kind"] == "rl" and x["name"] in configs}
    if len(recorded) > 1:
        raise ValueError(f"results: the RL stages trained with different betas ({sorted(recorded)}); one arm each")
    beta = recorded.pop() if recorded else get(results["summary"]["preset"]).training.get("grpo", {}).get("beta")
    if arms and "rl" in kinds and beta is not None and float(beta) not in arms:
        arms[float(beta)] = "rl"
    return sorted(arms.items())


@results_first
def kl_table(results: dict) -> pd.DataFrame:
    """The KL ablation: for each GRPO coefficient beta (kinds ``rl_beta<b>``, and ``rl`` at the preset's beta), the
    change from SFT (reflection) of p_s (pi_sample) and of p_dC, p_dW (pi_d), and the last logged KL (mean over
    seeds)."""
    arms = kl_arms(results)
    df = delta_table(results, [(f"beta = {b:g}", k, "sft_reflection") for b, k in arms])
    if not df.empty:
        kl = []
        for _, k in arms:
            xs = [c[-1].get("kl") for c in _curves(results, k)]
            xs = [x for x in xs if x is not None]
            kl.append(f"{sum(xs) / len(xs):.4f}" if xs else "-")
        df["last KL"] = kl
    return df


@results_first
def reward_trend_table(results: dict) -> pd.DataFrame:
    """Did GRPO learn? Per GRPO stage: its rollouts, the mean reward of the first and the last fifth of its rollout
    rounds, the difference with its 95 % interval (:func:`dsh.measure.trend.fifths_contrast`, rounds as units) and
    the verdict, and the share of zero-variance groups (no learning signal) in the first and last fifth."""
    curves = results["summary"].get("reward_curves") or {}
    train = results["summary"].get("training") or {}
    rows = []
    for x in plan_of(results):
        c = curves.get(x["name"])
        if not c:
            continue
        t, z = reward_trend(c)
        row = {"stage": x["name"], "rollouts": (train.get(x["name"]) or {}).get("rollouts"), "rounds": len(c)}
        if t is not None:
            row.update({"reward first fifth": round(t["first"], 3), "reward last fifth": round(t["last"], 3),
                        "difference (95 % interval)": signed_interval(t["delta"], t["ci"]),
                        "verdict": trend_verdict(t), "zero-variance groups first / last":
                        f"{z['first']:.2f} / {z['last']:.2f}"})
        rows.append(row)
    return pd.DataFrame(rows)


@results_first
def validation_rise_table(results: dict) -> pd.DataFrame:
    """Did GRPO raise the accuracy where it is evaluated? Per GRPO stage with a validation curve
    (:mod:`dsh.training.validation`: the same validation questions at every measurement, sampled as the evaluation
    samples): the accuracy (share of right final answers, the reward's mean) at step 0 and at the last measurement,
    the rise with Newcombe's hybrid score 95 % interval (:func:`dsh.experiment.report.frame.validation_rise`) and its
    verdict."""
    along = results["summary"].get("validation_curves") or {}
    rows = []
    for x in plan_of(results):
        t = validation_rise(x["name"], along.get(x["name"]))
        if t is None:
            continue
        rows.append({"stage": x["name"], "questions": t["n"], "last step": t["last step"],
                     "accuracy at step 0": round(t["first"], 3), "accuracy at the end": round(t["last"], 3),
                     "rise (95 % interval)": signed_interval(t["delta"], t["ci"]),
                     "verdict": trend_verdict(t)})
    return pd.DataFrame(rows)


@results_first
def plot_validation_curves(results: dict, kinds=("rl",)):
    """p_s, p_dC and p_dW along GRPO (:mod:`dsh.training.validation`: fixed validation questions at the rollouts'
    temperature) for the stages of ``kinds`` in a results folder (:func:`plot_validation_rows`)."""
    along = results["summary"].get("validation_curves") or {}
    return plot_validation_rows({x["name"]: along[x["name"]] for x in plan_of(results)
                                 if x["kind"] in kinds and along.get(x["name"])})


def plot_validation_rows(rows_by_name: dict):
    """Validation measurements along runs (``{name: rows of validation.jsonl}``): accuracy, p_s, p_dC and p_dW
    against the optimizer step, one line per run with its 95 % band (bootstrap; accuracy: normal), one panel each."""
    import matplotlib.pyplot as plt

    keys = (("observed_accuracy", "accuracy"), ("p_s", "p_s (pi_sample)"),
            ("p_d_given_correct", "p_dC (STOP after a right answer)"),
            ("p_d_given_wrong", "p_dW (RESAMPLE after a wrong one)"))
    fig, axes = plt.subplots(1, len(keys), figsize=(14, 3.3), sharey=True)
    nan = lambda y: float("nan") if y is None else y  # noqa: E731
    for name, rows in rows_by_name.items():
        steps = [r["step"] for r in rows]
        for ax, (k, label) in zip(axes, keys):
            line, = ax.plot(steps, [nan(r[k]) for r in rows], marker=".", label=name)
            ci = [[r["ci_low"], r["ci_high"]] if k == "observed_accuracy" else (r.get(f"{k}_ci") or [None, None])
                  for r in rows]
            ax.fill_between(steps, [nan(c[0]) for c in ci], [nan(c[1]) for c in ci], color=line.get_color(),
                            alpha=0.15)
            ax.set(xlabel="GRPO step", title=label, ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


@results_first
def plot_reward_curves(results: dict, kinds=("rl", "rl_verdict")):
    """GRPO's mean reward and its share of zero-variance groups per rollout round, one line per stage."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    curves = results["summary"].get("reward_curves") or {}
    for x in plan_of(results):
        c = curves.get(x["name"])
        if x["kind"] not in kinds or not c:
            continue
        steps = [r["step"] for r in c]
        axes[0].plot(steps, [r["reward"] for r in c], label=x["name"], alpha=0.8)
        axes[1].plot(steps, [r["frac_reward_zero_std"] for r in c], alpha=0.8)
    axes[0].set(xlabel="GRPO step", ylabel="mean reward of the rollouts")
    axes[1].set(xlabel="GRPO step", ylabel="groups with zero reward variance")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


@results_first
def timings_table(results: dict) -> pd.DataFrame:
    """Seconds per training and evaluation step, as recorded by the run (keys ``train_<stage>``,
    ``evaluate_<stage>``; runs before the pipeline's steps were shared wrote ``train <stage>``)."""
    rows = {}
    for k, s in results["summary"]["timings_s"].items():
        what, stage = re.split("[ _]", k, maxsplit=1)
        rows.setdefault(stage, {})[what] = s
    return pd.DataFrame(rows).T


def check_schedule(schedule) -> None:
    """Refuses, in one line, anything but a pipeline run's schedule (its steps with step, start_s, end_s, worker)."""
    if not schedule or not all(isinstance(r, dict) and {"step", "start_s", "end_s", "worker"} <= set(r) for r in schedule):
        raise ValueError("schedule must be a list of steps with step, start_s, end_s and worker (a summary's schedule)")


def plot_schedule(schedule: list, title: str = ""):
    """A pipeline run's steps on its workers (a summary's ``schedule``: step, start_s, end_s, worker), one row a
    worker, one bar a step, coloured by kind (train, job, study)."""
    import matplotlib.pyplot as plt

    check_schedule(schedule)
    workers = list(dict.fromkeys(r["worker"] for r in sorted(schedule, key=lambda r: r["start_s"])))   # by first start
    colours = {"train": "tab:blue", "job": "tab:orange", "study": "tab:green"}
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.5 * len(workers)))
    for r in schedule:
        kind = r["step"].split(" ", 1)[0]
        y = workers.index(r["worker"])
        ax.barh(y, (r["end_s"] - r["start_s"]) / 60, left=r["start_s"] / 60, color=colours.get(kind, "tab:gray"),
                edgecolor="white")
        if r["end_s"] - r["start_s"] > 0.04 * max(x["end_s"] for x in schedule):
            ax.text((r["start_s"] + r["end_s"]) / 120, y, r["step"].split(" ", 1)[-1], ha="center", va="center",
                    fontsize=6, color="white")
    ax.set(yticks=range(len(workers)), yticklabels=[f"worker {i + 1}" for i in range(len(workers))],
           xlabel="minutes since the run started", title=title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()], labels=list(colours),
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def schedule_summary(schedule: list, workers: int) -> dict:
    """A pipeline run's schedule (a summary's ``schedule``, on ``workers`` workers) in numbers: ``{"wall_s": the
    last step's end, "busy_s": the steps' time summed, "filled": busy_s / (workers x wall_s), "by_kind": {kind:
    share of busy_s} for train, job and study}``."""
    check_schedule(schedule)
    v.positive_int("workers", workers)
    wall = max(r["end_s"] for r in schedule)
    busy = sum(r["end_s"] - r["start_s"] for r in schedule)
    kinds = {}
    for r in schedule:
        kind = r["step"].split(" ", 1)[0]
        kinds[kind] = kinds.get(kind, 0.0) + r["end_s"] - r["start_s"]
    return {"wall_s": wall, "busy_s": busy, "filled": busy / (workers * wall),
            "by_kind": {k: x / busy for k, x in kinds.items()}}
