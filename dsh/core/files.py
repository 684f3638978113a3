"""Writing files so that a failure leaves nothing half-written: every writer goes through
:func:`atomic_write` (a temporary file in the same folder, renamed into place)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write(path, write) -> Path:
    """Call ``write(tmp)`` on a temporary path beside ``path`` and move it into place; on any error the
    temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_text(path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_jsonl(records, path) -> Path:
    """Write records as JSON lines atomically."""

    def w(tmp):
        with open(tmp, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    return atomic_write(path, w)


def read_jsonl(path) -> list[dict]:
    """The JSON lines of ``path`` (blank lines skipped)."""
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def gzip_copy(src, dst) -> Path:
    """``src`` gzipped into ``dst`` atomically (no timestamp in the header: the same input gives the same bytes)."""

    def w(tmp):
        with open(src, "rb") as f, gzip.GzipFile(tmp, "wb", mtime=0) as g:
            shutil.copyfileobj(f, g)

    return atomic_write(dst, w)
