"""The pipeline's claim on the folders it writes (``results_dir``, ``runs_dir``): a record, ``.dsh-pipeline.json``,
of the run that wrote the folder (preset, plan, chosen stages, model, training overrides, evaluation settings and
seed; the commit that started it). :func:`claim` checks both folders before the pipeline writes anything:

- a new or empty folder is claimed;
- a folder claimed by the same run (the same record) is resumed;
- a folder claimed by another run is refused in one line naming what differs, unless ``fresh``: then what the
  pipeline wrote there (:func:`pipeline_files`) is removed first;
- a folder holding anything the pipeline did not write (a file of another tool, a run folder that is not a dsh run,
  or files beside an unclaimed folder's) is refused, ``fresh`` or not, and left byte-identical.

Inside a claimed results folder each stage's job (its calibration, generations and probe files) ends with a job
record, ``jobs/<stage>.json`` (:func:`finish_job`): its key (:func:`job_key`: the stage, the model's weights digest,
the evaluation and probe settings, the seed), the commit that ran it and the sha256 of every file it wrote. A job whose
record holds the key asked for and whose files are intact is reused (:func:`reusable_job`); otherwise the record is
removed when the job starts (:func:`start_job`) and written only after all its files are in place, so it is the job's
commit point: a job cut short by a kill has no record (the next run redoes it), and :func:`check_jobs` refuses, naming
the stage, a folder where a job has no record, a file that is not the one its job wrote, or a job of other settings
than the summary's.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from ...core import store
from ...core import validate as v
from ...core.files import write_text
from ...core.provenance import git_commit
from ...training.run_dir import run_foreign_files

CLAIM = ".dsh-pipeline.json"
# what the pipeline writes in a results folder (provenance.json: its one-command GPU run, dsh.experiment.run.gpu_small),
# and the temporary and lock files of its atomic writes
RESULTS_FILES = re.compile(r"summary\.json|provenance\.json|(calibration|probe|jobs)/[^/]+\.json"
                           r"|(generations|probe)/[^/]+\.jsonl\.gz|attribution/[^/]+\.json\.gz")
RUNS_FILES = re.compile(r"generations/[^/]+\.jsonl(\.settings\.json)?")
TEMPORARY = re.compile(r"(.*/)?\.[^/]+\.(tmp|lock)")


def identity(preset: str, plan: list, stages: list, model, overrides, seed: int) -> dict:
    """What makes two pipeline runs the same run (as JSON would store it): what its trainings are made from. The
    evaluation settings are not part of it: each stage's job is keyed by them (:func:`job_key`), so the same run with
    other evaluation settings evaluates every stage again and reuses its trainings."""
    return json.loads(json.dumps({"preset": preset, "plan": plan, "stages": stages, "model": str(model),
                                  "overrides": overrides or {}, "seed": seed}, default=str))


def pipeline_files(folder: Path, role: str) -> tuple[list[Path], list[str]]:
    """The paths under ``folder`` that the pipeline wrote there (for ``role`` "results_dir" or "runs_dir"; a run
    folder of ``runs_dir`` counts whole when it holds only what ``dsh train`` writes) and the names of everything
    else, relative to ``folder``."""
    ours, foreign = [], []
    pattern = RESULTS_FILES if role == "results_dir" else RUNS_FILES
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.name == CLAIM:
            continue
        if role == "runs_dir" and p.is_dir() and p.name != "generations":
            bad = run_foreign_files(p)
            (foreign.extend(f"{p.name}/{n}" for n in bad) if bad else ours.append(p))
            continue
        for f in ([p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())):
            rel = f.relative_to(folder).as_posix()
            if pattern.fullmatch(rel) or TEMPORARY.fullmatch(rel):
                ours.append(f)
            else:
                foreign.append(rel)
    return ours, foreign


def check(folder: Path, role: str, ident: dict, fresh: bool) -> str:
    """What :func:`claim` will do with ``folder``: "new", "resume" or "fresh"; a one-line ValueError when it must be
    refused (nothing is written or removed here). A results folder claimed by the same run may hold other files
    (a committed folder's README, its design notes): the pipeline writes only its own files there. Anywhere else a
    file the pipeline did not write refuses the folder."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{role} {folder} is a file; choose a folder")
    v.output_path(role, folder, kind="folder")          # no parent of it a file
    ours, foreign = pipeline_files(folder, role)
    record = folder / CLAIM
    stored, same = None, False
    if record.is_file():
        try:
            stored = json.loads(record.read_text())["identity"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"{role} {folder}: {CLAIM} is not a dsh pipeline record; choose another folder") from None
        same = store.made_from(stored, ident)
        if same and role == "results_dir":
            return "resume"      # the same run again: files beside the pipeline's (a README, notes) stay untouched
    else:                        # no run of the pipeline claimed it: whatever is there is someone else's
        foreign = sorted(foreign + [p.relative_to(folder).as_posix() for p in ours])
    if foreign:
        raise ValueError(f"{role} {folder} holds files dsh pipeline did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}{'' if record.is_file() else f'; no {CLAIM}'}); "
                         f"choose an empty or new folder; nothing was changed")
    if stored is None:
        return "new"
    if same:
        return "resume"
    if not fresh:
        differ = ", ".join(store.differences(stored, ident))
        raise ValueError(f"{role} {folder} holds a pipeline run with another {differ}; run it with the same options "
                         f"to resume it, pass --fresh (fresh=True) to start it over, or choose another folder; nothing "
                         f"was changed")
    return "fresh"


def claim(folders: dict, ident: dict, fresh: bool = False) -> dict:
    """Check every ``{role: folder}`` (:func:`check`) before touching any, then start over the ones to start
    fresh (removing only what the pipeline wrote) and write the claim record where there is none.
    Returns ``{role: "new" | "resume" | "fresh"}``."""
    how = {role: check(Path(f), role, ident, fresh) for role, f in folders.items()}
    for role, f in folders.items():
        folder = Path(f)
        if how[role] == "fresh":
            for p in pipeline_files(folder, role)[0]:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            for d in sorted((d for d in folder.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                if not any(d.iterdir()):
                    d.rmdir()
        if how[role] != "resume":
            write_text(folder / CLAIM, json.dumps({"written_by": "dsh pipeline", "identity": ident,
                                                   "commit": git_commit()}, indent=1))
    return how


def claimed_identity(folder) -> dict | None:
    """The identity a folder was claimed with, or None when it carries no claim."""
    record = Path(folder) / CLAIM
    return json.loads(record.read_text())["identity"] if record.is_file() else None


JOBS = "jobs"      # results_dir/jobs/<stage>.json: a stage's job record (its commit point)
JOB_FILES = ("calibration/{}.json", "generations/{}.jsonl.gz", "probe/{}.json", "probe/{}.jsonl.gz")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def start_job(results: Path, stage: str) -> None:
    """Remove ``stage``'s job record before its job rewrites any of its files (see the module's docstring)."""
    (Path(results) / JOBS / f"{stage}.json").unlink(missing_ok=True)


def job_key(stage: str, model: str, settings: dict, seed: int, probe: dict | None) -> dict:
    """What a stage's job (evaluation, calibration, probe) is made from: the stage, its model by content
    (:func:`dsh.llm.models.model_digest`), the evaluation ``settings`` and ``seed``, the probe's settings (None
    without a probe)."""
    return store.as_json({"stage": stage, "model": model, "eval": settings, "seed": seed, "probe": probe})


def reusable_job(results: Path, key: dict) -> dict | None:
    """The job record of ``key["stage"]`` when the job can be reused (:mod:`dsh.core.store`'s rule): its record was
    made from ``key`` and every file it lists is the one it wrote (by sha256); else None."""
    record = store.reusable(Path(results) / JOBS / f"{key['stage']}.json", key)
    return record if record is not None and changed_file(results, record.get("files", {})) is None else None


def changed_file(results: Path, files: dict) -> str | None:
    """The first of a job record's ``files`` ({path under ``results``: sha256}) that is missing or is not the one its
    job wrote; None when every one is intact."""
    return next((rel for rel, digest in files.items()
                 if not (Path(results) / rel).is_file() or sha256(Path(results) / rel) != digest), None)


def finish_job(results: Path, key: dict) -> dict:
    """Write the job record of ``key`` (:func:`job_key`) once every file of its job is in place: the key, the commit
    that ran it and the sha256 of each of its files (:data:`JOB_FILES` that exist). Returns the record."""
    results, stage = Path(results), key["stage"]
    files = {rel: sha256(results / rel) for rel in (f.format(stage) for f in JOB_FILES) if (results / rel).is_file()}
    record = store.as_json({**key, "commit": git_commit(), "files": files})
    (results / JOBS).mkdir(exist_ok=True)
    write_text(results / JOBS / f"{stage}.json", json.dumps(record, indent=1))
    return record


def check_jobs(results: Path, summary: dict) -> None:
    """Refuse in one line, naming the stage, a results folder whose summary lists a stage without a job record, a
    job file that is not the one its job wrote (by sha256), or a job run with other evaluation settings or seed than
    the summary's (a job reused from an earlier run of the same key keeps that run's commit). A summary written before
    job records existed (no ``jobs`` key) is not checked here."""
    results = Path(results)
    if "jobs" not in summary:
        return
    for stage in summary["stages"]:
        path = results / JOBS / f"{stage}.json"
        if not path.is_file():
            raise ValueError(f"results_dir {results}: stage {stage}'s job did not finish (no {JOBS}/{stage}.json); "
                             f"run the pipeline again to redo it")
        rec = json.loads(path.read_text())
        for key in store.differences(rec, {k: summary.get(k) for k in ("eval", "seed")}):
            raise ValueError(f"results_dir {results}: stage {stage}'s job ran with another {key} "
                             f"({rec.get(key)!r}) than the summary's ({summary.get(key)!r}); the folder mixes two runs")
        rel = changed_file(results, rec["files"])
        if rel is not None:
            raise ValueError(f"results_dir {results}: {rel} is not the file stage {stage}'s job wrote; the folder "
                             f"mixes two runs")
