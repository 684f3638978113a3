"""The pipeline's steps, each on one stage: train it (reused when its run finished with the same configuration),
evaluate it, probe its check, study its gradient attribution; each step reports its time on the pipeline's
:class:`Clock`, and reads what a finished step left."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from ...core import settings as typed_settings
from ...core import store
from ...core import validate as v
from ...core.files import read_jsonl, remove_partial_writes, write_jsonl_gz, write_text
from ...llm.models import model_digest, resolve_model, weights_digest
from ...measure.stage import calibrate_stage
from ...task.records import by_question
from ...training.run_dir import resume_mismatch
from ...training.train import train
from . import folders
from .attribution_study import METHOD, StudySettings, resume_point, run_study, study_objectives
from .check_probe import run_probe
from .evaluate import evaluate, model_identity, settings_path
from .presets import PRESETS


def run_matches(run: Path, cfg) -> bool:
    """Whether the run directory ``run`` was trained with ``cfg`` (its output folder and resume flag aside; the
    starting model compared by content: :func:`dsh.training.run_dir.resume_mismatch`)."""
    return not resume_mismatch(run, cfg)


def reward_curve(run: Path) -> list[dict]:
    """GRPO's log per rollout round (from the run's metrics.jsonl): the round's first step, its reward,
    zero-variance groups and completion length, the KL of the round's last logged step, and the round's time split
    (sampling, scoring and the sum of its steps' updates, in seconds; None for runs that did not log them)."""
    keys = ("reward", "frac_reward_zero_std", "kl", "completions/mean_length")
    out = []
    if (run / "metrics.jsonl").is_file():
        for r in read_jsonl(run / "metrics.jsonl"):
            if "reward" in r:
                out.append({"step": r["step"], **{k: r.get(k) for k in keys},
                            "rollout_s": r.get("time/rollout_s"), "scoring_s": r.get("time/scoring_s"),
                            "update_s": None})
            if not out:
                continue
            if r.get("kl") is not None:
                out[-1]["kl"] = r["kl"]
            if r.get("time/update_s") is not None:
                out[-1]["update_s"] = (out[-1]["update_s"] or 0.0) + r["time/update_s"]
    return out


class Clock:
    """Wall time since the run started, each step's time (``timings``), whether any step did work rather than reuse
    its artifact (``worked``), and progress lines ``[dsh pipeline] ...`` (printed when ``progress``; progress bars
    too when ``bars``, by default as ``progress``)."""

    def __init__(self, progress: bool = True, bars: bool | None = None):
        self.progress, self.start, self.timings, self.worked = progress, time.time(), {}, False
        self.bars = progress if bars is None else bars

    def elapsed(self) -> float:
        return time.time() - self.start

    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[dsh pipeline] {msg}", flush=True)

    def took(self, step: str, t0: float) -> float:
        self.timings[step] = round(time.time() - t0, 1)
        return self.timings[step]


def make_folders(results: Path, runs: Path, subfolders) -> None:
    """``results/<sub>`` for every sub-folder and ``runs/generations`` (that the two differ is checked before the
    folders are claimed), with what a killed run's atomic writes left half-written in them removed."""
    for sub in subfolders:
        (results / sub).mkdir(parents=True, exist_ok=True)
    (runs / "generations").mkdir(parents=True, exist_ok=True)
    for folder in (results, runs / "generations", *(results / sub for sub in subfolders)):
        remove_partial_writes(folder)


def train_stage(cfg, name: str, clock: Clock) -> dict:
    """Train ``cfg`` into its output folder, or reuse the run there when it finished with the same configuration
    (:func:`run_matches`); an unfinished run is resumed, a finished one with another configuration refused.
    Returns the run's summary."""
    run = Path(cfg.output_dir)
    t0 = time.time()
    if (run / "summary.json").is_file() and run_matches(run, cfg):
        summary, how = store.read_record(run / "summary.json"), "reused"
        now = f"sha256:{weights_digest(run / 'final')}"
        if not store.made_from(summary, {"final_weights": now}):  # weights put there after training: not its model
            raise ValueError(f"runs_dir {run / 'final'} holds other weights than its training wrote "
                             f"({now[:19]}..., trained {str(summary.get('final_weights'))[:19]}...); restore them or "
                             f"start the pipeline over with --fresh")
    else:
        if (run / "summary.json").is_file():
            raise ValueError(f"runs_dir {run} holds a finished run with another configuration; choose another runs_dir")
        clock.say(f"train {name} ({cfg.method}) ...")
        clock.worked = True
        summary, how = train(dataclasses.replace(cfg, resume=run.exists()), progress=clock.bars), "trained"
    clock.say(f"train {name}: {how} in {clock.took(f'train_{name}', t0)} s (elapsed {clock.elapsed():.0f} s)")
    return summary


def evaluate_model(model: str, gen: Path, settings, seed: int, name: str, clock: Clock,
                   backend: str = "auto") -> list[dict]:
    """Evaluate ``model`` into the working file ``gen`` (resumed when it holds generations of the same model,
    weights and settings: its settings record; started over otherwise) and return its records."""
    record = settings_path(gen)
    stale = record.is_file() and store.reusable(record, model_identity(model, settings, seed, backend)) is None
    if stale or (gen.exists() and not record.is_file()):
        gen.unlink(missing_ok=True)   # the pipeline's own working file, of another model or other settings: start over
        record.unlink(missing_ok=True)
    t0 = time.time()
    evaluate(model, out=str(gen), settings=settings, seed=seed, backend=backend, progress=clock.bars)
    recs = read_jsonl(gen)
    clock.say(f"evaluate {name}: {len(recs)} responses in {clock.took(f'evaluate_{name}', t0)} s "
              f"(elapsed {clock.elapsed():.0f} s)")
    return recs


def stage_job(results: Path, runs: Path, name: str, model: str, p, settings, seed: int, clock: Clock) -> dict:
    """One stage's job into ``results``: evaluate ``model`` (working file ``runs/generations/<name>.jsonl``), write its
    calibration and question-ordered generations, probe its check (when the preset has a probe), then the job record
    (:func:`dsh.experiment.run.folders.finish_job`). Reused, nothing rewritten, when its record holds the same key and
    its files are intact (:func:`~dsh.experiment.run.folders.reusable_job`). Returns the stage's calibration."""
    key = folders.job_key(name, model_digest(model), settings.key(), seed,
                          dataclasses.asdict(probe_settings(p, settings, seed)) if p.probe else None)
    if folders.reusable_job(results, key) is not None:
        clock.say(f"{name}: evaluation, calibration and probe reused")
        return store.read_record(results / "calibration" / f"{name}.json")
    clock.worked = True
    folders.start_job(results, name)
    recs = evaluate_model(model, runs / "generations" / f"{name}.jsonl", settings, seed, name, clock)
    calib = calibrate_stage(recs, seed=seed, task=p.task)
    write_text(results / "calibration" / f"{name}.json", json.dumps(calib, indent=1))
    write_jsonl_gz(results / "generations" / f"{name}.jsonl.gz", by_question(recs))   # question order
    if p.probe:
        probe_stage(model, results / "probe" / f"{name}.json", p, settings, seed, clock, name)
    folders.finish_job(results, key)
    return calib


def probe_settings(p, settings, seed: int):
    """The preset's check probe (:mod:`dsh.experiment.run.check_probe`) as this evaluation asks it: at most the
    evaluation's questions a level, its temperature and seed."""
    return dataclasses.replace(p.probe, n_per_level=min(p.probe.n_per_level, settings.n_per_level),
                               temperature=settings.temperature, seed=seed).checked()


def probe_stage(model: str, out: Path, p, settings, seed: int, clock: Clock, name: str) -> dict:
    """The check probe of one stage's model into ``out`` (reused when it is there for the same weights, levels and
    settings), on the evaluation's levels; the fine-tuning levels are those of the preset's SFT data."""
    ps = probe_settings(p, settings, seed)
    tuned = tuple(lv for lv in settings.levels if lv in p.training["sft"].get("train_levels", ()))
    t0 = time.time()
    old = store.reusable(out, {"settings": dataclasses.asdict(ps), "levels": settings.levels,
                               "weights": weights_digest(resolve_model(model)), "tuned_levels": tuned})
    if old is not None:
        clock.say(f"probe {name}: reused")
        return old
    got = run_probe(model, out, settings.levels, ps, tuned, progress=False)
    t = got["tuned"]
    clock.say(f"probe {name}: {t['checks']} checks on the fine-tuning levels, kappa "
              f"{t['kappa'] if t['kappa'] is None else round(t['kappa'], 3)} in {clock.took(f'probe_{name}', t0)} s")
    return got


def study_settings(p, overrides: dict | None = None, name: str = "attribution_overrides"):
    """The preset's attribution study with ``overrides`` (None when the preset has none), checked: a field that
    :class:`~dsh.experiment.run.attribution_study.StudySettings` lacks, or a bad value, is named in one line (the
    overrides called ``name`` there)."""
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"{name} must be a dict of StudySettings fields, got {overrides!r}")
    if p.attribution is None:
        if overrides:
            raise ValueError(f"{name}: preset {p.name!r} runs no attribution study (presets that do: "
                             f"{', '.join(q.name for q in PRESETS.values() if q.attribution)})")
        return None
    fields = [f.name for f in dataclasses.fields(StudySettings)]
    for k in overrides or {}:
        v.choice(name, k, [f for f in fields if f != "seed"])
    return dataclasses.replace(p.attribution, **typed_settings.typed(StudySettings, overrides or {}, name)).checked()


def study_path(folder: Path, stage: str, seed: int) -> Path:
    """Where a stage's attribution study goes: ``folder/<stage>.json.gz``, ``<stage>-t<seed>.json.gz`` for a
    trajectory seed other than 0 (stage names hold dots: no ``with_suffix``)."""
    return folder / f"{stage if seed == 0 else f'{stage}-t{seed}'}.json.gz"


def attribution_stage(model: str, reference: str, folder: Path, name: str, settings, runs: Path,
                      clock: Clock) -> dict:
    """The gradient-attribution study of one stage's model against ``reference`` into
    ``folder/<name>.json.gz`` (``<name>-t<seed>.json.gz`` for a trajectory seed other than 0), reused when that file
    holds a study with the same settings and method of the same weights, the model's and the reference's; continued
    from its rounds when they are this study's first (:func:`~dsh.experiment.run.attribution_study.resume_point`: an
    earlier method's or a smaller ``max_rounds``)."""
    out = study_path(folder, name, settings.seed)
    label = out.name[:-len(".json.gz")]
    t0 = time.time()
    weights = weights_digest(resolve_model(model)), weights_digest(resolve_model(reference))
    old = store.read_record(out)
    if store.made_from(old, {"settings": dataclasses.asdict(settings), "method": METHOD, "weights": weights[0],
                             "reference_weights": weights[1]}):
        clock.say(f"attribution {label}: reused")
        return old
    if old is not None:
        objectives = study_objectives(settings, resolve_model(model), resolve_model(reference))
        if resume_point(old, settings, objectives, weights) is None:
            old = None
        else:
            clock.say(f"attribution {label}: the earlier study's {old['rounds']} round"
                      f"{'s' if old['rounds'] != 1 else ''} taken as this study's first")
    clock.worked = True
    got = run_study(model, reference, out, settings, roots={runs: "<runs_dir>"}, previous=old, bars=clock.bars)
    verdicts = [f["verdict"] for f in got["fits"].values() if f["verdict"]]
    clock.say(f"attribution {label}: {len(got['trajectories'])} trajectories, verdicts "
              + ", ".join(f"{k} {verdicts.count(k)}" for k in ("holds", "fails", "cannot tell"))
              + f" in {clock.took(f'attribution_{label}', t0)} s")
    return got
