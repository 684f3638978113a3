"""Tables, figures and verdicts on the paper's claims, from a results folder of any preset
(:func:`dsh.experiment.pipeline.load_results`) and the paper's printed numbers (dsh/core/paper_results.yaml,
always labelled as the paper's).

Everything reads one long table of (stage, kind, seed, level, estimates) (:func:`long_table`): a stage of a seeded
plan (``rl-s1``) is one seed of its kind (``rl``), so that Table 1, the calibration figure, faithfulness and the
ablation tables show the mean over seeds with each seed beside it, and a one-seed run shows its single stage."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pandas as pd

from ..core import validate as v
from ..core.agreement import cohen_kappa
from ..core.files import read_jsonl
from ..core.paper import paper_results
from ..measure import tasks
from ..measure.calibration import normal_interval, wilson_interval
from ..measure.claims import block, graded, verdicts
from ..measure.length_law import TOLERANCE, cluster_median, mutual_inclusion
from ..measure.stage import preferred
from ..measure.trend import fifths_contrast, level_slope
from ..measure.trend import verdict as trend_verdict
from ..task.problems import level_index, parse_level
from .attribution_study import PREDICTED_SLOPE, carries, excess_fit, reward_identity, robust_fit, study_record
from .pipeline import design_checks, plan, plan_of
from .presets import get, stage_label

TABLE1_KINDS = ("base", "sft", "sft_reflection", "rl", "dft")


# ------------------------------------------------------------------------------------------------
# The plan behind a results folder, and its long table
# ------------------------------------------------------------------------------------------------
def check_results(results) -> dict:
    """``results`` checked to be a results folder as :func:`dsh.experiment.pipeline.load_results` returns it."""
    if not isinstance(results, dict) or not {"summary", "calibration"} <= set(results):
        raise ValueError("results must be a results folder loaded by dsh.experiment.pipeline.load_results (a dict "
                         "with 'summary' and 'calibration')")
    return results


def _results_first(fn):
    """``fn(results, ...)``, refusing in one line a ``results`` that is not a results folder (:func:`check_results`)."""
    import functools

    @functools.wraps(fn)
    def checked(results, *args, **kwargs):
        return fn(check_results(results), *args, **kwargs)

    return checked


@_results_first
def seeds_of(results: dict) -> list:
    """The training seeds of a results folder (``[None]`` for an unseeded one)."""
    seeds = sorted({x["seed"] for x in plan_of(results) if x["seed"] is not None})
    return seeds or [None]


@_results_first
def calibration_by_kind(results: dict, seed=None) -> dict:
    """``{kind: calibration}`` of one seed's stages and the unseeded ones (the base), the shape the claims read."""
    seeds = seeds_of(results)
    if seed is None and seeds != [None]:
        raise ValueError(f"seed must be one of {seeds} for results with several training seeds")
    if seed is not None and seed not in seeds:
        raise ValueError(f"seed must be one of {seeds}; got {seed!r}")
    return {x["kind"]: results["calibration"][x["name"]] for x in plan_of(results) if x["seed"] in (None, seed)}


@_results_first
def long_table(results: dict, drop_truncated: bool = False) -> pd.DataFrame:
    """One row per stage and level: kind, seed, accuracy with its 95 % interval, p_s, p_dC, p_dW (with bootstrap
    intervals), predicted accuracy, transitions and unanswered responses, over every response (or without the
    truncated ones: ``drop_truncated``, the preferred block of :func:`dsh.measure.stage.preferred`)."""
    rows = []
    for x in plan_of(results):
        c = results["calibration"][x["name"]]
        block = preferred(c) if drop_truncated else c["all"]
        for lv, s in block["by_level"].items():
            t = s["transitions"]
            rows.append({"stage": x["name"], "kind": x["kind"], "seed": x["seed"], "level": lv, "n": s["n"],
                         "accuracy": s["observed_accuracy"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                         "p_s": s["p_s"], "p_s_ci": s.get("p_s_ci"), "p_dC": s["p_d_given_correct"],
                         "p_dC_ci": s.get("p_d_given_correct_ci"), "p_dW": s["p_d_given_wrong"],
                         "p_dW_ci": s.get("p_d_given_wrong_ci"), "predicted": s["predicted_accuracy"],
                         "predicted_low": s["predicted_ci_low"], "predicted_high": s["predicted_ci_high"],
                         "F->T": t["F->T"], "T->F": t["T->F"], "p(F->T)": t["p(F->T)"], "p(T->F)": t["p(T->F)"],
                         "no_answer": s["no_answer"]})
    return pd.DataFrame(rows)


def _kinds(results: dict, kinds=None) -> list:
    present = list(dict.fromkeys(x["kind"] for x in plan_of(results)))
    return present if kinds is None else [k for k in kinds if k in present]


def _levels_sorted(df) -> list:
    return sorted(set(df.level), key=level_index)


def _stage_label(results: dict, name: str) -> str:
    """A stage's label as its run recorded it (its kind's label, and its seed), else its name's label."""
    return results["summary"].get("labels", {}).get(name) or stage_label(name)


def _row_label(df, kind) -> str:
    n = df[df.kind == kind].seed.dropna().nunique()
    return stage_label(kind) + (f" ({n} seed{'s' if n > 1 else ''})" if n else "")


# ------------------------------------------------------------------------------------------------
# Tables and figures
# ------------------------------------------------------------------------------------------------
def _fmt(acc, lo, hi):
    return f"{100 * acc:.1f} ({100 * lo:.1f}, {100 * hi:.1f})"


def table1(results: dict, kinds=None) -> pd.DataFrame:
    """Accuracy (%) by stage kind and level as ``acc (low, high) n=N``, the paper's 95 % normal-approximation
    interval; a kind run over several seeds pools them (acc: correct answers over all N responses of its seeds, the
    interval over those N) and adds the range over seeds, ``[min-max]``: the interval says how well the questions
    pin the seeds' pooled accuracy down, the range how much training seeds differ."""
    df = long_table(results)
    out = {}
    for kind in _kinds(results, kinds):
        d, row = df[df.kind == kind], {}
        for lv in _levels_sorted(d):
            x = d[d.level == lv]
            if len(x) == 1:
                r = x.iloc[0]
                row[lv] = _fmt(r.accuracy, r.ci_low, r.ci_high) + f" n={r.n}"
            else:
                n, k = int(x.n.sum()), int((x.accuracy * x.n).round().sum())
                row[lv] = (_fmt(k / n, *normal_interval(k, n))
                           + f" [{100 * x.accuracy.min():.0f}-{100 * x.accuracy.max():.0f}] n={n}")
        out[_row_label(df, kind)] = row
    return pd.DataFrame(out).T


@_results_first
def mean_by_stage(results: dict, kinds, key: str) -> pd.DataFrame:
    """The mean over seeds of one column of :func:`long_table` by stage kind (rows) and level (columns)."""
    df = long_table(results)
    df = df[df.kind.isin(kinds)]
    return (df.groupby(["kind", "level"])[key].mean().unstack("level")
            .reindex(index=[k for k in kinds if k in set(df.kind)], columns=_levels_sorted(df)))


def paper_table1() -> pd.DataFrame:
    """The paper's Table 1 (Qwen2.5-7B-Instruct), as printed."""
    t = paper_results()["table1"]
    rows = {}
    for name, r in t["models"].items():
        rows[name] = {lv: f"{a:.1f} ({lo:.1f}, {hi:.1f})" for lv, a, (lo, hi) in zip(t["levels"], r["accuracy"], r["ci"])}
    return pd.DataFrame(rows).T


@_results_first
def calibration_frame(results: dict, stage: str, drop_truncated: bool = True) -> pd.DataFrame:
    """p_s, p_dC, p_dW, observed and predicted accuracy (with intervals) by level for one stage."""
    c = results["calibration"][stage]
    block = (preferred(c) if drop_truncated else c["all"])["by_level"]
    keys = ["n", "p_s", "p_d_given_correct", "p_d_given_wrong", "observed_accuracy", "predicted_accuracy",
            "predicted_ci_low", "predicted_ci_high", "no_answer"]
    return pd.DataFrame({lv: {k: s[k] for k in keys} for lv, s in block.items()}).T


@_results_first
def plot_calibration(results: dict, kinds=("rl", "sft_reflection")):
    """The paper's Figure 3 per stage kind, without the truncated responses: p_s, p_dC, p_dW and observed vs
    predicted accuracy by level; lines are means over seeds with each seed a faint dot, a single stage's predicted
    accuracy with its bootstrap 95 % band."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = long_table(results, drop_truncated=True)
    kinds = _kinds(results, kinds)
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.8 * len(kinds), 3.9), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        d = df[df.kind == kind]
        levels = _levels_sorted(d)
        x = np.arange(len(levels))
        for key, lab, mk in (("p_s", "$p_s$", "o"), ("p_dC", "$p_{d|C}$", "s"), ("p_dW", "$p_{d|W}$", "^"),
                             ("accuracy", "observed accuracy", "*"), ("predicted", "predicted accuracy", "x")):
            m = d.groupby("level")[key].mean().reindex(levels).astype(float)
            line, = ax.plot(x, m.values, "--" if key == "predicted" else "-", marker=mk, label=lab)
            if d.stage.nunique() > 1:
                for _, r in d.iterrows():
                    if r[key] is not None and r[key] == r[key]:
                        ax.plot(levels.index(r.level), r[key], mk, color=line.get_color(), alpha=0.3, ms=4)
        if d.stage.nunique() == 1:
            lo = d.set_index("level").reindex(levels)
            ax.fill_between(x, lo.predicted_low.astype(float), lo.predicted_high.astype(float), color="0.85",
                            label="predicted (bootstrap 95%)")
        ax.set(xticks=x, xticklabels=levels, ylim=(-0.03, 1.03), title=_row_label(df, kind))
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


@_results_first
def echo_table(results: dict) -> pd.DataFrame:
    """F->T and T->F counts and rates per stage (the 'echo chamber', Kang et al. 2025)."""
    rows = {}
    for x in plan_of(results):
        t = results["calibration"][x["name"]]["all"]["overall"]["transitions"]
        rows[_stage_label(results, x["name"])] = {
            "F->T": t["F->T"], "F->F": t["F->F"], "p(F->T)": t["p(F->T)"],
            "T->F": t["T->F"], "T->T": t["T->T"], "p(T->F)": t["p(T->F)"]}
    return pd.DataFrame(rows).T


def kang_table() -> pd.DataFrame:
    """Kang et al. (2025)'s table as printed in the paper."""
    return pd.DataFrame(paper_results()["kang2025"]["rows"]).set_index("ft_ratio_in_data")


def _faith_value(f: dict, key: str, count: str, levels):
    """A faithfulness share overall (``levels`` None) or weighted by its count over ``levels``."""
    if levels is None:
        return (f.get("overall") or {}).get(key)
    w = [(b[count], b[key]) for lv, b in (f.get("by_level") or {}).items()
         if lv in levels and b.get(count) and b.get(key) is not None]
    return sum(c * x for c, x in w) / sum(c for c, _ in w) if w else None


def _pooled_counts(results: dict, names, key: str, levels) -> list[int]:
    """The 2x2 agreement counts ``key`` of the stages ``names`` summed over seeds, overall (``levels`` None) or
    over ``levels``."""
    total = [0, 0, 0, 0]
    for n in names:
        f = results["calibration"][n].get("faithfulness") or {}
        blocks = [f.get("overall") or {}] if levels is None else \
            [b for lv, b in (f.get("by_level") or {}).items() if lv in levels]
        for b in blocks:
            total = [t + c for t, c in zip(total, b.get(key) or (0, 0, 0, 0))]
    return total


@_results_first
def faithfulness_table(results: dict, kinds=None, level_groups: dict | None = None) -> pd.DataFrame:
    """Decision faithfulness per stage kind as the results' task reads it (:meth:`dsh.measure.tasks.Task.faithfulness`:
    its ``faithfulness_keys``), the mean over seeds, next to p_dC, p_dW and the number of items read (its
    ``faithfulness_count``: attempts, checks); with ``level_groups`` (``{name:
    levels}``) each share is weighted by its count over each group's levels (e.g. the fine-tuning levels and beyond).
    Where the task counts the agreement of a verdict with its check (``agreement_counts``), the counts pooled over
    seeds and levels give the chance agreement and Cohen's kappa with its 95 % interval
    (:func:`dsh.core.agreement.cohen_kappa`)."""
    task = tasks.get(results["summary"].get("task", "traces"))
    df = long_table(results)
    rows = {}
    for kind in _kinds(results, kinds):
        names = [x["name"] for x in plan_of(results) if x["kind"] == kind]
        row = {}
        if level_groups is None:
            over = [results["calibration"][n]["all"]["overall"] for n in names]
            for key, name in (("p_d_given_correct", "p_dC"), ("p_d_given_wrong", "p_dW")):
                xs = [o[key] for o in over if o[key] is not None]
                row[name] = sum(xs) / len(xs) if xs else None
            counts = [((results["calibration"][n].get("faithfulness") or {}).get("overall") or {})
                      .get(task.faithfulness_count) for n in names]
            counts = [c for c in counts if c is not None]
            row[task.faithfulness_count] = sum(counts) / len(counts) if counts else None
        groups = level_groups or {None: None}
        for g, levels in groups.items():
            for key in task.faithfulness_keys:
                xs = [_faith_value(results["calibration"][n].get("faithfulness") or {}, key,
                                   task.faithfulness_count, levels) for n in names]
                xs = [x for x in xs if x is not None]
                row[key if g is None else (g, key)] = sum(xs) / len(xs) if xs else None
            if task.agreement_counts:      # chance baseline and kappa from the counts pooled over seeds and levels
                k = cohen_kappa(*_pooled_counts(results, names, task.agreement_counts, levels))
                for key, x in (("chance_agreement", k["chance"]), ("kappa", k["kappa"]),
                               ("kappa_low", k["kappa_ci"][0]), ("kappa_high", k["kappa_ci"][1])):
                    row[key if g is None else (g, key)] = x
        rows[_row_label(df, kind)] = row
    return pd.DataFrame(rows).T


def _pooled_p_s(cal: dict, levels):
    """p_s of a stage's calibration pooled over ``levels``: first attempts right over responses with an answer."""
    by = cal["all"]["by_level"]
    n = [by[lv]["n"] - (by[lv].get("no_answer") or 0) for lv in levels if lv in by]
    ps = [by[lv]["p_s"] for lv in levels if lv in by]
    return sum(a * b for a, b in zip(n, ps) if b is not None) / sum(n) if sum(n) else None


@_results_first
def reflection_table(results: dict, levels, kind: str = "sft_reflection", plain: str = "sft") -> pd.DataFrame:
    """Reflection SFT per seed on ``levels`` (e.g. the fine-tuning levels): the checks read, the share whose verdict
    follows the true check of the model's own answer with its chance agreement and Cohen's kappa (95 % interval),
    the first attempt's accuracy (p_s, pooled over the levels' candidates) beside SFT without reflection's, and the
    share of all its responses cut at the token limit."""
    task = tasks.get(results["summary"].get("task", "traces"))
    rows = []
    for x in plan_of(results):
        if x["kind"] != kind or x["name"] not in results["calibration"]:
            continue
        cal = results["calibration"][x["name"]]
        twin = next((y["name"] for y in plan_of(results) if y["kind"] == plain and y.get("seed") == x.get("seed")), None)
        k = cohen_kappa(*_pooled_counts(results, [x["name"]], task.agreement_counts, levels)) \
            if task.agreement_counts else None
        row = {"stage": x["name"], "checks": k["n"] if k else None,
               "verdict follows check": k["observed"] if k else None, "chance": k["chance"] if k else None,
               "kappa": k["kappa"] if k else None,
               "kappa 95 %": f"[{k['kappa_ci'][0]:.2f}, {k['kappa_ci'][1]:.2f}]" if k and k["kappa"] is not None
               else None,
               "first attempt": _pooled_p_s(cal, levels),
               "first attempt, no reflection": _pooled_p_s(results["calibration"][twin], levels) if twin in results["calibration"]
               else None,
               "at the token limit": cal.get("truncated")}
        rows.append(row)
    return pd.DataFrame(rows)


@_results_first
def probe_table(results: dict, kinds=None, group: str = "tuned") -> pd.DataFrame:
    """The check probe (:mod:`dsh.experiment.check_probe`) per stage of ``kinds`` and per seed, pooled over the
    levels of ``group`` ("tuned": the fine-tuning levels; "beyond"): items asked, checks read, the share whose
    verdict follows the true check of the given candidate with its chance agreement and Cohen's kappa (95 %
    interval), the share of check lines exactly right, the share of verdicts that follow the check as written, the
    share of failing verdicts followed by the marker; then for each kind the seeds pooled (counts added)."""
    v.choice("group", group, ("tuned", "beyond"))
    probe = results.get("probe") or {}
    rows = []

    def row(stage, kind, seed, blocks):
        counts = [sum(c) for c in zip(*(b["follows_counts"] for b in blocks if b.get("checks")))] or [0, 0, 0, 0]
        k = cohen_kappa(*counts)
        n = sum(b.get("checks") or 0 for b in blocks)

        def mean(key):      # weighted by the checks of each block that has the key
            got = [(b[key], b["checks"]) for b in blocks if b.get(key) is not None and b.get("checks")]
            return sum(x * w for x, w in got) / sum(w for _, w in got) if got else None

        return {"stage": stage, "kind": kind, "seed": seed, "items": sum(b["items"] for b in blocks), "checks": n,
                "verdict follows check": k["observed"], "chance": k["chance"], "kappa": k["kappa"],
                "kappa low": k["kappa_ci"][0], "kappa high": k["kappa_ci"][1], "check exact": mean("check_exact"),
                "verdict follows written check": mean("follows_written"),
                "marker after fails": None}

    for kind in _kinds(results, kinds):
        mine = [x for x in plan_of(results) if x["kind"] == kind and x["name"] in probe]
        for x in mine:
            b = probe[x["name"]][group]
            r = row(x["name"], kind, x["seed"], [b])
            r["marker after fails"] = b.get("resample_after_fail")
            rows.append(r)
        if len(mine) > 1:
            rows.append(row(f"{kind} (seeds pooled)", kind, "pooled", [probe[x["name"]][group] for x in mine]))
    return pd.DataFrame(rows)


@_results_first
def design_table(results: dict) -> pd.DataFrame:
    """The design goals of the small-scale analogue (dsh.experiment.pipeline.design_checks) and whether the run met them."""
    d = results["summary"].get("design") or design_checks(results)
    return pd.DataFrame({"met": {k: ("cannot tell" if x is None else ("yes" if x else "no"))
                                 for k, x in d["goals"].items()}})


@_results_first
def truncation_table(results: dict) -> pd.DataFrame:
    """Budget and truncation per stage: training examples over max_length (SFT), rollouts clipped at
    max_completion_length (GRPO, mean and first step) and evaluation responses cut at max_new_tokens."""
    s = results["summary"]
    rows = {}
    for stage, t in (s.get("truncation") or {}).items():
        tr = t.get("train") or {}
        rows[_stage_label(results, stage)] = {
            "training budget": tr.get("limit"),
            "training cut": tr.get("rate", tr.get("clipped_rate")),
            "GRPO clipped at step 1": tr.get("clipped_rate_first"),
            "evaluation budget": s["eval"]["max_new_tokens"], "evaluation cut": t.get("eval")}
    return pd.DataFrame(rows).T


def stage_table(preset, seeds=None, ablation_seeds=None) -> pd.DataFrame:
    """The stages of ``preset``'s pipeline (a name or a :class:`dsh.experiment.presets.Preset`, over ``seeds``):
    method, seed, starting point, training levels and size, learning rate and each stage's own token budget
    (max_length for SFT, max_completion_length for GRPO)."""
    p = get(preset)
    cfgs = plan(p, p.runs_dir, seeds=seeds, ablation_seeds=ablation_seeds)
    rows = []
    for s in p.plan_stages(seeds, ablation_seeds):
        row = {"stage": s.name, "method": s.method or "(none)", "starts from": s.init or "the model"}
        c = cfgs.get(s.name)
        if c is not None:
            row.update(seed=c.seed, levels=", ".join(c.train_levels), n_train=c.n_train, max_steps=c.max_steps,
                       learning_rate=c.learning_rate,
                       token_budget=c.max_completion_length if c.method == "grpo" else c.max_length)
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


def config_table(configs: dict, fields) -> pd.DataFrame:
    """Chosen ``fields`` of TrainConfigs (``{name: TrainConfig}``), one column per config."""
    import dataclasses

    return pd.DataFrame({name: {k: x for k, x in dataclasses.asdict(c).items() if k in fields}
                         for name, c in configs.items()})


DELTA_KEYS = (("p_s", "Δp_s"), ("p_d_given_correct", "Δp_dC"), ("p_d_given_wrong", "Δp_dW"),
              ("observed_accuracy", "Δaccuracy"))


@_results_first
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


@_results_first
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


@_results_first
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


@_results_first
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


@_results_first
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


def _reward_trend(curve: list[dict]) -> tuple:
    """A GRPO reward curve's last-fifth-minus-first-fifth contrasts (:func:`dsh.measure.trend.fifths_contrast`) of
    its mean reward and of its share of zero-variance groups."""
    return (fifths_contrast([r["reward"] for r in curve]), fifths_contrast([r["frac_reward_zero_std"] for r in curve]))


def _first_wrong(level: dict) -> int:
    """The responses of a calibrated level whose first answer is wrong (answered responses times 1 - p_s)."""
    return round((level["n"] - level["no_answer"]) * (1 - level["p_s"])) if level.get("p_s") is not None else 0


@_results_first
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
        t, z = _reward_trend(c)
        row = {"stage": x["name"], "rollouts": (train.get(x["name"]) or {}).get("rollouts"), "rounds": len(c)}
        if t is not None:
            row.update({"reward first fifth": round(t["first"], 3), "reward last fifth": round(t["last"], 3),
                        "difference (95 % interval)": f"{t['delta']:+.3f} ({t['ci'][0]:+.3f}, {t['ci'][1]:+.3f})",
                        "verdict": trend_verdict(t), "zero-variance groups first / last":
                        f"{z['first']:.2f} / {z['last']:.2f}"})
        rows.append(row)
    return pd.DataFrame(rows)


@_results_first
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


@_results_first
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


@_results_first
def timings_table(results: dict) -> pd.DataFrame:
    """Seconds per training and evaluation step, as recorded by the run (keys ``train_<stage>``,
    ``evaluate_<stage>``; runs before the pipeline's steps were shared wrote ``train <stage>``)."""
    rows = {}
    for k, s in results["summary"]["timings_s"].items():
        what, stage = re.split("[ _]", k, maxsplit=1)
        rows.setdefault(stage, {})[what] = s
    return pd.DataFrame(rows).T


@_results_first
def headline(results: dict, beyond=None) -> list[str]:
    """Plain sentences for a chapter, computed from the results (so the text follows the data whichever way it
    falls): each Table 1 kind's accuracy pooled over levels (and over ``beyond``, e.g. the levels past the
    fine-tuning data), RL's changes of p_s and p_dW from its SFT (reflection), and the KL ablation's trend."""
    out = []
    df = long_table(results)
    for kind in _kinds(results, TABLE1_KINDS):
        d = df[df.kind == kind]
        line = f"{stage_label(kind)}: mean accuracy {100 * d.accuracy.mean():.1f} % over the ladder"
        far = d[d.level.isin(beyond or ())]
        out.append(line + (f", {100 * far.accuracy.mean():.1f} % on {', '.join(beyond)}." if len(far) else "."))
    d = delta_table(results, [("RL minus its SFT (reflection)", "rl", "sft_reflection")])
    if not d.empty and "Δp_s" in d:
        out.append(f"RL minus SFT (reflection), same seed, pooled over levels: Δp_s {d['Δp_s'][0]}, "
                   f"Δp_dC {d['Δp_dC'][0]}, Δp_dW {d['Δp_dW'][0]}, Δaccuracy {d['Δaccuracy'][0]} "
                   f"(mean [range] over {d['seeds'][0]} seeds).")
    kl = kl_table(results)
    if not kl.empty and "Δp_s" in kl:
        ps = [float(x.split(" ")[0]) for x in kl["Δp_s"]]
        pw = [float(x.split(" ")[0]) for x in kl["Δp_dW"]]
        out.append(f"KL ablation ({', '.join(kl.comparison)}): Δp_s {', '.join(f'{x:+.3f}' for x in ps)}; "
                   f"Δp_dW {', '.join(f'{x:+.3f}' for x in pw)}. From the smallest to the largest beta, p_s's change "
                   f"moves by {ps[-1] - ps[0]:+.3f} and p_dW's by {pw[-1] - pw[0]:+.3f} "
                   f"(over {kl['seeds'].max()} seed{'s' if kl['seeds'].max() > 1 else ''}: no interval).")
    return out


# ------------------------------------------------------------------------------------------------
# Verdicts on the paper's claims
# ------------------------------------------------------------------------------------------------
def _verdicts(verdicts) -> list:
    """``verdicts`` checked to be :func:`claims`' list (dicts with claim, verdict and evidence)."""
    if not isinstance(verdicts, list) or not all(isinstance(c, dict) and {"claim", "verdict", "evidence"} <= set(c)
                                                 for c in verdicts):
        raise ValueError("verdicts must be the list claims() returns (dicts with claim, verdict and evidence)")
    return verdicts


@_results_first
def claims(results: dict, min_n: int = 30, seed=None) -> list[dict]:
    """The verdicts of :func:`dsh.measure.claims.verdicts` on a results folder (its stages of training seed ``seed``
    where it holds several, :func:`calibration_by_kind`)."""
    return verdicts(calibration_by_kind(results, seed), min_n)


def claims_table(verdicts: list[dict]) -> pd.DataFrame:
    """The pooled verdicts of :func:`claims` (claim, verdict, evidence), one row per claim."""
    _verdicts(verdicts)
    return pd.DataFrame([{k: c[k] for k in ("claim", "verdict", "evidence")} for c in verdicts])


def per_level_table(verdicts: list[dict]) -> pd.DataFrame:
    """The per-level verdicts of :func:`claims` as a table: claim, stage (claim (i) judges two), level, p_s, the
    difference with its 95 % interval and the verdict; for claim (i) also the observed accuracy, the two-stage
    prediction and the correctness-blind one (:func:`dsh.measure.claims.blind_prediction`)."""
    rows = []
    _verdicts(verdicts)
    r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
    for c in verdicts:
        for r in c.get("per_level", []):
            lo, hi = r["interval"]
            rows.append({"claim": c["claim"].split(" ")[0], "stage": r.get("stage", "-"), "level": r["level"],
                         "p_s": r3(r.get("p_s")), "observed": r3(r.get("observed")),
                         "predicted": r3(r.get("predicted")), "correctness-blind": r3(r.get("blind")),
                         "difference": r3(r["difference"]),
                         "95% interval": "-" if lo is None else f"({lo:+.3f}, {hi:+.3f})", "verdict": r["verdict"]})
    return pd.DataFrame(rows, columns=["claim", "stage", "level", "p_s", "observed", "predicted", "correctness-blind",
                                       "difference", "95% interval", "verdict"])


@_results_first
def rl_sampling_mismatch(results: dict) -> str | None:
    """Why the RL stages of a results folder cannot be compared with the stage they started from, or None: a model
    is tested at the sampling it was trained at, and RL that sampled its rollouts at another temperature than the
    evaluation's learned at that temperature (the summary's ``configs`` and ``eval``)."""
    configs, ev = results["summary"].get("configs") or {}, results["summary"].get("eval") or {}
    temps = sorted({configs[x["name"]].get("temperature") for x in plan_of(results)
                    if x["kind"].startswith("rl") and x["name"] in configs} - {None})
    at = ev.get("temperature")
    if at is None or not temps or temps == [at]:
        return None
    return (f"RL sampled its rollouts at temperature {', '.join(f'{t:g}' for t in temps)}, the evaluation at "
            f"{at:g}")


@_results_first
def stratified_table(results: dict, min_n: int = 30) -> pd.DataFrame:
    """Per training seed and claim: the level-stratified contrast (equal level weights over the levels where the
    claim can fail; :mod:`dsh.measure.claims`), its levels, its 95 % interval and the verdict; claim (i) per stage
    with the correctness-blind decision's gap beside it."""
    rows = []
    for s in seeds_of(results):
        for c in claims(results, min_n, s):
            key = c["claim"].split(" ")[0]
            blocks = ([(st, x["stratified"], x["verdict"], x.get("blind")) for st, x in c["stages"].items()]
                      if "stages" in c else [("-", c.get("stratified"), c["verdict"], None)] if "stratified" in c
                      else [])
            for stage, st, verdict, blind in blocks:
                rows.append({"seed": s, "claim": key, "stage": stage,
                             "levels": ", ".join(st["levels"]) if st else "-",
                             "difference": round(st["difference"], 3) if st else None,
                             "95% interval": f"({st['interval'][0]:+.3f}, {st['interval'][1]:+.3f})" if st else "-",
                             "correctness-blind": f"{blind['difference']:+.3f} ({blind['interval'][0]:+.3f}, "
                                                  f"{blind['interval'][1]:+.3f})" if blind else "-",
                             "verdict": verdict})
    return pd.DataFrame(rows, columns=["seed", "claim", "stage", "levels", "difference", "95% interval",
                                       "correctness-blind", "verdict"])


@_results_first
def recovery_table(results: dict, kinds=("sft_reflection", "rl")) -> pd.DataFrame:
    """Does reflection pay? Per stage kind, seed and level: the responses whose first attempt is wrong, the
    resamples that follow a wrong answer (F->T + F->F) and p(F->T), the share of them whose next answer is right,
    with its 95 % Wilson interval; and p(T->F), the share of resamples after a right answer that give a wrong one."""
    rows = []
    for x in plan_of(results):
        if x["kind"] not in kinds:
            continue
        for lv, e in block(results["calibration"][x["name"]])["by_level"].items():
            t = e["transitions"]
            wrong, right = t["F->T"] + t["F->F"], t["T->T"] + t["T->F"]
            lo, hi = wilson_interval(t["F->T"], wrong)
            rows.append({"kind": x["kind"], "seed": x["seed"], "level": lv, "p_s": e.get("p_s"),
                         "wrong first attempts": _first_wrong(e), "resamples after a wrong answer": wrong,
                         "F->T": t["F->T"],
                         "p(F->T)": t["F->T"] / wrong if wrong else None,
                         "p(F->T) 95%": f"({lo:.2f}, {hi:.2f})" if wrong else "-",
                         "T->F": t["T->F"], "p(T->F)": t["T->F"] / right if right else None})
    return pd.DataFrame(rows)


REGIME_POINTS = {   # the points the graded experiment was built to meet (chapter 07), each per training seed
    "base": "the base answers >= 5 % right on every level",
    "graded": "SFT (reflection): p_s in 0.2-0.8 on >= 4 levels, >= 2 outside the fine-tuning levels",
    "falling": "SFT (reflection)'s p_s falls with the multiplicand's digits (slope's 95 % interval below 0)",
    "probe": "the check probe after SFT (reflection) gives agreement >= 0.9 and kappa >= 0.8 on its graded levels",
    "wrong first": "SFT (reflection) has >= 30 wrong first attempts on each of its graded levels",
    "mixed": "GRPO: >= 50 % of groups with mixed rewards in the first fifth of its rounds",
    "rise": "GRPO: the reward rises (the last fifth minus the first, 95 % interval above 0)",
    "rollouts": "GRPO: >= 10,000 rollouts",
    "truncated": "no stage has more than 5 % of its evaluation responses at the token limit",
}


def regime_rows(results: dict) -> list[dict]:
    """Per training seed, what :data:`REGIME_POINTS` asks of the graded experiment, measured: the base's lowest
    per-level accuracy; SFT (reflection)'s graded levels (p_s in the band of :func:`dsh.measure.claims.graded`),
    those outside its fine-tuning levels, and the slope of its p_s on the multiplicand's digits with its interval
    (:func:`dsh.measure.trend.level_slope`); the check probe's lowest agreement and kappa on the graded levels and
    their fewest wrong first attempts; GRPO's share of mixed-reward groups in the first fifth of its rounds, the rise
    of its reward (:func:`dsh.measure.trend.fifths_contrast`) and its rollouts; the largest share of evaluation
    responses at the token limit over the seed's stages and the base. Each row says which points it meets (``met``:
    {point: bool, or None where the stage is missing})."""
    s, cal, probe = results["summary"], results["calibration"], results.get("probe") or {}
    plan_ = plan_of(results)
    trunc = {k: (t or {}).get("eval") for k, t in (s.get("truncation") or {}).items()}
    base = [x["name"] for x in plan_ if x["kind"] == "base"]
    base_acc = min((e["observed_accuracy"] for b in base for e in block(cal[b])["by_level"].values()), default=None)
    rows = []
    for seed in seeds_of(results):
        by_kind = {x["kind"]: x["name"] for x in plan_ if x["seed"] == seed}
        row = {"seed": seed, "base: lowest accuracy": base_acc}
        met = {"base": None if base_acc is None else base_acc >= 0.05}
        sr = by_kind.get("sft_reflection")
        if sr:
            levels = block(cal[sr])["by_level"]
            ft = set((s.get("configs") or {}).get(sr, {}).get("train_levels") or ())
            g = [lv for lv, e in levels.items() if graded(e)]
            out = [lv for lv in g if lv not in ft]
            have = [(lv, e) for lv, e in levels.items() if e.get("p_s") is not None]
            fit = level_slope([max(parse_level(lv)) for lv, _ in have], [e["p_s"] for _, e in have],
                              [e["n"] - e["no_answer"] for _, e in have])
            pb = [probe.get(sr, {}).get("by_level", {}).get(lv) or {} for lv in g]
            agree = [b.get("verdict_follows_check") for b in pb]
            kappa = [b.get("kappa") for b in pb]
            wrong = [_first_wrong(levels[lv]) for lv in g]
            row.update({"SFT (reflection): graded levels": ", ".join(g) or "-", "outside fine-tuning": len(out),
                        "p_s slope per digit (95 %)": f"{fit['slope']:+.3f} ({fit['ci'][0]:+.3f}, {fit['ci'][1]:+.3f})"
                        if fit else "-",
                        "probe: lowest agreement / kappa": f"{min(agree):.2f} / {min(kappa):.2f}"
                        if g and None not in agree and None not in kappa else "-",
                        "fewest wrong first attempts": min(wrong) if wrong else None})
            met.update({"graded": len(g) >= 4 and len(out) >= 2,
                        "falling": bool(fit) and fit["ci"][1] < 0,
                        "probe": bool(g) and None not in agree and None not in kappa
                        and min(agree) >= 0.9 and min(kappa) >= 0.8,
                        "wrong first": bool(wrong) and min(wrong) >= 30})
        else:
            met.update(dict.fromkeys(("graded", "falling", "probe", "wrong first")))
        rl = by_kind.get("rl")
        curve = (s.get("reward_curves") or {}).get(rl) if rl else None
        if curve:
            t, z = _reward_trend(curve)
            n = ((s.get("training") or {}).get(rl) or {}).get("rollouts")
            row.update({"GRPO: mixed groups, first fifth": round(1 - z["first"], 3) if z else None,
                        "reward rise (95 %)": f"{t['delta']:+.3f} ({t['ci'][0]:+.3f}, {t['ci'][1]:+.3f})" if t else "-",
                        "rollouts": n})
            met.update({"mixed": bool(z) and 1 - z["first"] >= 0.5, "rise": bool(t) and t["ci"][0] > 0,
                        "rollouts": n is not None and n >= 10_000})
        else:
            met.update(dict.fromkeys(("mixed", "rise", "rollouts")))
        mine = [trunc.get(x["name"]) for x in plan_ if x["seed"] in (seed, None)]
        mine = [x for x in mine if x is not None]
        row["most truncated"] = max(mine) if mine else None
        met["truncated"] = None if not mine else max(mine) <= 0.05
        row["met"] = met
        rows.append(row)
    return rows


def run_time(results: dict) -> dict:
    """How long a results folder's pipeline took, stage by stage, when it ran in several pieces (stopped and
    resumed: a reused step's time is 0 in the summary's ``timings_s``, and a training resumed from a checkpoint
    records only its last piece). Per stage: its method, the training's own wall time (``training[stage]["wall_s"]``)
    unless it was resumed, then the median of its method's stages trained in one piece (``estimated``); its
    evaluation and probe as timed (the median of the other stages' where reused). ``{"stages": [...], "total_s",
    "estimated": [stages]}`` (the base's own steps included, the base's training not: it is shipped)."""
    s = results["summary"]
    train, times = s.get("training") or {}, s.get("timings_s") or {}
    plan_ = plan_of(results)
    whole = {}
    for x in plan_:
        t = train.get(x["name"]) or {}
        if x.get("method") and t.get("wall_s") is not None and not t.get("resumed_from"):
            whole.setdefault(x["method"], []).append(t["wall_s"])
    steps = {k: [x for n, x in times.items() if n.startswith(k + "_") and x > 0] for k in ("evaluate", "probe")}
    rows, estimated = [], []
    for x in plan_:
        t, row = train.get(x["name"]) or {}, {"stage": x["name"], "method": x.get("method")}
        if x.get("method"):
            one_piece = t.get("wall_s") is not None and not t.get("resumed_from")
            if not one_piece:
                estimated.append(x["name"])
            row["train_s"] = t["wall_s"] if one_piece else (statistics.median(whole[x["method"]])
                                                            if whole.get(x["method"]) else None)
        for k in ("evaluate", "probe"):
            got = times.get(f"{k}_{x['name']}") or 0.0
            row[f"{k}_s"] = got if got > 0 or not steps[k] else statistics.median(steps[k])
        rows.append(row)
    total = sum(r.get("train_s") or 0.0 for r in rows) + sum(r["evaluate_s"] + r["probe_s"] for r in rows)
    return {"stages": rows, "total_s": round(total, 1), "estimated": estimated}


READ_AGAIN = {"accuracy": "observed_accuracy", "p_s": "p_s", "p_dC": "p_d_given_correct", "p_dW": "p_d_given_wrong"}


def reading_agreement(results: dict, other: dict) -> pd.DataFrame:
    """A second reading of the same generations against the calibrations: ``other[stage][level]`` holds a reader's
    ``n``, ``accuracy``, ``p_s``, ``p_dC``, ``p_dW`` and ``F->T`` (e.g. a reader that imports nothing from dsh). Per
    stage the largest absolute difference of each rate over its levels (where both readings have one), the largest
    difference of the F->T count, and the levels compared."""
    rows = []
    for x in plan_of(results):
        theirs = other.get(x["name"])
        if theirs is None:
            continue
        mine = block(results["calibration"][x["name"]])["by_level"]
        row = {"stage": x["name"], "levels": len(set(mine) & set(theirs))}
        for k, field in READ_AGAIN.items():
            d = [abs(theirs[lv][k] - mine[lv][field]) for lv in mine if lv in theirs
                 and theirs[lv].get(k) is not None and mine[lv].get(field) is not None]
            row[f"max |{k} difference|"] = round(max(d), 3) if d else None
        row["max |F->T difference|"] = max((abs(theirs[lv]["F->T"] - mine[lv]["transitions"]["F->T"])
                                            for lv in mine if lv in theirs), default=None)
        rows.append(row)
    return pd.DataFrame(rows)


def regime_table(results: dict) -> pd.DataFrame:
    """:func:`regime_rows` as a table: one row per seed, the measured values and the points not met."""
    rows = []
    for r in regime_rows(results):
        miss = [k for k, ok in r["met"].items() if ok is False]
        rows.append({**{k: x for k, x in r.items() if k != "met"}, "points not met": ", ".join(miss) or "-"})
    return pd.DataFrame(rows)


@_results_first
def claims_by_seed(results: dict, min_n: int = 30) -> pd.DataFrame:
    """The verdicts of :func:`claims` for each training seed, one row per claim and seed, with the per-level ones."""
    rows = []
    for s in seeds_of(results):
        for c in claims(results, min_n, s):
            per = c.get("per_level") or []
            rows.append({"seed": s, "claim": c["claim"], "verdict": c["verdict"],
                         "per level": ", ".join(f"{r['stage'] + ' ' if r.get('stage') else ''}{r['level']}: "
                                                f"{r['verdict']}" for r in per) or "-",
                         "evidence": c["evidence"]})
    return pd.DataFrame(rows)


def load_attribution(results_dir) -> dict:
    """The gradient-attribution studies of a results folder (``attribution/<stage>.json``, written by the pipeline's
    attribution step, :func:`dsh.experiment.pipeline.attribution_stage`), by file stem; empty when there are none."""
    return _records_in(results_dir, "attribution")


def load_dynamics(results_dir) -> dict:
    """The attribution studies along the GRPO runs (``dynamics/<arm>-step<k>.json``, written by
    ``book/results/laptop/design/grpo_dynamics.py``), by file stem; empty when there are none."""
    return _records_in(results_dir, "dynamics")


def _records_in(results_dir, sub: str) -> dict:
    """The JSON records ``<results_dir>/<sub>/*.json`` by file stem; ``results_dir`` must be an existing folder."""
    import json

    if not isinstance(results_dir, (str, Path)) or not Path(results_dir).is_dir():
        raise ValueError(f"results_dir must be an existing folder, got {results_dir!r}")
    return {f.stem: json.loads(f.read_text()) for f in sorted(Path(results_dir).glob(f"{sub}/*.json"))}


DYNAMICS_TERMS = ("reward", "kl_k3")


def dynamics_table(studies: dict, betas: dict, seed: int = 0) -> pd.DataFrame:
    """One row per GRPO arm and step (:func:`load_dynamics`): the run's validation estimates at that step (p_s,
    p_dC, p_dW and the intervals of p_s and p_dW) and, per term of the GRPO loss, the median over trajectories of the
    norm of its attempt part (what reaches pi_sample) and of its decision part (pi_d), with 95 % intervals that
    resample questions (:func:`dsh.measure.length_law.cluster_median`): the surrogate reward over the trajectories
    with an advantage, TRL's k3 KL times the arm's coefficient ``betas[arm]`` (its weight in the loss; none where the
    policy is its reference)."""
    _studies("studies", studies, ("arm", "step", "trajectories"))
    if not isinstance(betas, dict):
        raise ValueError(f"betas must map each GRPO arm to its KL coefficient, got {type(betas).__name__}")
    missing = sorted({x["arm"] for x in studies.values()} - set(betas))
    if missing:
        raise ValueError(f"betas must give every arm's KL coefficient; missing {', '.join(missing)}")
    rows = []
    for s in sorted(studies.values(), key=lambda x: (x["arm"], x["step"])):
        val = s.get("validation") or {}
        (s_lo, s_hi), (w_lo, w_hi) = (val.get(f"{k}_ci") or (None, None) for k in ("p_s", "p_d_given_wrong"))
        row = {"arm": s["arm"], "step": s["step"], "p_s": val.get("p_s"), "p_s low": s_lo, "p_s high": s_hi,
               "p_dC": val.get("p_d_given_correct"), "p_dW": val.get("p_d_given_wrong"), "p_dW low": w_lo,
               "p_dW high": w_hi, "trajectories": len(s["trajectories"])}
        for o in DYNAMICS_TERMS:
            weight = 1.0 if o == "reward" else betas[s["arm"]]
            got = [r for r in s["trajectories"] if r["grad"].get(o)]
            for part in ("attempt", "decision"):
                m = cluster_median([weight * r["grad"][o][part] for r in got], [r["prompt"] for r in got], seed=seed) \
                    if got else {"median": None, "ci": [None, None]}
                row[f"{o} {part}"], row[f"{o} {part} low"], row[f"{o} {part} high"] = m["median"], *m["ci"]
        rows.append(row)
    return pd.DataFrame(rows)


def question_repeats(results_dir, stage: str = "base") -> pd.DataFrame:
    """The test questions of a results folder, read from ``generations/<stage>.jsonl.gz`` (every stage is asked the
    same ones): per level the questions asked, how many are distinct, and the repeats (a draw with replacement
    repeats a question; :func:`dsh.task.problems.draw_problems` with ``distinct`` does not)."""
    if not isinstance(results_dir, (str, Path)):
        raise ValueError(f"results_dir must be a results folder path, got {results_dir!r}")
    recs = read_jsonl(Path(results_dir) / "generations" / f"{stage}.jsonl.gz", what="results_dir")
    rows = []
    for lv in sorted({r["level"] for r in recs}, key=level_index):
        qs = [r["question"] for r in recs if r["level"] == lv]
        rows.append({"level": lv, "questions": len(qs), "distinct": len(set(qs)), "repeats": len(qs) - len(set(qs))})
    return pd.DataFrame(rows, columns=["level", "questions", "distinct", "repeats"])


def _study(name: str, study, needs=("fits",)) -> dict:
    """``study`` checked to be a study record holding ``needs`` (by default its fits)."""
    return study_record(name, study, needs)


def _studies(name: str, studies, needs=("fits",)) -> dict:
    """``studies`` checked to map names to study records holding ``needs``."""
    if not isinstance(studies, dict):
        raise ValueError(f"{name} must map study names to study records (attribution_study.run_study), "
                         f"got {type(studies).__name__}")
    for k, st in studies.items():
        _study(f"{name}[{k!r}]", st, needs)
    return studies


def attribution_table(studies: dict) -> pd.DataFrame:
    """One row per study, term and denominator: the log-log slope of |g_attempt| / |g_part| on the attempt length
    with its 95 % bootstrap interval, the pairs used, those left out because the part carries no gradient, the
    lengths' span, Theorem 3.2's predicted slope and the verdict (:mod:`dsh.measure.length_law`)."""
    rows = []
    for name, s in _studies("studies", studies).items():
        for key, f in s["fits"].items():
            term, against = key.split(" / ")
            rows.append({"study": name, "term": term, "against": against, "pairs": f["n"],
                         "silent": f.get("silent"), "span": f["span"], "slope": f["slope"], "low": f["ci"][0],
                         "high": f["ci"][1], "predicted": f["predicted"], "verdict": f["verdict"]})
    return pd.DataFrame(rows)


def _side_by_side(first: dict, second: dict, labels, key: list, cols: list, against: str | None = None) -> pd.DataFrame:
    """:func:`attribution_table` of two sets of studies joined on ``key``, ``cols`` of each suffixed with its label
    (``against``: only fits against it), only the fits with a slope in both."""
    a, b = attribution_table(first), attribution_table(second)
    if against is not None:
        a, b = a[a.against == against], b[b.against == against]
    both = a.set_index(key)[cols].add_suffix(f" ({labels[0]})").join(
        b.set_index(key)[cols].add_suffix(f" ({labels[1]})"), how="inner")
    return both[both[f"slope ({labels[0]})"].notna() & both[f"slope ({labels[1]})"].notna()].copy()


def reproduction(first: dict, second: dict) -> pd.DataFrame:
    """Two studies of one model with different seeds of trajectories, side by side: per term and denominator the
    slope and 95 % interval of each (suffixes ``(t0)``, ``(t1)``), whether the slope is reproduced (each run's
    slope inside the other's interval) and the chance of that were both estimates of one slope, normal, with
    intervals of these widths (``chance``: :func:`dsh.measure.length_law.mutual_inclusion`, about 0.83). Terms
    without a slope in either are left out."""
    both = _side_by_side({"x": _study("first", first)}, {"x": _study("second", second)}, ("t0", "t1"),
                         ["term", "against"], ["slope", "low", "high"])
    both["reproduced"] = ((both["low (t1)"] <= both["slope (t0)"]) & (both["slope (t0)"] <= both["high (t1)"])
                          & (both["low (t0)"] <= both["slope (t1)"]) & (both["slope (t1)"] <= both["high (t0)"]))
    both["chance"] = [mutual_inclusion([a, b], [c, d]) for a, b, c, d in
                      both[["low (t0)", "high (t0)", "low (t1)", "high (t1)"]].itertuples(index=False)]
    return both[["slope (t0)", "low (t0)", "high (t0)", "slope (t1)", "low (t1)", "high (t1)", "reproduced", "chance"]]


def reproduction_count(tables, correlations=None, draws: int = 100_000, seed: int = 0) -> dict:
    """Over :func:`reproduction` tables (one per model), how many slopes are reproduced, against how many were
    expected were every pair two estimates of one slope (the sum of ``chance``), with the 95 % range of that count
    and the chance that every slope is reproduced (``p_all``). Without ``correlations`` the slopes count as
    independent: the range is the normal approximation to a sum of Bernoulli draws, sum p +- 1.96 sqrt(sum p (1 - p)),
    and ``p_all`` the product of the chances. ``correlations``: one entry per table, the correlation of its first
    study's slopes and of its second's (a pair of :func:`dsh.experiment.attribution_study.slope_correlation` frames,
    or one frame for both), indexed by ``(term, against)`` as the table is; then the difference of each pair of runs
    is drawn ``draws`` times, normal with those correlations and the intervals' widths (tables independent of each
    other), a slope counting as reproduced when the difference lies within both intervals' half-widths
    (:func:`dsh.measure.length_law.mutual_inclusion`'s rule), and the range and ``p_all`` come from those draws."""
    from statistics import NormalDist

    import numpy as np

    tables = v.collection("tables", tables, "reproduction() tables", nonempty=True)
    if not all(isinstance(t, pd.DataFrame) and {"reproduced", "chance"} <= set(t.columns) for t in tables):
        raise ValueError("tables must be a non-empty list of reproduction() tables")
    p = pd.concat(tables).chance.to_numpy(dtype=float)
    expected, sd = float(p.sum()), float((p * (1 - p)).sum()) ** 0.5
    out = {"reproduced": int(sum(int(t.reproduced.sum()) for t in tables)), "slopes": int(p.size),
           "expected": expected}
    if correlations is None:
        return {**out, "low": expected - 1.96 * sd, "high": expected + 1.96 * sd, "p_all": float(np.prod(p)),
                "range_by": "independent slopes (normal approximation)"}
    correlations = v.collection("correlations", correlations, "correlation frames, one per table")
    if len(correlations) != len(tables):
        raise ValueError(f"correlations must give one entry per table ({len(tables)}), got {len(correlations)}")
    v.positive_int("draws", draws)
    v.length("seed", seed)
    z, rng = NormalDist().inv_cdf(0.975), np.random.default_rng(seed)
    count, every = np.zeros(draws), np.ones(draws, dtype=bool)
    for t, corr in zip(tables, correlations):
        pair = corr if isinstance(corr, (tuple, list)) else (corr, corr)
        if len(pair) != 2 or not all(isinstance(c, pd.DataFrame) for c in pair):
            raise ValueError("correlations[i] must be a correlation DataFrame or a pair of them (slope_correlation)")
        missing = [k for c in pair for k in t.index if k not in c.index or k not in c.columns]
        if missing:
            raise ValueError(f"correlations[i] lacks the table's slopes {sorted(set(missing))[:3]}")
        s0 = (t["high (t0)"] - t["low (t0)"]).to_numpy(dtype=float) / (2 * z)
        s1 = (t["high (t1)"] - t["low (t1)"]).to_numpy(dtype=float) / (2 * z)
        r0, r1 = (c.loc[t.index, t.index].to_numpy(dtype=float) for c in pair)
        cov = r0 * np.outer(s0, s0) + r1 * np.outer(s1, s1)
        d = rng.multivariate_normal(np.zeros(len(t)), cov, size=draws, method="eigh")
        hit = np.abs(d) <= z * np.minimum(s0, s1)
        count += hit.sum(1)
        every &= hit.all(1)
    low, high = np.quantile(count, [0.025, 0.975])
    return {**out, "low": float(low), "high": float(high), "p_all": float(every.mean()),
            "range_by": "correlated slopes (the studies' bootstrap correlations, normal draws)"}


def compare_fits(first: dict, second: dict, labels=("first", "second"), against: str = "decision") -> pd.DataFrame:
    """The same models' fits in two sets of studies (``{study: record with fits}``, e.g. one model sampled at two
    temperatures), side by side per study and term against ``against``: slope, interval and pairs of each (suffixed
    with ``labels``), only fits with a slope in both, and whether the two intervals are disjoint."""
    v.choice("against", against, ("decision", "stage"))
    _studies("first", first), _studies("second", second)
    if len(labels) != 2 or labels[0] == labels[1]:
        raise ValueError(f"labels must be two different names, got {labels!r}")
    both = _side_by_side(first, second, labels, ["study", "term"], ["slope", "low", "high", "pairs"], against)
    lo, hi = both.filter(like="low").to_numpy(dtype=float).T, both.filter(like="high").to_numpy(dtype=float).T
    both["disjoint"] = (hi[0] < lo[1]) | (hi[1] < lo[0])
    return both


def kl_profile(study: dict, width: int = 10) -> pd.DataFrame:
    """The mean k1 = log(pi / pi_ref) by position along the first attempt, in bins of ``width`` positions (positions
    with at least 10 trajectories): the stationarity premise says it is flat. No rows (the columns kept) where no
    position has 10 trajectories, as for a model that writes no check after its answer."""
    import numpy as np

    v.positive_int("width", width)
    s, n = (np.asarray(_study("study", study, ("kl_positions",))["kl_positions"][k]) for k in ("sum", "n"))
    rows = []
    for start in range(0, len(s), width):
        ok = n[start:start + width] >= 10
        if ok.any():
            rows.append({"positions": f"{start}-{start + width - 1}", "first": start,
                         "mean k1": float(s[start:start + width][ok].sum() / n[start:start + width][ok].sum()),
                         "trajectories": int(n[start:start + width][ok].min())})
    return pd.DataFrame(rows, columns=["positions", "first", "mean k1", "trajectories"])


def plot_attribution(study: dict, terms=("reward", "kl_reward", "kl_k3"), against: str = "stage", title: str = ""):
    """|g_attempt| / |g_<against>| of every trajectory against its attempt length (log-log), one panel per term,
    with the fitted slope and its interval in the legend."""
    import matplotlib.pyplot as plt
    import numpy as np

    _study("study", study, ("fits", "trajectories"))
    v.choice("against", against, ("decision", "stage"))
    fig, axes = plt.subplots(1, len(terms), figsize=(4 * len(terms), 3.4), squeeze=False)
    for ax, term in zip(axes[0], terms):
        pts = [(r["L"], r["grad"][term]["attempt"] / r["grad"][term][against]) for r in study["trajectories"]
               if r["grad"].get(term) and carries(r["grad"][term], against)]
        f = study["fits"].get(f"{term} / {against}")
        if pts:
            x, y = np.array(pts).T
            ax.scatter(x, y, s=8, alpha=0.5)
            if f and f["slope"] is not None:
                xs = np.linspace(np.log(x.min()), np.log(x.max()), 20)
                c = np.mean(np.log(y)) - f["slope"] * np.mean(np.log(x))
                ax.plot(np.exp(xs), np.exp(c + f["slope"] * xs), "k-",
                        label=f"slope {f['slope']:.2f} [{f['ci'][0]:.2f}, {f['ci'][1]:.2f}]")
                ax.legend(fontsize=8)
        ax.set(xscale="log", yscale="log", xlabel="attempt length L (tokens)",
               ylabel=f"|g_attempt| / |g_{against}|", title=f"{title} {term}".strip())
    fig.tight_layout()
    return fig


def grad_by_level(study: dict, term: str) -> pd.DataFrame:
    """Per level (ladder order): the median attempt length and the median |g_attempt| and |g_decision| of the
    objective ``term`` over the level's trajectories: how much of a length-law slope fitted across levels is the
    length's, and how much the level's own."""
    terms = sorted({k for t in _study("study", study, ("trajectories",))["trajectories"] for k in t.get("grad", {})})
    v.choice("term", term, terms)
    df = pd.DataFrame([{"level": t["level"], "L": t["L"], "|g_attempt|": t["grad"][term]["attempt"],
                        "|g_decision|": t["grad"][term]["decision"]}
                       for t in study["trajectories"] if t["grad"].get(term)])
    return df.groupby("level").median().loc[_levels_sorted(df)]


def plot_slopes(groups: dict, terms=("kl_immediate", "kl_k3", "kl_reward", "reward"), against: str = "decision"):
    """The length law's slopes with their 95 % intervals, one panel per term, one row per study of each group
    (``{group label: {study name: study}}``, e.g. the laptop stages and the laptop-wide stages), with the prediction
    and the band of the verdict rule (:data:`dsh.measure.length_law.TOLERANCE`) shaded."""
    import matplotlib.pyplot as plt

    if not isinstance(groups, dict) or not groups:
        raise ValueError("groups must map group labels to {study name: study record}")
    for g, studies in groups.items():
        _studies(f"groups[{g!r}]", studies)
    v.choice("against", against, ("decision", "stage"))
    names = [(g, n) for g, studies in groups.items() for n in studies]
    fig, axes = plt.subplots(1, len(terms), figsize=(3.3 * len(terms), 0.32 * len(names) + 1.4), sharey=True,
                             squeeze=False)
    colours = dict(zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, term in zip(axes[0], terms):
        want = PREDICTED_SLOPE.get(term)
        if want is not None:
            ax.axvspan(want - TOLERANCE, want + TOLERANCE, color="0.9", zorder=0)
            ax.axvline(want, color="0.5", lw=1, zorder=0)
        for y, (g, n) in enumerate(names):
            f = groups[g][n]["fits"].get(f"{term} / {against}")
            if f and f["slope"] is not None:
                ax.errorbar(f["slope"], y, xerr=[[f["slope"] - f["ci"][0]], [f["ci"][1] - f["slope"]]], fmt="o",
                            color=colours[g], ms=4, capsize=2)
        ax.set(title=term, xlabel="log-log slope")
    axes[0][0].set_yticks(range(len(names)), [f"{g}: {n}" for g, n in names], fontsize=8)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"|g_attempt| / |g_{against}| against the attempt length L: slopes with 95 % intervals "
                 f"(shaded: the prediction +-{TOLERANCE:g})", fontsize=10)
    fig.tight_layout()
    return fig


def attempt_lengths(studies: dict) -> pd.DataFrame:
    """Median attempt length (tokens) per level of each study's own trajectories, and the span of those medians
    (longest / shortest): the range of L the length law is fitted over, free of a few outlying attempts."""
    rows = {}
    for name, s in _studies("studies", studies, ("trajectories",)).items():
        if not s["trajectories"]:
            continue
        df = pd.DataFrame([{"level": t["level"], "L": t["L"]} for t in s["trajectories"]])
        med = df.groupby("level")["L"].median()
        rows[name] = {**med.to_dict(), "span of medians": med.max() / med.min(),
                      "span of all": df.L.max() / df.L.min()}
    out = pd.DataFrame(rows).T
    levels = sorted((c for c in out.columns if not c.startswith("span")), key=level_index)   # 1x10 after 1x9
    return out[levels + [c for c in out.columns if c.startswith("span")]]


def kl_by_level(study: dict) -> pd.DataFrame:
    """The immediate KL of Theorem 3.2 against the study's reference, per level (ladder order): the median over the
    level's trajectories of the k1 sum of the attempt tokens and of the decision tokens, and the trajectories."""
    df = pd.DataFrame([{"level": t["level"], "attempt k1": t["kl"]["attempt"], "decision k1": t["kl"]["decision"]}
                       for t in _study("study", study, ("trajectories",))["trajectories"]])
    out = df.groupby("level").agg(**{"attempt k1": ("attempt k1", "median"),
                                     "decision k1": ("decision k1", "median"),
                                     "trajectories": ("attempt k1", "size")})
    return out.loc[_levels_sorted(df)]


def graded_design_tables(design: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The graded experiment's design table (``book/results/laptop-graded/design/graded_design.json``): one row per
    SFT (reflection) candidate and design round (the round, the new-token limit, slip rate, fine-tuning levels, the
    base's lowest accuracy, p_s per level, the graded levels and those outside the fine-tuning levels, the check
    probe's lowest agreement and kappa on them, the share truncated, the expected share of mixed-reward groups, the
    rule's points met, chosen or not) and one per GRPO candidate (learning rate, mixed groups in the first fifth, the
    reward's rise with its 95 % interval)."""
    if not isinstance(design, dict) or "sft_candidates" not in design:
        raise ValueError("design must be graded_design.json's contents (a dict with sft_candidates)")
    choice = design.get("sft_choice") or {}
    rows = []
    rounds = [(1, e) for e in design["sft_candidates"].values()] + [(2, e) for e in (design.get("round2") or {}).values()]
    for rnd, e in rounds:
        j, lv = e["judged"], e["levels"]
        probe = [(lv[x]["probe_agreement"], lv[x]["probe_kappa"]) for x in j["graded"]]
        rows.append({"round": rnd, "new tokens": e.get("max_new_tokens", 768), "slip rate": e["slip_rate"],
                     "fine-tuning levels": e["ft"] + ": " + ", ".join(
                         x for x in e["ft_levels"] if x.startswith("1x")),
                     "base: lowest accuracy": round(min(e["base_accuracy"].values()), 2),
                     "p_s by level": " ".join(f"{lv[x]['p_s']:.2f}" for x in lv),
                     "graded (outside)": f"{len(j['graded'])} ({len(j['graded_outside'])})",
                     "probe on graded: agreement / kappa": (
                         f"{min(a for a, _ in probe):.2f} / {min(k for _, k in probe):.2f}" if probe else "-"),
                     "truncated": round(e["truncated"], 3), "mixed groups (expected)": round(j["expected_mixed_groups"], 2),
                     "points met": ", ".join(k.split("_")[0] for k, x in j["points"].items() if x) or "none",
                     "chosen": (choice.get("slip_rate"), choice.get("ft"), choice.get("round", 1)) ==
                               (e["slip_rate"], e["ft"], rnd)})
    grpo = []
    pick = design.get("grpo_choice") or {}
    for e in (design.get("grpo_candidates") or {}).values():
        lo, hi = e["reward_rise_ci"]
        grpo.append({"learning rate": e["lr"], "rounds": e["rounds"],
                     "mixed groups, first fifth": round(e["mixed_first_fifth"], 2),
                     "reward first / last fifth": f"{e['reward_first']:.3f} / {e['reward_last']:.3f}",
                     "rise (95 % interval)": f"{e['reward_rise']:+.3f} ({lo:+.3f}, {hi:+.3f})",
                     "qualifies": e["qualifies"], "chosen": pick.get("lr") == e["lr"]})
    return pd.DataFrame(rows), pd.DataFrame(grpo)


def _ci(x) -> str:
    lo, hi = x["ci"]
    return "-" if x.get("slope") is None or lo is None else f"{x['slope']:+.2f} ({lo:+.2f}, {hi:+.2f})"


def baseline_table(studies: dict, terms=("kl_immediate", "kl_k3", "kl_reward"), n_boot: int = 400) -> pd.DataFrame:
    """Theorem 3.2 in each study, read as its predictions are made: per study and KL term, the fit's own span (the
    per-level median L of the levels it uses), the plain slope (silent decisions left out) and the censoring-robust
    one (per-level medians, silent = +inf: :func:`dsh.experiment.attribution_study.robust_fit`) with their verdicts
    against 1, and the slope in excess of the SFT loss's on the same trajectories (the balanced-weight baseline:
    :func:`dsh.experiment.attribution_study.excess_fit`; none for the immediate KL, not a gradient); and per study the
    Theorem 3.1 identity (:func:`dsh.experiment.attribution_study.reward_identity`)."""
    rows = []
    for name, st in _studies("studies", studies, ("trajectories", "fits")).items():
        ident = reward_identity(st)
        for term in terms:
            plain = st["fits"].get(f"{term} / decision") or {}
            if not plain.get("n"):
                continue
            r = robust_fit(st, term, n_boot=n_boot)
            ex = excess_fit(st, term, n_boot=n_boot) if term != "kl_immediate" else None
            rows.append({"study": name, "term": term, "own span": None if r["span"] is None else round(r["span"], 1),
                         "plain slope (95 %)": _ci(plain), "plain": plain.get("verdict"),
                         "robust slope (95 %)": _ci(r), "robust": r["verdict"],
                         "silent": f"{r['silent']} of {r['n']}", "excess over SFT (95 %)": _ci(ex) if ex else "-",
                         "Theorem 3.1 identity": f"{ident['trajectories']} trajectories, {ident['violations']} off"})
    return pd.DataFrame(rows)


def premise_table(by_level: dict) -> pd.DataFrame:
    """Theorem 3.2's premise per study and level: the decision's and the attempt's median per-token k1 with 95 %
    intervals, from ``{study: dsh.experiment.attribution_study.decision_kl_by_level(study)}``."""
    if not isinstance(by_level, dict):
        raise ValueError("by_level must map study names to decision_kl_by_level's result")
    rows = []
    fmt = lambda m: "-" if m["median"] is None else f"{m['median']:+.4f} ({m['ci'][0]:+.4f}, {m['ci'][1]:+.4f})"  # noqa: E731
    for name, levels in by_level.items():
        for lv, x in levels.items():
            rows.append({"study": name, "level": lv, "trajectories": x["n"], "decision k1 per token": fmt(x["decision"]),
                         "attempt k1 per token": fmt(x["attempt"])})
    return pd.DataFrame(rows)
