"""One command for the whole experiment of every preset: training stages, evaluation, calibration.

Stages follow the paper's Table 1: Base, SFT (no reflection), SFT (reflection), RL (GRPO from the
SFT-reflection model), plus DFT; a seeded preset (``laptop``) runs each training stage once per seed and its
ablations on some of them (:meth:`dsh.experiment.run.presets.Preset.plan_stages`). Each stage is a
``dsh.training.train`` run under ``runs_dir`` (weights; not for committing); evaluation and calibration (with
the preset's task, :mod:`dsh.measure.tasks`) go to ``results_dir`` (small artifacts the book renders:
generations, calibration, GRPO reward curves, provenance). A stage whose run already finished with the same
configuration is reused and a killed one resumes from its last checkpoint (an evaluation from its last record),
so an interrupted pipeline resumes where it stopped.

``gpu-small`` is the small-scale analogue of the paper's protocol for the 135M embedded model, which
cannot extrapolate to operand lengths it never saw (the book's appendix "Engineering notes"): its Base is one epoch
of lean digit-level SFT over 2..5 x 2..9 digits (the test range and neighbours, test problems held out),
stopped early so that accuracy still decays with length like the paper's base model; the paper's stages
then run on 4x5 + 5x4 from that Base. Token budgets come from :mod:`dsh.training.budgets`; every run checks its
own design goals (:func:`design_checks`). ``python3 -m dsh.experiment.run.gpu_small`` runs it as one command on a GPU host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from ...core import store
from ...core import validate as v
from ...core.files import exclusive, write_text
from ...core.provenance import git_commit, hardware, portable, provenance
from ...llm.models import fetched, model_digest, resolve_model
from ...measure.stage import preferred
from ...task.problems import level_index
from ...training import validation
from ...training.train_config import METHODS
from . import folders
from .check_probe import check_levels
from .evaluate import model_context
from .presets import DEFAULT, get
from .steps import Clock, attribution_stage, make_folders, reward_curve, stage_job, study_settings, train_stage
from .workers import Step, check_workers, run_steps


def plan(preset, runs_dir: str, model: str | None = None, overrides: dict | None = None,
         starts: dict | None = None, seeds=None, ablation_seeds=None) -> dict:
    """The TrainConfig of every training stage of ``preset`` (a name or a :class:`dsh.experiment.run.presets.Preset`;
    its stages over ``seeds`` and ``ablation_seeds``, :meth:`~dsh.experiment.run.presets.Preset.plan_stages`), each
    starting from the run of the stage it follows, or from ``starts[stage]`` (a model) where given, the first
    ones from ``model`` (default the preset's). ``overrides`` apply to every stage after the stage's own; a
    seeded stage keeps its seed. Validated; nothing loaded or written."""
    p = get(preset)
    stages = p.plan_stages(seeds, ablation_seeds)
    by_name = {s.name: s for s in stages}
    root, model = Path(runs_dir), model or p.model
    for name in starts or {}:
        v.choice("starts", name, list(by_name))
    for key, use in (("model", "model (--model)"), ("output_dir", "runs_dir (--runs-dir)"),
                     ("method", "the stages (--stages): each trains by its preset's method")):
        if key in (overrides or {}):
            raise ValueError(f"overrides must not set {key}: the plan sets each stage's; use {use}")
    if overrides and "seed" in overrides and any(s.seed is not None for s in stages):
        raise ValueError("overrides must not set seed in a seeded plan: each stage trains with its own seed (seeds)")
    out = {}
    for st in stages:
        if st.method is None:
            continue
        init = by_name[st.init] if st.init else None
        if starts and st.name in starts:
            start = starts[st.name]
        else:
            start = model if init is None or init.method is None else str(root / init.run_name)
        own = {**st.overrides, **(overrides or {})}
        if st.seed is not None:
            own["seed"] = st.seed
        out[st.name] = p.train_config(st.method, model=start, output_dir=str(root / st.run_name), **own)
    return out


def method_plan(preset, method: str = "all", runs_root: str = "runs", model: str = "", max_steps=None,
                n_train=None, grpo_init: str = "", overrides: dict | None = None, fresh: bool = True) -> dict:
    """The TrainConfigs that train ``method`` (one of the methods, or ``all``) under ``preset`` and every stage they
    start from, as :func:`plan` chains them (a seeded preset: its first seed, no ablations), run directories under
    ``runs_root/<preset>``: the training chapter's parameters, every one checked (a one-line ValueError) before any
    model is loaded. ``model`` '': the preset's; ``max_steps``, ``n_train`` None: the preset's; ``grpo_init`` '':
    GRPO starts from the SFT (reflection) run; ``fresh`` False: resume earlier runs of the same name."""
    v.choice("method", method, METHODS + ("all",))
    p = get(preset)
    for name, x in (("max_steps", max_steps), ("n_train", n_train)):
        if x is not None:
            v.positive_int(name, x)
    for name, x in (("model", model), ("grpo_init", grpo_init), ("runs_root", runs_root)):
        if not isinstance(x, str):
            raise ValueError(f"{name} must be a string ('' for the default), got {x!r}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"overrides must be a mapping of TrainConfig fields to values, got {overrides!r}")
    if not isinstance(fresh, bool):
        raise ValueError(f"fresh must be true or false, got {fresh!r}")
    seeds = p.seeds[:1] if p.seeds else None
    stages = p.plan_stages(seeds, () if seeds else None)
    rl = [s.name for s in stages if s.kind == "rl"]
    starts = {rl[0]: grpo_init} if grpo_init and rl else {}
    caps = {k: x for k, x in (("max_steps", max_steps), ("n_train", n_train)) if x is not None}
    cfgs = plan(p, str(Path(runs_root) / p.name), model or None, {**caps, **(overrides or {}), "resume": not fresh},
                starts, seeds=seeds, ablation_seeds=() if seeds else None)
    methods = METHODS if method == "all" else (method,)
    wanted = [s for s, c in cfgs.items() if c.method in methods]
    return {s: cfgs[s] for s in stages_needed(stages, wanted, starts) if s in cfgs}


def stages_needed(stages, chosen, starts: dict | None = None) -> list[str]:
    """The ``chosen`` stages of ``stages`` (a plan: :meth:`~dsh.experiment.run.presets.Preset.plan_stages`) and every
    stage they start from, transitively (a stage in ``starts`` starts from the model given there instead), in the
    plan's order."""
    by_name = {s.name: s for s in stages}
    needed = set()
    for name in chosen:
        v.choice("stages[i]", name, list(by_name))
        st = by_name[name]
        needed.add(st.name)
        while st.init and not (starts and st.name in starts):
            needed.add(st.init)
            st = by_name[st.init]
    return [s.name for s in stages if s.name in needed]


def run_pipeline(preset: str = DEFAULT, results_dir: str | None = None, runs_dir: str | None = None,
                 model: str | None = None, overrides: dict | None = None, stages: tuple | None = None,
                 eval_overrides: dict | None = None, seeds=None, ablation_seeds=None,
                 progress: bool = True, fresh: bool = False, attribution_overrides: dict | None = None,
                 workers: int = 1, threads: int | None = None) -> dict:
    """Train every stage (reusing finished runs, resuming killed ones), evaluate every model and calibrate it, and
    run the preset's gradient-attribution study on its attribution stages (:func:`attribution_stage`).

    ``stages``: only these (and every stage they start from); ``seeds``, ``ablation_seeds``: the training seeds
    (default the preset's; :meth:`~dsh.experiment.run.presets.Preset.plan_stages`). The evaluation's seed is
    :data:`TEST_SEED` (the same test questions and sampling streams for every stage), the seed whose test questions
    every training set leaves out. Weights and the working (resumable) generation files go to ``runs_dir``;
    ``results_dir`` receives the small artifacts the book renders (:data:`RESULTS_LAYOUT`). Both folders are claimed
    for this run (:mod:`dsh.experiment.run.folders`): a folder of another run is refused unless ``fresh`` (then what the
    pipeline wrote there is removed first), a folder with anything else in it always, before any work.
    ``attribution_overrides``: fields of the study's :class:`~dsh.experiment.run.attribution_study.StudySettings` that
    replace the preset's (a smaller study; its seed is the step's: 0, and 1 for the repeats). Each step's
    time is printed as it ends (``progress``). ``workers``: steps run side by side on this many worker processes of
    ``threads`` threads each (:mod:`dsh.experiment.run.workers`; the weights depend on ``threads``, not on
    ``workers``). Returns the summary that is also written to ``results_dir/summary.json``."""
    seed = TEST_SEED
    if not isinstance(fresh, bool):
        raise ValueError(f"fresh must be true or false, got {fresh!r}")
    workers, threads = check_workers(workers, threads)
    p = get(preset)
    results, runs = Path(results_dir or p.results_dir), Path(runs_dir or p.runs_dir)
    model = model or p.model
    plan_ = p.plan_stages(seeds, ablation_seeds)
    cfgs = plan(p, str(runs), model, overrides, seeds=seeds, ablation_seeds=ablation_seeds)
    names = [s.name for s in plan_]
    chosen = list(stages) if stages else names
    for s in chosen:
        v.choice("stages[i]", s, names)
    chosen = [s for s in names if s in chosen]
    needed = stages_needed(plan_, chosen)
    settings = p.eval_settings(**(eval_overrides or {})).checked()   # before the first stage trains
    study = study_settings(p, attribution_overrides)
    # fail fast; stages keep the model's context
    v.within_context("eval_overrides: max_new_tokens", settings.max_new_tokens,
                     model_context(fetched(model, resolve_model(model))))
    if p.probe:
        check_levels(settings.levels)               # the probe reads the laptop test levels only
    if results.resolve() == runs.resolve():
        raise ValueError("results_dir must differ from runs_dir (results are committed, runs hold weights)")
    for a, b, an, bn in ((results, runs, "results_dir", "runs_dir"), (runs, results, "runs_dir", "results_dir")):
        if a.resolve() in b.resolve().parents:
            raise ValueError(f"{bn} {b} must not lie inside {an} {a}: each folder's check would find the other's "
                             f"files; choose two separate folders")
    ident = claim_identity(p, plan_, chosen, model, overrides, seed)
    v.output_path("results_dir", results, kind="folder")      # before the lock makes the runs folder's parent
    v.output_path("runs_dir", runs, kind="folder")
    with exclusive(runs, f"runs_dir {runs} is in use by another dsh pipeline; wait for it or choose another "
                         f"runs_dir"):
        return _run_claimed(p, results, runs, model, overrides, plan_, cfgs, chosen, needed, settings, study, seed,
                            fresh, progress, ident, (workers, threads))


def pipeline_steps(p, results: Path, runs: Path, model: str, plan_, cfgs: dict, chosen: list, needed: list,
                   settings, study, seed: int) -> list[Step]:
    """The pipeline's steps in the order one worker runs them: per stage of the plan its training (the stages it
    needs) and its evaluation job (the chosen ones), then the attribution studies. Each step names the steps whose
    models it reads; ``cost`` is the method's rough share of the run (:data:`STEP_COST`), for the order of work."""
    models_of = {st.name: (cfgs[st.name].output_dir if st.method else model) for st in plan_}
    trained = {st.name for st in plan_ if st.method and st.name in needed}
    inits = {s.name: s.init for s in plan_}

    def made(*names) -> tuple:
        return tuple(f"train {n}" for n in names if n in trained)

    out = []
    for st in plan_:
        if st.name in trained:
            out.append(Step(f"train {st.name}", train_stage, (cfgs[st.name], st.name), made(st.init),
                            STEP_COST.get(st.method, 1.0)))
        if st.name in chosen:
            out.append(Step(f"job {st.name}", stage_job, (results, runs, st.name, models_of[st.name], p, settings,
                                                          seed), made(st.name), STEP_COST["job"]))
    if study:
        for name, tseed in [(s, 0) for s in p.attribution_stages] + [(s, 1) for s in p.attribution_repeats]:
            if name in chosen:
                ref = inits[name] or name
                out.append(Step(f"study {name}-t{tseed}", attribution_stage,
                                (models_of[name], models_of[ref], results / "attribution", name,
                                 dataclasses.replace(study, seed=tseed), runs), made(name, ref), STEP_COST["study"]))
    return out


# rough minutes a step takes on the 2-core machine (the laptop-graded run's records), only to order the work of
# several workers: the longest chains first
STEP_COST = {"sft": 1.0, "sft_reflection": 2.0, "dft": 2.0, "grpo": 6.0, "job": 0.5, "study": 2.0}


def _run_claimed(p, results: Path, runs: Path, model: str, overrides, plan_, cfgs: dict, chosen: list, needed: list,
                 settings, study, seed: int, fresh: bool, progress: bool, ident: dict, layout: tuple) -> dict:
    """:func:`run_pipeline`'s work once its arguments are checked and it holds the runs folder's lock: claim both
    folders, then train, evaluate, calibrate, probe and study every stage (on ``layout`` = (workers, threads)), and
    write the summary."""
    folders.claim({"results_dir": results, "runs_dir": runs}, ident, fresh)
    make_folders(results, runs, ("generations", "calibration") + (("probe",) if p.probe else ())
                 + (("attribution",) if study else ()))
    clock = Clock(progress)
    prov, load = provenance(), [(0.0, os.getloadavg()[0])]

    def done(step: Step, out) -> None:
        if step.fn is stage_job:
            load.append((round(clock.elapsed(), 1), os.getloadavg()[0]))
            clock.say(f"{step.args[2]}: accuracy {out['all']['overall']['observed_accuracy']:.3f}, "
                      f"truncated {100 * (out['truncated'] or 0):.1f} % (load {load[-1][1]:.2f})")

    work = pipeline_steps(p, results, runs, model, plan_, cfgs, chosen, needed, settings, study, seed)
    outs, schedule = run_steps(work, clock, *layout, done=done)
    train_summaries, curves, along = {}, {}, {}
    for st in plan_:
        if f"train {st.name}" in outs:
            train_summaries[st.name] = outs[f"train {st.name}"]
            if st.method == "grpo":
                curves[st.name] = reward_curve(Path(cfgs[st.name].output_dir))
            if cfgs[st.name].validation_every:
                along[st.name] = validation.read_log(Path(cfgs[st.name].output_dir) / "validation.jsonl")
    old = store.read_record(results / "summary.json")
    if not clock.worked and store.made_from(old, {"stages": chosen, "eval": settings.key(), "seed": seed}):
        clock.say(f"every step reused; {results / 'summary.json'} left as it is")
        return old
    # the summary is written from what the folder holds: each stage's calibration and job record as they are there
    calib = {name: json.loads((results / "calibration" / f"{name}.json").read_text()) for name in chosen}
    jobs = {name: json.loads((results / folders.JOBS / f"{name}.json").read_text()) for name in chosen}
    summary = _summary(p, model, [s for s in plan_ if s.name in chosen], settings, seed, clock, train_summaries,
                       cfgs, calib)
    summary.update(reward_curves=curves, validation_curves=along, load_average_1min=load, provenance=prov,
                   date=time.strftime("%Y-%m-%d %H:%M:%S"), jobs=jobs,
                   workers={"workers": layout[0], "threads": layout[1]}, schedule=schedule)
    summary = portable(json.loads(json.dumps(summary, default=str)), {runs: "<runs_dir>"})   # no machine's paths
    write_text(results / "summary.json", json.dumps(summary, indent=1))
    clock.say(f"done in {summary['wall_s']} s: {results}")
    return summary


def _plan_rows(stages) -> list[dict]:
    return [{"name": s.name, "kind": s.kind, "method": s.method, "seed": s.seed, "init": s.init,
             "overrides": s.overrides} for s in stages]


def _summary(p, model, chosen, settings, seed, clock: Clock, train_summaries, cfgs, calib) -> dict:
    names = [s.name for s in chosen]
    summary = {
        "preset": p.name, "task": p.task, "model": model, "stages": names,
        "plan": _plan_rows(chosen),
        "labels": {s.name: s.label for s in chosen},
        "eval": settings.key(), "seed": seed, "wall_s": round(clock.elapsed(), 1),
        "timings_s": clock.timings, "training": train_summaries, "hardware": hardware(),
        "budgets": {**{f"{name}.{k}": getattr(c, k) for name, c in cfgs.items() if name in train_summaries
                       for k in (("max_completion_length",) if c.method == "grpo" else ("max_length",))},
                    "eval.max_new_tokens": settings.max_new_tokens},
        "truncation": {s: {"train": (train_summaries.get(s) or {}).get("truncation"),
                           "eval": calib[s]["truncated"]} for s in names},
        "accuracy": {s: {lv: {k: c["all"]["by_level"][lv][k] for k in ("n", "observed_accuracy", "ci_low", "ci_high")}
                         for lv in c["all"]["by_level"]} for s, c in calib.items()},
        "commit": git_commit(),
        # each trained stage's resolved configuration: what labels it (a GRPO arm's beta) read from the results, not
        # from today's preset code
        "configs": {name: json.loads(json.dumps(dataclasses.asdict(c), default=str)) for name, c in cfgs.items()
                    if name in train_summaries},
    }
    summary["design"] = design_checks({"summary": summary, "calibration": calib})
    return summary


TEST_SEED = 0   # the evaluation seed whose test questions every preset's training sets leave out


def claim_identity(p, plan_, chosen, model, overrides=None, seed: int = TEST_SEED) -> dict:
    """What a run of preset ``p`` claims its folders with (:func:`dsh.experiment.run.folders.identity`): its plan
    ``plan_`` (stages), the stage names ``chosen``, the model by content (:func:`dsh.llm.models.model_digest`: a
    relative and an absolute path of one base are one run), its overrides and the evaluation seed."""
    return folders.identity(p.name, _plan_rows(plan_), chosen, model_digest(model), portable(overrides or {}), seed)


RESULTS_LAYOUT = ("summary.json", "calibration/<stage>.json", "generations/<stage>.jsonl.gz", "probe/<stage>.json",
                  "probe/<stage>.jsonl.gz", "jobs/<stage>.json", "attribution/<stage>.json.gz",
                  "attribution/<stage>-t<seed>.json.gz")


def load_results(results_dir) -> dict:
    """A results folder written by :func:`run_pipeline`: summary, calibration per stage and, where the preset has
    one, the check probe per stage."""
    if not isinstance(results_dir, (str, Path)):
        raise ValueError(f"results_dir must be a folder written by dsh pipeline, got {results_dir!r}")
    root = Path(results_dir)
    if not (root / "summary.json").is_file():
        raise ValueError(f"results_dir must be a folder written by dsh pipeline; {root}/summary.json not found")
    summary = _record(root, "summary.json")
    if not isinstance(summary.get("stages"), list) or not all(isinstance(s, str) for s in summary["stages"]):
        raise ValueError(f"results_dir {root}: summary.json names no stages; it is not a dsh pipeline summary")
    missing = [s for s in summary["stages"] if not (root / "calibration" / f"{s}.json").is_file()]
    if missing:
        raise ValueError(f"results_dir {root}: stage {missing[0]} of its summary has no calibration/{missing[0]}.json")
    calib = {s: _record(root, f"calibration/{s}.json") for s in summary["stages"]}
    _check_consistent(root, summary, calib)
    probe = {s: _record(root, f"probe/{s}.json") for s in summary["stages"] if (root / "probe" / f"{s}.json").is_file()}
    return {"summary": summary, "calibration": calib, "probe": probe}


def _record(root: Path, rel: str) -> dict:
    """The JSON object in ``root/rel``, or a one-line ValueError naming the file when it is not one (not JSON,
    nested too deeply to read, not an object)."""
    try:
        got = json.loads((root / rel).read_text())
    except (ValueError, RecursionError, OSError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else type(e).__name__
        raise ValueError(f"results_dir {root}: {rel} cannot be read as a dsh record ({why})") from None
    if not isinstance(got, dict):
        raise ValueError(f"results_dir {root}: {rel} is not a dsh record (a JSON {type(got).__name__})")
    return got


def _check_consistent(root: Path, summary: dict, calib: dict) -> None:
    """Refuse a results folder whose stages disagree with its summary's evaluation (levels, responses a level), whose
    summary disagrees with the run that claimed the folder (stages, seed: :mod:`dsh.experiment.run.folders`), or
    whose job records disagree with its files or its summary (commit, settings;
    :func:`dsh.experiment.run.folders.check_jobs`), naming the stage: the files of two runs mixed in one folder."""
    claimed = folders.claimed_identity(root)
    if claimed is not None and (claimed["stages"] != summary["stages"] or claimed["seed"] != summary.get("seed")):
        raise ValueError(f"results_dir {root}: summary.json is not the one of the run that claimed the folder "
                         f"({folders.CLAIM}); the folder mixes two runs")
    folders.check_jobs(root, summary)
    ev = summary.get("eval")
    if not ev:
        return
    for s, c in calib.items():
        by = (c.get("all") or {}).get("by_level")
        if by is None:
            continue        # not a calibration this check can read (nothing to compare)
        n = ev["n_per_level"] * ev.get("samples_per_question", 1)
        if list(by) != list(ev["levels"]) or any(b["n"] != n for b in by.values()):
            got = ", ".join(f"{lv}: {b['n']}" for lv, b in by.items())
            raise ValueError(f"results_dir {root}: stage {s} has {got} responses, its summary says {n} a level on "
                             f"{', '.join(ev['levels'])}; the folder mixes two runs")


def plan_of(results: dict) -> list[dict]:
    """The calibrated stages of results (:func:`load_results`): name, kind and seed, from the summary's plan (results
    written before plans carried seeds, or simulated ones, name their stages by kind, seed None)."""
    s = results["summary"]
    plan_ = s.get("plan") or [{"name": x, "kind": x, "seed": None} for x in s.get("stages") or results["calibration"]]
    return [x for x in plan_ if x["name"] in results["calibration"]]


def stages_of(results: dict, kind: str) -> dict:
    """``{seed: stage name}`` of the calibrated stages of ``kind`` (:func:`plan_of`)."""
    return {x["seed"]: x["name"] for x in plan_of(results) if x["kind"] == kind}


def design_checks(results: dict) -> dict:
    """Whether a run gives the paper's questions something to measure (the design goals of the
    small-scale analogue): Base accuracy non-zero on at least 4 test levels and decaying with difficulty
    (more decreasing than increasing pairs of levels, and easiest > hardest); GRPO groups whose rewards
    all agree <= 50 % at its first step; RL changing p_dW or p_s measurably (the 95 % intervals of
    SFT (reflection) and RL of the same seed do not overlap). Goals of a seeded run name their seed. ``None``
    where the run lacks the stage."""
    cal, summ = results["calibration"], results["summary"]
    out, goals = {}, {}
    base = next(iter(stages_of(results, "base").values()), None)
    if base in cal:
        by = cal[base]["all"]["by_level"]
        levels = sorted(by, key=level_index)
        acc = [by[lv]["observed_accuracy"] for lv in levels]
        down = sum(x > y for i, x in enumerate(acc) for y in acc[i + 1:])
        up = sum(x < y for i, x in enumerate(acc) for y in acc[i + 1:])
        out["base_accuracy"] = dict(zip(levels, acc))
        out["base_nonzero_levels"] = sum(a > 0 for a in acc)
        goals["base accuracy non-zero on >= 4 test levels"] = out["base_nonzero_levels"] >= 4
        goals["base accuracy decays with difficulty"] = bool(down > up and acc[0] > acc[-1])
    rls, srs = stages_of(results, "rl"), stages_of(results, "sft_reflection")
    for seed, rl_name in (rls.items() or [(None, None)]):
        tag = "" if seed is None else f" (seed {seed})"
        rl_train = (summ.get("training") or {}).get(rl_name) or {}
        zero = (rl_train.get("truncation") or {}).get("zero_std_groups_first")
        out[f"grpo_zero_std_groups_first{tag}"] = zero
        goals[f"GRPO zero-variance groups <= 50 % at step 1{tag}"] = None if zero is None else zero <= 0.5
        rl, sr = cal.get(rl_name), cal.get(srs.get(seed))
        if rl and sr:
            a, b = preferred(rl)["overall"], preferred(sr)["overall"]
            moved = []
            for key in ("p_s", "p_d_given_wrong"):
                ci_a, ci_b = a.get(key + "_ci") or [None, None], b.get(key + "_ci") or [None, None]
                delta = None if a[key] is None or b[key] is None else a[key] - b[key]
                apart = None if None in (*ci_a, *ci_b) else (ci_a[0] > ci_b[1] or ci_b[0] > ci_a[1])
                out[f"delta_{key}{tag}"] = {"rl": a[key], "sft_reflection": b[key], "delta": delta, "rl_ci": ci_a,
                                            "sft_reflection_ci": ci_b, "intervals_apart": apart}
                moved.append(apart)
            goals[f"RL changes p_dW or p_s measurably{tag}"] = (None if all(m is None for m in moved)
                                                               else any(bool(m) for m in moved))
    out["goals"] = goals
    return out
