"""Verdicts on the paper's claims (:mod:`dsh.measure.claims`) from a results folder: the headline sentences, the
claims per seed, per level and level-stratified, the sampling check of a GRPO stage, and whether reflection pays
(p(F->T) per level)."""

from __future__ import annotations

import pandas as pd

from ...measure.calibration import wilson_interval
from ...measure.claims import block, verdicts
from ..run.pipeline import plan_of
from ..run.presets import stage_label
from .frame import TABLE1_KINDS, calibration_by_kind, first_wrong, kinds_in, long_table, results_first, seeds_of
from .training import delta_table, kl_table


@results_first
def headline(results: dict, beyond=None) -> list[str]:
    """Plain sentences for a chapter, computed from the results (so the text follows the data whichever way it
    falls): each Table 1 kind's accuracy pooled over levels (and over ``beyond``, e.g. the levels past the
    fine-tuning data), RL's changes of p_s and p_dW from its SFT (reflection), and the KL ablation's trend."""
    out = []
    df = long_table(results)
    for kind in kinds_in(results, TABLE1_KINDS):
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


def _verdicts(verdicts) -> list:
    """``verdicts`` checked to be :func:`claims`' list (dicts with claim, verdict and evidence)."""
    if not isinstance(verdicts, list) or not all(isinstance(c, dict) and {"claim", "verdict", "evidence"} <= set(c)
                                                 for c in verdicts):
        raise ValueError("verdicts must be the list claims() returns (dicts with claim, verdict and evidence)")
    return verdicts


@results_first
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


@results_first
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


@results_first
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


@results_first
def recovery_table(results: dict, kinds=("sft_reflection", "rl")) -> pd.DataFrame:
    """Does reflection pay? Per stage kind, seed and level: the responses whose first attempt is wrong, the
    resamples that follow a wrong answer (F->T + F->F) and p(F->T), the share of them whose next answer is right,
    with its 95 % Wilson interval (with several samples a question, the calibration's: resamples of one question
    count less); and p(T->F), the share of resamples after a right answer that give a wrong one."""
    rows = []
    for x in plan_of(results):
        if x["kind"] not in kinds:
            continue
        for lv, e in block(results["calibration"][x["name"]])["by_level"].items():
            t = e["transitions"]
            wrong, right = t["F->T"] + t["F->F"], t["T->T"] + t["T->F"]
            lo, hi = t.get("p(F->T)_ci") or wilson_interval(t["F->T"], wrong)
            rows.append({"kind": x["kind"], "seed": x["seed"], "level": lv, "p_s": e.get("p_s"),
                         "wrong first attempts": first_wrong(e), "resamples after a wrong answer": wrong,
                         "F->T": t["F->T"],
                         "p(F->T)": t["F->T"] / wrong if wrong else None,
                         "p(F->T) 95%": f"({lo:.2f}, {hi:.2f})" if wrong else "-",
                         "T->F": t["T->F"], "p(T->F)": t["T->F"] / right if right else None})
    return pd.DataFrame(rows)


@results_first
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
