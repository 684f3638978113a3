"""Where a chapter's relative paths point: the same folder whichever directory papermill (or a reader's Jupyter)
runs the chapter from.

A chapter's path parameters (``committed_results = "../book/results"``, ``runs_dir = "runs/book/laptop-live"``)
are written relative to the ``chapters/`` folder, where the book build runs them. :func:`chapter_path` resolves
such a path against that folder, found from the installed package (a checkout installed with ``pip install -e``)
or, failing that, from the working directory (the repository root or ``chapters/`` itself); an absolute path is
kept as given.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = "_toc.yml"       # the book's table of contents: the repository root holds it beside chapters/


def chapters_dir() -> Path | None:
    """The repository's ``chapters/`` folder, or None outside a checkout of the book."""
    here = Path(__file__).resolve().parents[2]             # dsh/core/paths.py -> the checkout an editable install uses
    for root in (here, Path.cwd(), Path.cwd().parent):
        if (root / MARKER).is_file() and (root / "chapters").is_dir():
            return (root / "chapters").resolve()
    return None


def chapter_path(name: str, value, must_exist: bool = False) -> Path:
    """The chapter parameter ``name`` (a path, relative to ``chapters/`` unless absolute) as an absolute Path; with
    ``must_exist``, a one-line ValueError naming the path when nothing is there (a chapter then stops instead of
    reporting "nothing committed")."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(f"{name} must be a folder path, got {value!r}")
    p = Path(value).expanduser()
    if not p.is_absolute():
        base = chapters_dir()
        if base is None:
            raise ValueError(f"{name} {str(value)!r} is relative to the book's chapters/ folder, which is not found "
                             f"from {Path.cwd()}; run the chapter inside the dsh repository or give an absolute path")
        p = base / p
    p = Path(os.path.normpath(p))
    if must_exist and not p.exists():
        raise ValueError(f"{name}: {p} does not exist (given {str(value)!r}, relative to the chapters/ folder)")
    return p


def repo_relative(path) -> str:
    """``path`` as a page shows it: relative to the repository root when it lies inside it (no machine's folders
    on a rendered page), else as given."""
    base = chapters_dir()
    p = Path(path)
    try:
        return p.resolve().relative_to(base.parent).as_posix() if base is not None else str(p)
    except ValueError:
        return str(p)
