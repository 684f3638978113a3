"""What :mod:`dsh.llm.products` measured about this machine's matrix products (which library was faster at a shape,
where oneDNN agrees with torch bit for bit, which row counts need a split to be thread-independent, where the decoding
step in C gives torch's product bit for bit, from the weight as it is or packed ahead, over all rows or in parts of
the rows on one thread each, and where its own panel product does, at which chunk), kept on disk, so that a
process reads what an earlier one on this machine measured instead of measuring it again (0.07-0.1 s of a fresh
process's first 700-question evaluation on the 2-core machine, whose products take ~0.65 s).

One file per machine and library build, ``$DSH_CACHE/products/<key>.json`` (default ``~/.cache/dsh``): the key is a
digest of everything that decides which code a library runs, the CPU's model and flags, torch's version and build
configuration (its MKL and oneDNN), the thread count and the ``MKL_*``, ``ONEDNN_*``, ``DNNL_*``, ``OMP_*``, ``KMP_*``
and ``GOMP_*`` variables. Decisions are written by :func:`flush`, at the latest when the process exits (merged with
what another process wrote, then replaced atomically); an unreadable file counts as empty and an unwritable folder
keeps the decisions in the process.
The bit-for-bit checks give the same answer each time on one key; a timing could go either way on a near tie, so a
stored one fixes the choice for later processes (both choices give the same bits: a timing only picks among ways that
agree).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import tempfile
from pathlib import Path

from ..core import store
from ..core.provenance import cpu_feature_line, cpu_model

TABLES = ("faster", "agrees", "splits", "sgemm", "packed", "parts", "panels")
ENV_PREFIXES = ("MKL_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "GOMP_")
MISSING = object()       # what :func:`recall` answers for a decision not on disk

_READ: dict = {}         # path -> {table: {key tuple: value}} as read, and as decided, in this process
_PENDING: set = set()    # the paths with decisions not yet written


@functools.cache
def _build() -> tuple:
    """The CPU and torch's build (read once a process)."""
    import torch

    return cpu_model(), cpu_feature_line(), f"{torch.__version__}\n{torch.__config__.show()}"


def _variables() -> dict:
    """The environment variables of :data:`ENV_PREFIXES`, sorted (only their values read: ~5 us)."""
    return {k: os.environ[k] for k in sorted(k for k in os.environ if k.startswith(ENV_PREFIXES))}


def machine_key() -> dict:
    """What decides which code the products run on this machine and in this process (the file's key)."""
    import torch

    cpu, features, build = _build()
    return {"cpu": cpu, "features": features, "torch": build, "threads": torch.get_num_threads(), "env": _variables()}


_PATHS: dict = {}        # (cache folder, home, threads, variables) -> the file's path, once per process


def path() -> Path:
    """This machine's file (:func:`machine_key`) under ``$DSH_CACHE/products``; its digest computed once per process
    for each thread count and setting of the variables (the decoding step's products ask for it at every row count
    they meet: 0.2 ms a digest, a few hundred in a fresh process's 700-question evaluation)."""
    import torch

    memo = (os.environ.get("DSH_CACHE"), os.environ.get("HOME"), torch.get_num_threads(), tuple(_variables().items()))
    if memo not in _PATHS:
        root = Path(os.environ.get("DSH_CACHE") or Path.home() / ".cache" / "dsh")
        _PATHS[memo] = root / "products" / f"{store.key_digest(machine_key())[:24]}.json"
    return _PATHS[memo]


def _load(p: Path) -> dict:
    tables = {t: {} for t in TABLES}
    try:
        raw = json.loads(p.read_text())
        for t in TABLES:
            tables[t] = {tuple(row[:-1]): row[-1] for row in raw.get(t, [])}
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return tables


def _tables(p: Path) -> dict:
    if p not in _READ:
        _READ[p] = _load(p)
    return _READ[p]


def _checked(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"table must be one of {', '.join(TABLES)}; got {table!r}")
    return table


def recall(table: str, key: tuple):
    """The stored decision ``key`` of ``table`` (one of :data:`TABLES`) on this machine, or :data:`MISSING`."""
    return _tables(path())[_checked(table)].get(tuple(key), MISSING)


def table(name: str) -> dict:
    """Every stored decision of table ``name`` (one of :data:`TABLES`) on this machine: key tuple -> value (a copy)."""
    return dict(_tables(path())[_checked(name)])


def stored() -> int:
    """How many decisions this machine's file holds now (0 where there is none or it cannot be read)."""
    return sum(len(rows) for rows in _load(path()).values())


def remember(table: str, key: tuple, value) -> None:
    """Take ``value`` (a bool, int or None) as decision ``key`` of ``table`` on this machine; written to its file by
    :func:`flush` (at the latest when the process exits)."""
    p = path()
    _tables(p)[_checked(table)][tuple(key)] = value
    if not _PENDING:
        atexit.register(flush)
    _PENDING.add(p)


def flush() -> None:
    """Write the decisions this process made to their files: merged with each file as it is now (its entries kept), then
    replaced atomically; where a folder cannot be written, they stay in this process only."""
    while _PENDING:
        p = _PENDING.pop()
        tables = _load(p)
        for t, rows in _READ[p].items():
            tables[t] = {**rows, **tables[t]}
        _READ[p] = tables
        tmp = None
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".decisions-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({t: [[*k, v] for k, v in rows.items()] for t, rows in tables.items()}, f)
            os.replace(tmp, p)
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
