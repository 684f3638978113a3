"""The one reuse rule of dsh's artifacts (a trained run, an evaluation's generations, a check probe, an attribution
study, a model's own attempts, a pipeline folder's claim).

Every artifact is written with a record of what it was made from, its **key**: the step, the content digest of each
model it read (:func:`dsh.llm.models.weights_digest`), its settings and its seed. An artifact is reused when its
record holds the key asked for now, field by field, as JSON reads both back (a tuple and a list, a path and its
string are the same); otherwise its step runs and writes the artifact and its record atomically
(:func:`dsh.core.files.atomic_write`). Fields of the record beyond the key (a study's results, a run's output folder)
are not compared. A cached artifact that has no record of its own beside it is named by :func:`key_digest`.
"""

from __future__ import annotations

import hashlib
import json
import zlib

from .files import read_json


def as_json(x):
    """``x`` as JSON reads it back (tuples as lists, paths and other objects as their strings)."""
    return json.loads(json.dumps(x, default=str))


def differences(record: dict | None, key: dict) -> list[str]:
    """The fields of ``key`` whose value in ``record`` differs (every field when there is no record): [] when
    ``record`` was made from ``key``."""
    if not isinstance(record, dict):
        return sorted(key)
    rec, want = as_json(record), as_json(key)
    return [k for k in sorted(want) if rec.get(k) != want[k]]


def made_from(record: dict | None, key: dict) -> bool:
    """Whether ``record`` was made from ``key`` (:func:`differences` is empty): the rule that decides every reuse."""
    return not differences(record, key)


def read_record(path) -> dict | None:
    """The JSON object in ``path`` (gzipped when its name ends in ``.gz``); None when there is none (no file,
    unreadable, cut or damaged, not an object)."""
    try:
        got = read_json(path)
    except (OSError, ValueError, EOFError, zlib.error):
        return None
    return got if isinstance(got, dict) else None


def reusable(path, key: dict) -> dict | None:
    """The record in ``path`` when it was made from ``key`` (:func:`made_from`), else None (the step must run)."""
    record = read_record(path)
    return record if made_from(record, key) else None


def key_digest(key: dict) -> str:
    """SHA-256 of ``key`` as canonical JSON (sorted keys): the name of a cached artifact made from it."""
    return hashlib.sha256(json.dumps(as_json(key), sort_keys=True).encode()).hexdigest()
