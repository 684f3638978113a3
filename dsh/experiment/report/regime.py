"""The graded experiment's design points (:data:`REGIME_POINTS`) measured per training seed, the pipeline's run time
when it ran in pieces, a second reading of the same generations set against the calibrations, and the design
tables of the graded experiment."""

from __future__ import annotations

import statistics

import pandas as pd

from ...measure.claims import block, graded
from ...measure.trend import level_slope
from ...task.problems import parse_level
from ..run.pipeline import plan_of
from .frame import effective, first_wrong, reward_trend, seeds_of, signed_interval, validation_rise

REGIME_POINTS = {   # the points the graded experiment was built to meet (chapter 07), each per training seed
    "base": "the base answers >= 5 % right on every level",
    "graded": "SFT (reflection): p_s in 0.2-0.8 on >= 4 levels, >= 2 outside the fine-tuning levels",
    "falling": "SFT (reflection)'s p_s falls with the multiplicand's digits (slope's 95 % interval below 0)",
    "probe": "the check probe after SFT (reflection) gives agreement >= 0.9 and kappa >= 0.8 on its graded levels",
    "wrong first": "SFT (reflection) has >= 30 wrong first attempts on each of its graded levels",
    "mixed": "GRPO: >= 50 % of groups with mixed rewards in the first fifth of its rounds",
    "rise": "GRPO: the validation accuracy rises (at the end minus at step 0, Newcombe 95 % interval above 0)",
    "rollouts": "GRPO: >= 10,000 rollouts",
    "truncated": "no stage has more than 5 % of its evaluation responses at the token limit",
}


def regime_rows(results: dict) -> list[dict]:
    """Per training seed, what :data:`REGIME_POINTS` asks of the graded experiment, measured: the base's lowest
    per-level accuracy; SFT (reflection)'s graded levels (p_s in the band of :func:`dsh.measure.claims.graded`),
    those outside its fine-tuning levels, and the slope of its p_s on the multiplicand's digits with its interval
    (:func:`dsh.measure.trend.level_slope`); the check probe's lowest agreement and kappa on the graded levels and
    their fewest wrong first attempts; GRPO's share of mixed-reward groups in the first fifth of its rounds, the
    rise of its validation accuracy from step 0 to its last measurement (the point:
    :func:`dsh.experiment.report.frame.validation_rise`), the reward's last fifth minus its first
    (:func:`dsh.measure.trend.fifths_contrast`; shown, governing nothing) and its rollouts; the largest share of
    evaluation responses at the token limit over the seed's stages and the base. Each row says
    which points it meets (``met``: {point: bool, or None where the stage is missing})."""
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
                              [effective(e, "p_s", e["n"] - e["no_answer"]) for _, e in have])
            pb = [probe.get(sr, {}).get("by_level", {}).get(lv) or {} for lv in g]
            agree = [b.get("verdict_follows_check") for b in pb]
            kappa = [b.get("kappa") for b in pb]
            wrong = [first_wrong(levels[lv]) for lv in g]
            row.update({"SFT (reflection): graded levels": ", ".join(g) or "-", "outside fine-tuning": len(out),
                        "p_s slope per digit (95 %)": signed_interval(fit["slope"], fit["ci"]) if fit else "-",
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
            t, z = reward_trend(curve)
            v = validation_rise(rl, ((s.get("validation_curves") or {}).get(rl)))
            n = ((s.get("training") or {}).get(rl) or {}).get("rollouts")
            row.update({"GRPO: mixed groups, first fifth": round(1 - z["first"], 3) if z else None,
                        "validation accuracy rise (95 %)": signed_interval(v["delta"], v["ci"]) if v else "-",
                        "reward, last fifth - first (95 %)": signed_interval(t["delta"], t["ci"]) if t else "-",
                        "rollouts": n})
            met.update({"mixed": bool(z) and 1 - z["first"] >= 0.5, "rise": None if v is None else v["ci"][0] > 0,
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


def run_time(results: dict, studies: dict | None = None) -> dict:
    """How long a results folder's pipeline took, stage by stage, when it ran in several pieces (stopped and
    resumed: a reused step's time is 0 in the summary's ``timings_s``, and a training resumed from a checkpoint
    records only its last piece). Per stage: its method, the training's own wall time (``training[stage]["wall_s"]``)
    unless it was resumed, then the median of its method's stages trained in one piece (``estimated``); its
    evaluation and probe as timed (the median of the other stages' where reused: ``reused``). ``{"stages": [...],
    "total_s", "estimated": [stages], "reused": [stages]}`` (the base's own steps included, the base's training
    not: it is shipped). With ``studies`` (the folder's attribution studies, :func:`load_attribution`) also
    ``"studies"``: per study its own ``wall_s`` as its record holds it (a study reused from an earlier run counts at
    the time it took there: ``reused`` when the summary did not time it), ``"studies_s"`` their sum and
    ``"pipeline_s"`` = ``total_s`` + ``studies_s``: the whole pipeline but the base's training."""
    s = results["summary"]
    train, times = s.get("training") or {}, s.get("timings_s") or {}
    plan_ = plan_of(results)
    whole = {}
    for x in plan_:
        t = train.get(x["name"]) or {}
        if x.get("method") and t.get("wall_s") is not None and not t.get("resumed_from"):
            whole.setdefault(x["method"], []).append(t["wall_s"])
    steps = {k: [x for n, x in times.items() if n.startswith(k + "_") and x > 0] for k in ("evaluate", "probe")}
    rows, estimated, reused = [], [], []
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
        if not times.get(f"evaluate_{x['name']}"):
            reused.append(x["name"])
        rows.append(row)
    total = sum(r.get("train_s") or 0.0 for r in rows) + sum(r["evaluate_s"] + r["probe_s"] for r in rows)
    out = {"stages": rows, "total_s": round(total, 1), "estimated": estimated, "reused": reused}
    if studies is not None:
        if not isinstance(studies, dict) or not all(isinstance(x, dict) and isinstance(x.get("wall_s"), (int, float))
                                                    for x in studies.values()):
            raise ValueError("studies must map study names to attribution study records with wall_s "
                             "(report.load_attribution)")
        out["studies"] = [{"study": k, "wall_s": float(x["wall_s"]), "reused": not times.get(f"attribution_{k}")}
                          for k, x in studies.items()]
        out["studies_s"] = round(sum(x["wall_s"] for x in out["studies"]), 1)
        out["pipeline_s"] = round(total + out["studies_s"], 1)
    return out


def route_timing(routes: dict, studies_s: float | None = None) -> dict:
    """The attribution study's gradient routes timed against each other (``design/attribution_routes.json``: runs of
    one study alternating the packed route and one trajectory at a time): each route's median wall time, the ratio
    (one at a time / packed) and, given ``studies_s`` (the studies' recorded time, all formed one trajectory at a
    time), that time divided by the ratio: what they would take had every study gained as much."""
    runs = routes.get("runs") if isinstance(routes, dict) else None
    if not runs or not all(isinstance(r, dict) and isinstance(r.get("wall_s"), (int, float)) for r in runs):
        raise ValueError("routes must be an attribution_routes record with runs of route and wall_s")
    med = {k: statistics.median(r["wall_s"] for r in runs if r.get("route") == k) for k in ("packed", "per trajectory")
           if any(r.get("route") == k for r in runs)}
    if len(med) != 2:
        raise ValueError("routes must hold runs of both routes, packed and per trajectory")
    out = {"packed_s": med["packed"], "per_trajectory_s": med["per trajectory"],
           "ratio": med["per trajectory"] / med["packed"]}
    if studies_s is not None:
        out["studies_s_packed"] = studies_s / out["ratio"]
    return out


def restudy_table(restudy: dict) -> tuple[pd.DataFrame, dict]:
    """The committed attribution studies formed again by the packed route (``design/restudy.json``: per study the
    committed and the new wall time and ``against_committed``, the comparison of the two records), one row a study:
    both times in minutes and their ratio, rounds, how many trajectories are the same, the gradient norms' median
    and largest relative difference, how many fits keep their count and verdict and the largest slope difference.
    Also ``{"committed_s", "packed_s", "ratio", "same_trajectories": all studies', "fits_kept": all fits',
    "changed": [study / fit whose count or verdict moved], "max_slope_difference": {"group-summed reward": the
    largest over the ``reward_group`` fits, "other fits": over the rest}}`` (None where no slope compares)."""
    rows_in = restudy.get("studies") if isinstance(restudy, dict) else None
    need = {"study", "committed_wall_s", "wall_s", "rounds", "against_committed"}
    if not rows_in or not all(isinstance(r, dict) and need <= set(r) for r in rows_in):
        raise ValueError("restudy must be a restudy record: studies, each with study, committed_wall_s, wall_s, "
                         "rounds and against_committed")
    rows, changed, by_kind = [], [], {"group-summed reward": [], "other fits": []}
    for r in rows_in:
        c = r["against_committed"]
        fits = c["fits"]
        kept = [k for k, f in fits.items() if f["n"][0] == f["n"][1] and f["verdict"][0] == f["verdict"][1]]
        changed += [f"{r['study']} / {k}" for k in fits if k not in kept]
        moved = {k: abs(f["slope"][0] - f["slope"][1]) for k, f in fits.items()
                 if f["slope"][0] is not None and f["slope"][1] is not None}
        for k, x in moved.items():
            by_kind["group-summed reward" if k.startswith("reward_group") else "other fits"].append(x)
        slopes = list(moved.values())
        rows.append({"study": r["study"], "committed min": round(r["committed_wall_s"] / 60, 1),
                     "packed min": round(r["wall_s"] / 60, 1), "ratio": round(r["committed_wall_s"] / r["wall_s"], 2),
                     "rounds": f"{r['rounds'][0]} / {r['rounds'][1]}",
                     "same trajectories": f"{c['same_trajectories']} of {c['trajectories'][0]}",
                     "median |d norm| / norm": c["norm_rel_diff"]["median"],
                     "max |d norm| / norm": c["norm_rel_diff"]["max"],
                     "fits kept": f"{len(kept)} of {len(fits)}", "max |d slope|": max(slopes, default=None)})
    committed, packed = (sum(r[k] for r in rows_in) for k in ("committed_wall_s", "wall_s"))
    same = all(r["against_committed"]["same_trajectories"] == r["against_committed"]["trajectories"][0]
               == r["against_committed"]["trajectories"][1] for r in rows_in)
    return pd.DataFrame(rows), {"committed_s": committed, "packed_s": packed, "ratio": committed / packed,
                                "same_trajectories": same, "fits_kept": not changed, "changed": changed,
                                "max_slope_difference": {k: max(x, default=None) for k, x in by_kind.items()}}


def workers_table(record: dict) -> tuple[pd.DataFrame, dict]:
    """Two stages one after the other on two threads against side by side on one thread each
    (``design/two_workers.json``: trials of both layouts, each with its runs): one row a (trial, layout) with its
    wall time and its runs' generation, scoring and update seconds summed; also ``{"ratios": [per trial, one after
    the other / side by side], "slowdown": {part: one thread's seconds / two threads', summed over trials},
    "same_weights": whether each layout gave the same final weights in every trial, "weights_differ": whether the two
    layouts' weights differ}``."""
    trials = record.get("trials") if isinstance(record, dict) else None
    if not trials or not all(isinstance(t, dict) and {"trial", "layout", "wall_s", "runs"} <= set(t) for t in trials):
        raise ValueError("record must be a two_workers record: trials, each with trial, layout, wall_s and runs")
    parts = ("generation_s", "scoring_s", "update_s")
    rows = [{"trial": t["trial"], "layout": t["layout"], "wall_s": t["wall_s"],
             **{k: round(sum(r[k] for r in t["runs"]), 1) for k in parts}} for t in trials]
    layouts = sorted({t["layout"] for t in trials})
    if len(layouts) != 2:
        raise ValueError(f"record must hold two layouts, got {layouts}")
    seq = next(k for k in layouts if "after" in k)
    par = next(k for k in layouts if k != seq)
    by = {(t["trial"], t["layout"]): t for t in trials}
    ratios = [by[(i, seq)]["wall_s"] / by[(i, par)]["wall_s"] for i in sorted({t["trial"] for t in trials})
              if (i, seq) in by and (i, par) in by]
    slow = {k: sum(r[k] for r in rows if r["layout"] == par) / sum(r[k] for r in rows if r["layout"] == seq)
            for k in parts}
    weights = {k: {tuple(sorted((r["stage"], r["final_weights"]) for r in t["runs"])) for t in trials
                   if t["layout"] == k} for k in layouts}
    return pd.DataFrame(rows), {"ratios": ratios, "slowdown": slow,
                                "same_weights": all(len(w) == 1 for w in weights.values()),
                                "weights_differ": weights[seq].isdisjoint(weights[par])}


def pipeline_workers_table(record: dict, committed: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """The pipeline on one worker of two threads against two workers of one thread each
    (``design/pipeline_workers.json``: runs of both layouts, alternating, each with its wall time, its summary's
    schedule and its stages' final weights): one row a run with its wall time, its steps' time summed and the share
    of its workers' time they filled (steps' time / (workers x wall time)); also ``{"ratios": [per trial, one
    worker's wall time / two workers'], "same_weights": whether each layout gave the same weights in every trial,
    "weights_differ": whether the layouts' weights differ at every stage, "committed": whether the one-worker runs'
    weights are ``committed``'s (stage -> final weights digest; None without it)}``."""
    runs = record.get("runs") if isinstance(record, dict) else None
    keys = {"trial", "workers", "wall_s", "schedule", "final_weights"}
    if not runs or not all(isinstance(r, dict) and keys <= set(r) for r in runs):
        raise ValueError("record must be a pipeline_workers record: runs, each with " + ", ".join(sorted(keys)))
    if {r["workers"] for r in runs} != {1, 2}:
        raise ValueError(f"record must hold runs on 1 and 2 workers, got {sorted({r['workers'] for r in runs})}")
    rows = []
    for r in runs:
        busy = sum(x["end_s"] - x["start_s"] for x in r["schedule"])
        rows.append({"trial": r["trial"], "workers": r["workers"], "threads": r.get("threads"),
                     "wall_min": round(r["wall_s"] / 60, 2), "steps_min": round(busy / 60, 2),
                     "filled": round(busy / (r["workers"] * r["wall_s"]), 3), "load_before": r.get("load_before")})
    by = {(r["trial"], r["workers"]): r for r in runs}
    ratios = [by[(i, 1)]["wall_s"] / by[(i, 2)]["wall_s"] for i in sorted({r["trial"] for r in runs})
              if (i, 1) in by and (i, 2) in by]
    weights = {w: [r["final_weights"] for r in runs if r["workers"] == w] for w in (1, 2)}
    same = all(all(x == ws[0] for x in ws) for ws in weights.values())
    differ = all(weights[1][0][k] != weights[2][0].get(k) for k in weights[1][0])
    mine = None if committed is None else all(committed.get(k) == x for k, x in weights[1][0].items())
    return pd.DataFrame(rows), {"ratios": ratios, "same_weights": same, "weights_differ": differ, "committed": mine}


def workers_projection(took: dict, gains: dict) -> dict:
    """The pipeline's time on two workers, projected from its recorded times (``took``: :func:`run_time` with
    studies) and the throughput gains measured per kind of step (``gains``: ``grpo``, ``fine_tuning`` (the SFT, SFT
    (reflection) and DFT trainings with every evaluation job) and ``studies``, each one worker's time over two
    workers'): each kind's time divided by its gain. ``{"grpo_s", "fine_tuning_s", "studies_s", "pipeline_s"}``. An
    estimate: it leaves out the run's tail, where one worker may wait with nothing left to run."""
    if not isinstance(gains, dict) or set(gains) != {"grpo", "fine_tuning", "studies"} or not all(
            isinstance(x, (int, float)) and x > 0 for x in gains.values()):
        raise ValueError(f"gains must give a positive gain for grpo, fine_tuning and studies, got {gains!r}")
    if not isinstance(took, dict) or "studies_s" not in took:
        raise ValueError("took must be run_time(results, studies): the stages and the studies")
    rows = took["stages"]
    grpo = sum(r.get("train_s") or 0.0 for r in rows if r["method"] == "grpo")
    tune = sum((r.get("train_s") or 0.0) for r in rows if r["method"] not in (None, "grpo"))
    jobs = sum(r["evaluate_s"] + r["probe_s"] for r in rows)
    out = {"grpo_s": grpo / gains["grpo"], "fine_tuning_s": (tune + jobs) / gains["fine_tuning"],
           "studies_s": took["studies_s"] / gains["studies"]}
    out["pipeline_s"] = sum(out.values())
    return out


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


def round4_table(round4: dict) -> pd.DataFrame:
    """Round 4 of the graded design (``book/results/laptop-graded/design/round4.json``): the attempt budget K from
    the format (the longest 1x8 / 8x1 attempt block in tokens, the token limit) and the validation run under it (GRPO
    seed 0), one row per validation measurement (step, share at the token limit, share cut by the budget, p_s, p_dC,
    p_dW, accuracy) with the run's share of mixed-reward groups in its first fifth and the reward's rise (95 %
    interval) on the first row, and whether the round's rule holds there (every measurement <= 5 % at the limit,
    >= 50 % mixed)."""
    if not isinstance(round4, dict) or not {"budget", "validate"} <= set(round4):
        raise ValueError("round4 must be round4.json's contents (a dict with budget and validate)")
    b, v = round4["budget"], round4["validate"]
    holds = max(m["truncated"] for m in v["validation"]) <= 0.05 and v["mixed_first_fifth"] >= 0.5
    rows = []
    for i, m in enumerate(v["validation"]):
        first = i == 0
        rows.append({"K (limit // longest block)": f"{b['K']} ({b['token_limit']} // {b['longest_attempt_tokens']})"
                     if first else "", "step": m["step"], "at the token limit": m["truncated"],
                     "cut by the budget": m["capped"], "p_s": round(m["p_s"], 3),
                     "p_dC": round(m["p_d_given_correct"], 3), "p_dW": round(m["p_d_given_wrong"], 3),
                     "accuracy": round(m["observed_accuracy"], 3),
                     "mixed groups, first fifth": round(v["mixed_first_fifth"], 3) if first else None,
                     "reward rise (95 %)": signed_interval(v["reward_rise"], v["reward_rise_ci"]) if first else "",
                     "rule holds": holds if first else None})
    return pd.DataFrame(rows)


def round5_table(measured: dict) -> pd.DataFrame:
    """Round 5 of the graded design (``book/results/laptop-graded/design/update_precision.json``): GRPO seed 0 from
    SFT (reflection) seed 0 with the update's decoder products in bfloat16, then in float32, beside round 4's run of
    the same stage. One row each: its final weights' digest (short), the validation accuracy and p_s at step 0 and
    at the end, the most validation responses at the token limit, the share of mixed-reward groups in the first
    fifth, the update's and the whole run's seconds, and for bfloat16 whether round 5's rule holds there (every
    measurement <= 5 % at the limit, >= 50 % mixed)."""
    runs = (("bfloat16", "bfloat16"), ("float32", "float32"), ("round4_rl_s0", "round 4 (float32)"))
    if not isinstance(measured, dict) or not {k for k, _ in runs} <= set(measured):
        raise ValueError("measured must be update_precision.json's contents (a dict with bfloat16, float32 and "
                         "round4_rl_s0)")
    rows = []
    for key, label in runs:
        e, v = measured[key], measured[key]["validation"]
        most = max(m["truncated"] for m in v)
        rows.append({"update": label, "final weights": e["final_weights"].split(":")[-1][:8],
                     "accuracy step 0 -> end": f"{v[0]['observed_accuracy']:.3f} -> {v[-1]['observed_accuracy']:.3f}",
                     "p_s step 0 -> end": f"{v[0]['p_s']:.3f} -> {v[-1]['p_s']:.3f}",
                     "most at the token limit": most, "mixed groups, first fifth": round(e["mixed_first_fifth"], 3),
                     "update s": round(e["seconds"]["update_s"]), "run s": round(e["seconds"]["wall_s"]),
                     "rule holds": most <= 0.05 and e["mixed_first_fifth"] >= 0.5 if key == "bfloat16" else None})
    return pd.DataFrame(rows)
