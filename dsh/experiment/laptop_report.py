"""Tables, figures and verdicts from a laptop results folder (:mod:`dsh.experiment.laptop_pipeline`): the analogue of the
paper's Table 1 with intervals and the spread over seeds, the calibration figure, transitions, decision
faithfulness, the verdicts on claims (i)-(iii) per seed and level, and the two ablations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from ..core.files import read_jsonl
from ..task import laptop_task as lt
from ..task.arithmetic import multiplicand_multiplier
from ..task.parse import operands
from .presets import STAGE_LABELS
from .report import claims

LABELS = {**STAGE_LABELS, "sft_verdict": "SFT (reflection, verdict-only checks)",
          "rl_verdict": "RL from verdict-only SFT"}
TABLE1_STAGES = ("base", "sft", "sft_reflection", "rl", "dft")


def load(results_dir) -> dict:
    """``{"summary": ..., "jobs": {name: job json}}`` of a results folder written by ``run_laptop``."""
    root = Path(results_dir)
    if not (root / "summary.json").is_file():
        raise ValueError(f"results_dir must be a folder written by dsh pipeline --preset laptop; "
                         f"{root}/summary.json not found")
    summary = json.loads((root / "summary.json").read_text())
    jobs = {j["name"]: json.loads((root / f"{j['name']}.json").read_text()) for j in summary["jobs"]
            if (root / f"{j['name']}.json").is_file()}
    return {"summary": summary, "jobs": jobs}


def _levels(job: dict) -> dict:
    return job["calibration"]["all"]["by_level"]


def stage_jobs(res: dict, stage: str) -> list[dict]:
    return [j for j in res["jobs"].values() if j["job"]["stage"] == stage]


def long_table(res: dict) -> pd.DataFrame:
    """One row per job and level: accuracy with its 95 % interval, p_s, p_dC, p_dW (bootstrap intervals),
    predicted accuracy, transitions and the share of truncated responses."""
    rows = []
    for name, j in res["jobs"].items():
        for lv, s in _levels(j).items():
            t = s["transitions"]
            rows.append({"job": name, "stage": j["job"]["stage"], "seed": j["job"]["seed"], "level": lv,
                         "n": s["n"], "accuracy": s["observed_accuracy"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
                         "p_s": s["p_s"], "p_s_ci": s.get("p_s_ci"), "p_dC": s["p_d_given_correct"],
                         "p_dC_ci": s.get("p_d_given_correct_ci"), "p_dW": s["p_d_given_wrong"],
                         "p_dW_ci": s.get("p_d_given_wrong_ci"), "predicted": s["predicted_accuracy"],
                         "predicted_low": s["predicted_ci_low"], "predicted_high": s["predicted_ci_high"],
                         "F->T": t["F->T"], "T->F": t["T->F"], "p(F->T)": t["p(F->T)"], "p(T->F)": t["p(T->F)"],
                         "no_answer": s["no_answer"]})
    return pd.DataFrame(rows)


def table1(res: dict, stages=TABLE1_STAGES) -> pd.DataFrame:
    """Accuracy (%) by stage and level: the mean over seeds, the range over seeds and each seed's 95 % interval
    half-width (n questions a level), as ``mean [min, max] +-hw``."""
    df = long_table(res)
    out = {}
    for st in stages:
        d = df[df.stage == st]
        if d.empty:
            continue
        row = {}
        for lv in lt.TEST_LEVELS:
            x = d[d.level == lv]
            if x.empty:
                continue
            hw = float(((x.ci_high - x.ci_low) / 2).mean())
            row[lv] = (f"{100 * x.accuracy.mean():.1f} [{100 * x.accuracy.min():.0f}, {100 * x.accuracy.max():.0f}]"
                       f" ±{100 * hw:.0f}")
        out[f"{LABELS[st]} ({d.seed.nunique()} seed{'s' if d.seed.nunique() > 1 else ''})"] = row
    return pd.DataFrame(out).T


def mean_by_stage(res: dict, stages, key: str) -> pd.DataFrame:
    """The mean over seeds of one column of :func:`long_table` by stage (rows) and level (columns)."""
    df = long_table(res)
    df = df[df.stage.isin(stages)]
    return (df.groupby(["stage", "level"])[key].mean().unstack("level")
            .reindex(index=[s for s in stages if s in set(df.stage)], columns=list(lt.TEST_LEVELS)))


def plot_calibration(res: dict, stages=("sft_reflection", "rl", "dft")):
    """The paper's Figure 3 per stage: p_s, p_dC, p_dW and observed vs predicted accuracy by level; lines are
    means over seeds, dots the seeds."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = long_table(res)
    stages = [s for s in stages if s in set(df.stage)]
    fig, axes = plt.subplots(1, len(stages), figsize=(4.6 * len(stages), 3.8), squeeze=False, sharey=True)
    x = np.arange(len(lt.TEST_LEVELS))
    for ax, st in zip(axes[0], stages):
        d = df[df.stage == st]
        for key, lab, mk in (("p_s", "$p_s$", "o"), ("p_dC", "$p_{d|C}$", "s"), ("p_dW", "$p_{d|W}$", "^"),
                             ("accuracy", "observed accuracy", "*"), ("predicted", "predicted accuracy", "x")):
            m = d.groupby("level")[key].mean().reindex(lt.TEST_LEVELS)
            ls = "--" if key == "predicted" else "-"
            line, = ax.plot(x, m.values, ls, marker=mk, label=lab)
            for _, r in d.iterrows():
                if r[key] is not None and r[key] == r[key]:
                    ax.plot(lt.TEST_LEVELS.index(r.level), r[key], mk, color=line.get_color(), alpha=0.3, ms=4)
        ax.set_xticks(x, lt.TEST_LEVELS)
        ax.set_title(LABELS[st], fontsize=10)
        ax.set_xlabel("level (fine-tuning trains on 1x2 ... 1x5)")
        ax.set_ylim(-0.03, 1.03)
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def faithfulness_table(res: dict, stages=("sft_reflection", "rl", "dft", "sft_verdict", "rl_verdict")) -> pd.DataFrame:
    """Decision faithfulness (:func:`dsh.task.laptop_task.faithfulness`), mean over seeds, on the fine-tuning levels
    (1x2 ... 1x5) and beyond them (1x6 ... 1x8)."""
    rows = {}
    for st in stages:
        js = stage_jobs(res, st)
        if not js:
            continue
        row = {}
        for part, lvs in (("train levels", ("1x2", "1x3", "1x4", "1x5")), ("beyond", ("1x6", "1x7", "1x8"))):
            for key in ("verdict_follows_check", "check_exact", "verdict_right", "resample_after_fail"):
                vals = []
                for j in js:
                    f = j["laptop_faithfulness"]
                    n = sum(f.get(lv, {}).get("checks", 0) for lv in lvs)
                    if n and all(f.get(lv, {}).get(key) is not None for lv in lvs if f.get(lv, {}).get("checks")):
                        w = [(f[lv]["checks"], f[lv][key]) for lv in lvs if f.get(lv, {}).get("checks")]
                        if all(v is not None for _, v in w):
                            vals.append(sum(c * v for c, v in w) / sum(c for c, _ in w))
                row[(part, key)] = round(sum(vals) / len(vals), 3) if vals else None
        rows[LABELS[st]] = row
    return pd.DataFrame(rows).T


def claims_by_seed(res: dict) -> pd.DataFrame:
    """The verdicts of :func:`dsh.experiment.report.claims` on each seed's SFT (reflection) and RL, one row per claim and seed."""
    rows = []
    for s in sorted({j["job"]["seed"] for j in stage_jobs(res, "rl")}):
        cal = {}
        for st in ("sft_reflection", "rl"):
            j = res["jobs"].get(f"{st}-s{s}")
            if j:
                cal[st] = j["calibration"]
        for c in claims({"calibration": cal}):
            per = c.get("per_level") or []
            rows.append({"seed": s, "claim": c["claim"], "verdict": c["verdict"],
                         "per level": ", ".join(f"{r['level']}: {r['verdict']}" for r in per) or "-",
                         "evidence": c["evidence"]})
    return pd.DataFrame(rows)


def _overall(job: dict) -> dict:
    return job["calibration"]["all"]["overall"]


def delta_table(res: dict, pairs) -> pd.DataFrame:
    """For (label, job stage, init stage) pairs: the change of p_s, p_dC, p_dW and accuracy from the init job of
    the same seed (overall and on the levels beyond training), mean and range over seeds."""
    rows = []
    for label, stage, init in pairs:
        deltas = {}
        for j in stage_jobs(res, stage):
            s = j["job"]["seed"]
            i = res["jobs"].get(f"{init}-s{s}")
            if not i:
                continue
            a, b = _overall(j), _overall(i)
            for key, name in (("p_s", "Δp_s"), ("p_d_given_correct", "Δp_dC"), ("p_d_given_wrong", "Δp_dW"),
                              ("observed_accuracy", "Δaccuracy")):
                if a[key] is not None and b[key] is not None:
                    deltas.setdefault(name, []).append(a[key] - b[key])
        row = {"comparison": label, "seeds": len(next(iter(deltas.values()), []))}
        for name, xs in deltas.items():
            row[name] = f"{sum(xs) / len(xs):+.3f} [{min(xs):+.3f}, {max(xs):+.3f}]"
        rows.append(row)
    return pd.DataFrame(rows)


def kl_table(res: dict) -> pd.DataFrame:
    """The KL ablation: for each GRPO coefficient beta, the change from SFT (reflection) of p_s (pi_sample) and of
    p_dC, p_dW (pi_d), and the last logged KL."""
    stages = sorted({j["job"]["stage"] for j in res["jobs"].values() if j["job"]["stage"].startswith("rl_beta")},
                    key=lambda s: float(s[len("rl_beta"):]))
    pairs = [(f"beta = {s[len('rl_beta'):]}", s, "sft_reflection") for s in stages]
    df = delta_table(res, pairs)
    kl = []
    for _, s, _ in pairs:
        xs = [j["reward_curve"][-1].get("kl") for j in stage_jobs(res, s) if j.get("reward_curve")]
        xs = [x for x in xs if x is not None]
        kl.append(f"{sum(xs) / len(xs):.4f}" if xs else "-")
    if not df.empty:
        df["last KL"] = kl
    return df


def plot_reward_curves(res: dict, stages=("rl", "rl_verdict")):
    """GRPO's mean reward and its share of zero-variance groups per step, one line per job."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for j in res["jobs"].values():
        if j["job"]["stage"] not in stages or not j.get("reward_curve"):
            continue
        c = j["reward_curve"]
        steps = [r["step"] for r in c]
        axes[0].plot(steps, [r["reward"] for r in c], label=j["job"]["name"], alpha=0.8)
        axes[1].plot(steps, [r["frac_reward_zero_std"] for r in c], alpha=0.8)
    axes[0].set(xlabel="GRPO step", ylabel="mean reward of the rollouts")
    axes[1].set(xlabel="GRPO step", ylabel="groups with zero reward variance")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def timings_table(res: dict) -> pd.DataFrame:
    """Seconds per training and evaluation job, as recorded by the run (keys ``train_<job>``, ``evaluate_<job>``;
    runs before the pipeline's steps were shared wrote ``train <job>``)."""
    t = res["summary"]["timings_s"]
    rows = {}
    for k, s in t.items():
        what, job = re.split("[ _]", k, maxsplit=1)
        rows.setdefault(job, {})[what] = s
    return pd.DataFrame(rows).T


def as_pipeline_results(res: dict, seed: int = 0) -> dict:
    """One seed of a laptop run in the shape of :func:`dsh.experiment.pipeline.load_results` (stages base, sft,
    sft_reflection, rl, dft), so that :mod:`dsh.experiment.report`'s tables and claims read it."""
    cal, acc = {}, {}
    for st in TABLE1_STAGES:
        j = res["jobs"].get("base" if st == "base" else f"{st}-s{seed}")
        if j is None:
            continue
        cal[st] = j["calibration"]
        acc[st] = {lv: {k: s[k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                   for lv, s in _levels(j).items()}
    return {"summary": {"accuracy": acc, "stages": list(cal)}, "calibration": cal}


def headline(res: dict) -> list[str]:
    """Plain sentences for the chapter, computed from the results (so the text follows the data whichever way it
    falls): accuracy of each stage pooled over levels, RL's changes of p_s and p_dW, and the KL ablation's trend."""
    out = []
    df = long_table(res)

    def pooled(stage, key, levels=lt.TEST_LEVELS):
        d = df[(df.stage == stage) & df.level.isin(levels)]
        return float(d[key].mean()) if len(d) else None

    beyond = ("1x6", "1x7", "1x8")
    for st in TABLE1_STAGES:
        a, b = pooled(st, "accuracy"), pooled(st, "accuracy", beyond)
        if a is not None:
            out.append(f"{LABELS[st]}: mean accuracy {100 * a:.1f} % over the ladder, {100 * b:.1f} % on 1x6 ... 1x8.")
    d = delta_table(res, [("RL minus its SFT (reflection)", "rl", "sft_reflection")])
    if not d.empty and "Δp_s" in d:
        out.append(f"RL minus SFT (reflection), same seed, pooled over levels: Δp_s {d['Δp_s'][0]}, "
                   f"Δp_dC {d['Δp_dC'][0]}, Δp_dW {d['Δp_dW'][0]}, Δaccuracy {d['Δaccuracy'][0]} "
                   f"(mean [range] over {d['seeds'][0]} seeds).")
    kl = kl_table(res)
    if not kl.empty and "Δp_s" in kl:
        ps = [float(x.split(" ")[0]) for x in kl["Δp_s"]]
        pw = [float(x.split(" ")[0]) for x in kl["Δp_dW"]]
        out.append(f"KL ablation ({', '.join(kl.comparison)}): Δp_s {', '.join(f'{x:+.3f}' for x in ps)}; "
                   f"Δp_dW {', '.join(f'{x:+.3f}' for x in pw)}. From the smallest to the largest beta, p_s's change "
                   f"moves by {ps[-1] - ps[0]:+.3f} and p_dW's by {pw[-1] - pw[0]:+.3f} (one seed: no interval).")
    return out


def _checks(results_dir, job: str):
    """(response index, question, multiplicand, check) for every check in a job's generations
    (:func:`dsh.task.laptop_task.check_fidelity`)."""
    for i, r in enumerate(read_jsonl(Path(results_dir) / "generations" / f"{job}.jsonl.gz")):
        a, b = operands(r["question"])
        for c in lt.check_fidelity(a, b, r["response"]):
            yield i, r["question"], multiplicand_multiplier(a, b, "lean")[0], c


def unfaithful_examples(results_dir, job: str, n: int = 3) -> list[dict]:
    """Up to ``n`` checks from a job's generations whose verdict differs from the true check of the candidate
    (the first of each response): the question, the candidate, the check the model wrote and the true one."""
    out, last = [], None
    for i, q, _, c in _checks(results_dir, job):
        if c["verdict"] != c["true_check"] and i != last:
            out.append({"question": q, "candidate": c["candidate"], "written": c["written"], "true": c["true_text"]})
            last = i
            if len(out) >= n:
                break
    return out


_WRITTEN = re.compile(r"Check: (\d+): [^.]*\. (\d+)\*(\d+)>(\d+)\. (\d+): ")


def unfaithful_causes(results_dir, job: str) -> dict:
    """Why a job's verdicts miss the true check: of the checks whose verdict differs from the true check of the
    candidate, how many copied the candidate wrong into the check, how many copied the multiplicand wrong (and the
    candidate right), and how many copied both right (an arithmetic slip in the chain) or do not parse."""
    counts = {"checks": 0, "unfaithful": 0, "candidate miscopied": 0, "multiplicand miscopied": 0,
              "copied right (arithmetic)": 0, "unreadable": 0}
    for _, _, x, c in _checks(results_dir, job):
        counts["checks"] += 1
        if c["verdict"] == c["true_check"]:
            continue
        counts["unfaithful"] += 1
        w = _WRITTEN.match(c["written"])
        if not w:
            counts["unreadable"] += 1
        elif int(w.group(5)) != c["candidate"]:
            counts["candidate miscopied"] += 1
        elif int(w.group(1)) != x:
            counts["multiplicand miscopied"] += 1
        else:
            counts["copied right (arithmetic)"] += 1
    return counts
