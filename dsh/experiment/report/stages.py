"""Tables and figures of the trained stages: Table 1 beside the paper's (dsh/core/paper_results.yaml, labelled as the
paper's), the calibration figure, echo, faithfulness, reflection, the check probe, the design and truncation tables,
and the preset's stages and configurations."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...core import validate as v
from ...core.agreement import cohen_kappa
from ...core.files import read_json, read_jsonl
from ...core.paper import paper_results
from ...measure import tasks
from ...measure.calibration import normal_interval, wilson_interval
from ...measure.stage import preferred
from ...task import laptop_task
from ...task.problems import level_index
from ..run.pipeline import design_checks, load_results, plan, plan_of
from ..run.presets import get
from .frame import fmt_interval, kinds_in, levels_sorted, long_table, recorded_label, results_first, row_label


def table1(results: dict, kinds=None) -> pd.DataFrame:
    """Accuracy (%) by stage kind and level as ``acc (low, high) n=N``, the paper's 95 % normal-approximation
    interval; a kind run over several seeds pools them (acc: correct answers over all N responses of its seeds, the
    interval over those N, as independent responses: several samples of one question count less) and adds the range
    over seeds, ``[min-max]``: the interval says how well the questions pin the seeds' pooled accuracy down, the
    range how much training seeds differ."""
    df = long_table(results)
    out = {}
    for kind in kinds_in(results, kinds):
        d, row = df[df.kind == kind], {}
        for lv in levels_sorted(d):
            x = d[d.level == lv]
            if len(x) == 1:
                r = x.iloc[0]
                row[lv] = fmt_interval(r.accuracy, r.ci_low, r.ci_high) + f" n={r.n}"
            else:
                n, k = int(x.n.sum()), int((x.accuracy * x.n).round().sum())
                row[lv] = (fmt_interval(k / n, *normal_interval(k, n, effective=float(x.n_effective.sum())))
                           + f" [{100 * x.accuracy.min():.0f}-{100 * x.accuracy.max():.0f}] n={n}")
        out[row_label(df, kind)] = row
    return pd.DataFrame(out).T


@results_first
def mean_by_stage(results: dict, kinds, key: str) -> pd.DataFrame:
    """The mean over seeds of one column of :func:`long_table` by stage kind (rows) and level (columns)."""
    df = long_table(results)
    df = df[df.kind.isin(kinds)]
    return (df.groupby(["kind", "level"])[key].mean().unstack("level")
            .reindex(index=[k for k in kinds if k in set(df.kind)], columns=levels_sorted(df)))


def paper_table1() -> pd.DataFrame:
    """The paper's Table 1 (Qwen2.5-7B-Instruct), as printed."""
    t = paper_results()["table1"]
    rows = {}
    for name, r in t["models"].items():
        rows[name] = {lv: f"{a:.1f} ({lo:.1f}, {hi:.1f})" for lv, a, (lo, hi) in zip(t["levels"], r["accuracy"], r["ci"])}
    return pd.DataFrame(rows).T


@results_first
def calibration_frame(results: dict, stage: str, drop_truncated: bool = True) -> pd.DataFrame:
    """p_s, p_dC, p_dW, observed and predicted accuracy (with intervals) by level for one stage."""
    c = results["calibration"][stage]
    block = (preferred(c) if drop_truncated else c["all"])["by_level"]
    keys = ["n", "p_s", "p_d_given_correct", "p_d_given_wrong", "observed_accuracy", "predicted_accuracy",
            "predicted_ci_low", "predicted_ci_high", "no_answer"]
    return pd.DataFrame({lv: {k: s[k] for k in keys} for lv, s in block.items()}).T


@results_first
def plot_calibration(results: dict, kinds=("rl", "sft_reflection")):
    """The paper's Figure 3 per stage kind, without the truncated responses: p_s, p_dC, p_dW and observed vs
    predicted accuracy by level; lines are means over seeds with each seed a faint dot, a single stage's predicted
    accuracy with its bootstrap 95 % band."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = long_table(results, drop_truncated=True)
    kinds = kinds_in(results, kinds)
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.8 * len(kinds), 3.9), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        d = df[df.kind == kind]
        levels = levels_sorted(d)
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
        ax.set(xticks=x, xticklabels=levels, ylim=(-0.03, 1.03), title=row_label(df, kind))
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


@results_first
def echo_table(results: dict) -> pd.DataFrame:
    """F->T and T->F counts and rates per stage (the 'echo chamber', Kang et al. 2025)."""
    rows = {}
    for x in plan_of(results):
        t = results["calibration"][x["name"]]["all"]["overall"]["transitions"]
        rows[recorded_label(results, x["name"])] = {
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


@results_first
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
    for kind in kinds_in(results, kinds):
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
        rows[row_label(df, kind)] = row
    return pd.DataFrame(rows).T


def _pooled_p_s(cal: dict, levels):
    """p_s of a stage's calibration pooled over ``levels``: first attempts right over responses with an answer."""
    by = cal["all"]["by_level"]
    n = [by[lv]["n"] - (by[lv].get("no_answer") or 0) for lv in levels if lv in by]
    ps = [by[lv]["p_s"] for lv in levels if lv in by]
    return sum(a * b for a, b in zip(n, ps) if b is not None) / sum(n) if sum(n) else None


@results_first
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


@results_first
def probe_table(results: dict, kinds=None, group: str = "tuned") -> pd.DataFrame:
    """The check probe (:mod:`dsh.experiment.run.check_probe`) per stage of ``kinds`` and per seed, pooled over the
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

    for kind in kinds_in(results, kinds):
        mine = [x for x in plan_of(results) if x["kind"] == kind and x["name"] in probe]
        for x in mine:
            b = probe[x["name"]][group]
            r = row(x["name"], kind, x["seed"], [b])
            r["marker after fails"] = b.get("resample_after_fail")
            rows.append(r)
        if len(mine) > 1:
            rows.append(row(f"{kind} (seeds pooled)", kind, "pooled", [probe[x["name"]][group] for x in mine]))
    return pd.DataFrame(rows)


@results_first
def design_table(results: dict) -> pd.DataFrame:
    """The design goals of the small-scale analogue (dsh.experiment.run.pipeline.design_checks) and whether the run met them."""
    d = results["summary"].get("design") or design_checks(results)
    return pd.DataFrame({"met": {k: ("cannot tell" if x is None else ("yes" if x else "no"))
                                 for k, x in d["goals"].items()}})


@results_first
def truncation_table(results: dict) -> pd.DataFrame:
    """Budget and truncation per stage: training examples over max_length (SFT), rollouts clipped at
    max_completion_length (GRPO, mean and first step) and evaluation responses cut at max_new_tokens."""
    s = results["summary"]
    rows = {}
    for stage, t in (s.get("truncation") or {}).items():
        tr = t.get("train") or {}
        rows[recorded_label(results, stage)] = {
            "training budget": tr.get("limit"),
            "training cut": tr.get("rate", tr.get("clipped_rate")),
            "GRPO clipped at step 1": tr.get("clipped_rate_first"),
            "evaluation budget": s["eval"]["max_new_tokens"], "evaluation cut": t.get("eval")}
    return pd.DataFrame(rows).T


def stage_table(preset, seeds=None, ablation_seeds=None) -> pd.DataFrame:
    """The stages of ``preset``'s pipeline (a name or a :class:`dsh.experiment.run.presets.Preset`, over ``seeds``):
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


def first_check_table(results_dir, kinds=("sft_reflection", "rl")) -> pd.DataFrame:
    """How often pi_d has a check to read after the first attempt, in a laptop results folder: per stage of
    ``kinds`` (all with None) and level, the share of answered responses whose first answer is followed at once by
    its check (:func:`dsh.task.laptop_task.first_checked`, read from ``generations/<stage>.jsonl.gz``); columns the
    levels and ``overall``, with the stage's kind and seed, its answered responses and the overall share's Wilson
    95 % interval (``overall low``, ``overall high``; responses taken as independent, though a question asked twice
    gives two: a little narrow)."""
    if not isinstance(results_dir, (str, Path)):
        raise ValueError(f"results_dir must be a laptop results folder path, got {results_dir!r}")
    summary = Path(results_dir) / "summary.json"
    task = read_json(summary).get("task") if summary.is_file() else "laptop_task"   # no summary: load_results says
    if task != "laptop_task":
        raise ValueError(f"results_dir must hold the laptop task's results; {results_dir} holds task {task!r}")
    results = load_results(results_dir)
    rows = []
    for x in plan_of(results):
        if kinds is not None and x["kind"] not in kinds:
            continue
        recs = read_jsonl(Path(results_dir) / "generations" / f"{x['name']}.jsonl.gz", what="results_dir")
        got = laptop_task.first_checked(recs)
        rows.append({"stage": x["name"], "kind": x["kind"], "seed": x["seed"],
                     **{lv: got[lv]["share"] for lv in sorted(set(got) - {"overall"}, key=level_index)},
                     "overall": got["overall"]["share"], "answered": got["overall"]["answered"]})
        rows[-1]["overall low"], rows[-1]["overall high"] = wilson_interval(got["overall"]["checked"],
                                                                            got["overall"]["answered"])
    return pd.DataFrame(rows)


def plot_first_checks(table: pd.DataFrame, tuned=()):
    """:func:`first_check_table` as a figure: per stage kind, the share of responses whose first answer is checked,
    by level (the mean over seeds as a line, each seed a faint dot); the levels in ``tuned`` (the fine-tuning levels)
    marked on the axis."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not isinstance(table, pd.DataFrame) or not {"kind", "seed", "overall"} <= set(table.columns):
        raise ValueError("table must be report.first_check_table's result (a DataFrame with kind, seed and overall)")
    levels = [c for c in table.columns if c[:1].isdigit() and "x" in c]
    x = np.arange(len(levels))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for kind, d in table.groupby("kind", sort=False):
        line, = ax.plot(x, d[levels].mean().values, marker="o", label=kind)
        for _, r in d.iterrows():
            ax.plot(x, r[levels].values.astype(float), "o", color=line.get_color(), alpha=0.3, ms=4)
    ax.set(xticks=x, xticklabels=[f"{lv}*" if lv in tuned else lv for lv in levels], ylim=(-0.03, 1.03),
           ylabel="first answer checked", xlabel="level (* fine-tuning level)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
