"""A training run's directory: what dsh writes there (run files, logs, checkpoints, ``final/``), the checks before a
run starts or resumes (a foreign file refused, a checkpoint of another configuration refused), clearing it, and the
last checkpoint a resume continues from."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ..core import store
from ..core import validate as v
from ..core.files import write_text
from ..llm.models import MODEL_FILES, model_digest, resolve_model
from .train_config import TrainConfig, checked_config


def last_checkpoint(run_dir) -> Path | None:
    """The newest complete checkpoint: one with its trainer_state.json and dsh's totals (:data:`TOTALS`, written
    last; a checkpoint of a run made before they existed does not count, so such a run starts over)."""
    cks = [p for p in Path(run_dir).glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
           and (p / "trainer_state.json").is_file() and (p / TOTALS).is_file()]
    return max(cks, key=lambda p: int(p.name.split("-")[-1])) if cks else None


CHECKPOINT = re.compile(r"checkpoint-\d+")    # the trainer's checkpoint folders: the only ones dsh deletes


LOGS = ("metrics.jsonl", "validation.jsonl")    # one JSON line per step, written as the run goes

TOTALS = "dsh_totals.json"   # in each checkpoint: the run's loss sum and real tokens up to it (a resume reads them)


def trim_logs(run: Path, step: int) -> None:
    """Drop the lines of ``run``'s step logs (:data:`LOGS`) after ``step`` (the checkpoint a resume continues from),
    and a line the kill cut short: the resumed run logs those steps again, so a curve holds each step once. Each file
    is replaced whole."""
    for name in LOGS:
        path = run / name
        if not path.is_file():
            continue
        keep = []
        for x in path.read_text().splitlines():
            try:
                row = json.loads(x)
            except ValueError:                     # a line cut by the kill
                continue
            if isinstance(row, dict) and row.get("step", 0) <= step:
                keep.append(x)
        write_text(path, "".join(x + "\n" for x in keep))


# what `train` writes in a run folder (the trainer's model card, logs, settings, summary, final model, checkpoints,
# TensorBoard events): the only names `clear_run` removes
RUN_FILES = ("run_config.json", "summary.json", "README.md", "training_args.bin") + LOGS


RUN_FOLDERS = ("final", "runs")


# inside final/ and checkpoint-N/: a saved model (dsh.llm.models.MODEL_FILES) and, in a checkpoint, its trainer's
# state (transformers, TRL, DeepSpeed) and dsh's totals; inside runs/: TensorBoard's event files
INSIDE = {"final": re.compile(MODEL_FILES),
          "checkpoint": re.compile(MODEL_FILES + r"|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth"
                                   r"|trainer_state\.json|training_args\.bin|" + TOTALS.replace(".", r"\.") +
                                   r"|latest|zero_to_fp32\.py|global_step\d+/[^/]+"        # DeepSpeed
                                   r"|(pytorch_model_fsdp|optimizer)_\d+/[^/]+"),                 # FSDP
          "runs": re.compile(r"([^/]+/)+events\.out\.tfevents\.[^/]+")}


def foreign_inside(folder: Path, kind: str) -> list[str]:
    """The files below ``folder`` (a run's final/, checkpoint-N/ or runs/) that ``train`` does not write there, as
    paths relative to ``folder``; a link counts as foreign (dsh writes none)."""
    pattern = INSIDE[kind]
    out = []
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.is_symlink() or (f.is_file() and not pattern.fullmatch(rel)) or not (f.is_file() or f.is_dir()):
            out.append(rel)
    return out


def run_foreign_files(run_dir) -> list[str]:
    """The paths in ``run_dir`` that :func:`train` does not write (all of its names when it holds no
    ``run_config.json``, i.e. is no dsh run; none for an empty or missing folder), looking into ``final/``, the
    checkpoints and ``runs/`` too: a file of the user's anywhere below a run folder is named here (``final/mine.txt``)
    and so is never deleted with it."""
    run = Path(run_dir)
    names = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    if names and "run_config.json" not in names:
        return names
    out = []
    for n in names:
        p = run / n
        if p.is_symlink():
            out.append(n)
        elif n in RUN_FILES and p.is_file():
            continue
        elif (n in RUN_FOLDERS or CHECKPOINT.fullmatch(n)) and p.is_dir():
            out += [f"{n}/{x}" for x in foreign_inside(p, "checkpoint" if CHECKPOINT.fullmatch(n) else n)]
        else:
            out.append(n)
    return out


def clear_run(run_dir) -> None:
    """Remove the dsh run in ``run_dir`` (finished or interrupted) so that it can be trained afresh: only what
    :func:`train` writes there (:data:`RUN_FILES`, :data:`RUN_FOLDERS`, checkpoints), then the folder itself. A
    folder that is not a dsh run (no ``run_config.json``) or that holds anything else is refused in one line that
    names what it holds, before anything is removed. A missing folder is nothing to do."""
    import shutil

    run = Path(run_dir)
    if not run.exists():
        return
    if not run.is_dir():
        raise ValueError(f"run folder {run} is a file; choose a folder")
    names = sorted(p.name for p in run.iterdir())
    if names and "run_config.json" not in names:
        raise ValueError(f"run folder {run} is not a dsh run (no run_config.json; it holds {', '.join(names[:3])}"
                         f"{' ...' if len(names) > 3 else ''}); nothing was removed")
    foreign = run_foreign_files(run)
    if foreign:
        raise ValueError(f"run folder {run} holds files dsh train did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}); move them or choose another folder; nothing was "
                         f"removed")
    for n in names:
        p = run / n
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    run.rmdir()


def check_checkpoint(ck: Path) -> Path:
    """The checkpoint ``ck`` that a resume will read, refused in one line naming the file when one of its files
    cannot be read safely: a cut or damaged ``model.safetensors`` / ``optimizer.pt`` / ``scheduler.pt``, or a
    pickle that torch's weights-only loader refuses (a planted object would run code under a plain loader). The
    ``.pt``/``.pth`` files are opened as the trainer opens them (weights only, transformers' allowed globals; memory
    mapped, so a large optimizer state is not read twice)."""
    import torch
    from safetensors import safe_open
    from transformers.trainer_pt_utils import safe_globals

    for f in sorted(ck.iterdir()):
        try:
            if f.name.endswith(".safetensors"):
                with safe_open(str(f), "pt") as h:
                    h.keys()
            elif f.suffix in (".pt", ".pth") and f.name != "training_args.bin":
                with safe_globals():
                    torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line refusal
            import pickle

            why = ("objects beyond tensors and plain values, refused by the weights-only loader"
                   if isinstance(e, pickle.UnpicklingError) else str(e).strip().splitlines()[0][:120] or "empty")
            raise ValueError(f"checkpoint {ck}: {f.name} cannot be read safely ({type(e).__name__}: {why}); delete "
                             f"{ck} to resume from the checkpoint before it, or train afresh (--fresh, or another "
                             f"output_dir)") from None
    return ck


def check_run_dir(cfg: TrainConfig, digest: str | None = None) -> Path:
    """The run directory, refused when it already holds a run and ``resume`` is off, or, with ``resume``, when it
    holds files but is not a dsh run (no ``run_config.json``) or another run (:func:`resume_mismatch`; ``digest``:
    the starting model's, when the caller has it). Nothing is created here."""
    run = Path(checked_config(cfg).output_dir)
    if run.exists() and not run.is_dir():
        raise ValueError(f"output_dir {run} is a file; choose a folder")
    v.output_path("output_dir", run, kind="folder")     # no parent of it a file
    full = run.is_dir() and any(run.iterdir())
    if full and not cfg.resume:
        raise ValueError(f"output_dir {run} already holds a run; pass resume=True to continue it or choose "
                         f"another output_dir")
    if full and cfg.resume and not (run / "run_config.json").is_file():
        raise ValueError(f"output_dir {run} is not a dsh run (no run_config.json); resume continues only a dsh run")
    # a resumed run rotates and deletes its checkpoints and rewrites final/: a file of the user's inside them would
    # go (one beside them, at the run folder's top, is never touched and stays)
    foreign = [f for f in run_foreign_files(run) if "/" in f] if full else []
    if foreign:
        raise ValueError(f"output_dir {run} holds files dsh train did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}); move them or choose another output_dir")
    if full and cfg.resume:
        differ = resume_mismatch(run, cfg, digest)
        if differ:
            raise ValueError(f"output_dir {run} holds a run with other settings ({differ}); resume continues only "
                             f"the same run: choose another output_dir or the run's own settings")
    return run


# TrainConfig fields added after runs were recorded, each with the default that is the behaviour those runs had
ADDED = ("packed_attention", "rollout_kv_cache", "attempt_budget", "update_precision", "scoring_precision")


def resume_mismatch(run: Path, cfg: TrainConfig, digest: str | None = None) -> str:
    """What differs between the run in ``run`` (its ``run_config.json``) and ``cfg``, as ``field: was -> now`` (empty
    when nothing does): every field but ``output_dir``, ``resume`` and ``model`` (one of :data:`ADDED` that the record
    lacks counts as its default), the starting model compared by content
    (:func:`dsh.llm.models.model_digest`: the same weights under a relative, an absolute or another path are the
    same model; other weights in the same folder are not; a run that recorded no digest is another run).
    Compared by :func:`dsh.core.store.differences`. ``digest``: the starting model's
    :func:`~dsh.llm.models.model_digest` when the caller has it (computed here otherwise: one read of the weights)."""
    try:
        stored = json.loads((run / "run_config.json").read_text())
        was = stored["dsh"]
    except (OSError, ValueError, KeyError, TypeError):
        return "run_config.json unreadable"
    now = store.as_json({k: x for k, x in dataclasses.asdict(cfg).items() if k not in ("output_dir", "resume", "model")})
    if isinstance(was, dict):       # a field added to TrainConfig after the run was recorded: its default then
        was = {**store.as_json({f.name: f.default for f in dataclasses.fields(cfg) if f.name in ADDED}), **was}
    out = [f"{k}: {was.get(k)!r} -> {now[k]!r}" for k in store.differences(was, now)]
    after = resolve_model(cfg.model)
    digest = digest or model_digest(after)       # by content: the same weights under any path, other weights never
    if store.differences(stored, {"model_digest": digest}):
        out.append(f"model: {stored.get('resolved_model')!r} ({str(stored.get('model_digest'))[:19]}) -> {after!r} "
                   f"({digest[:19]})")
    return "; ".join(out)
