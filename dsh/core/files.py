"""Writing files so that a failure leaves nothing half-written: every writer goes through
:func:`atomic_write` (a temporary file in the same folder, renamed into place)."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
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


_PARTIAL = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")   # atomic_write's temporary name (tempfile.mkstemp)


def remove_partial_writes(folder) -> list[Path]:
    """Remove, directly in ``folder``, the temporary files :func:`atomic_write` leaves when its process is killed
    (SIGKILL gives it no chance to clean up) and return them; call it only while holding the folder (nothing else
    writes there)."""
    folder = Path(folder)
    gone = [f for f in folder.iterdir() if f.is_file() and _PARTIAL.match(f.name)] if folder.is_dir() else []
    for f in gone:
        f.unlink()
    return gone


def readable(folder) -> Path:
    """Give ``folder`` and everything in it the modes a plain ``open`` would (0666 / 0777 less the umask):
    transformers writes ``model.safetensors`` through a private temporary (mode 0600), so a saved model would be
    unreadable to the other users of a shared folder."""
    folder = Path(folder)
    umask = os.umask(0)
    os.umask(umask)
    for p in [folder, *folder.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)
    return folder


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)   # a full disk, a quota, a file size limit


@contextlib.contextmanager
def writing(where):
    """Run a block that writes ``where`` (a file or folder) and turn the errors a full disk (or a quota, or a file
    size limit) raises there, whatever library writes (an OSError, safetensors' SafetensorError, torch's
    RuntimeError of its zip writer), into one OSError that names ``where``: the command line prints it as one line.
    Other errors pass unchanged."""
    try:
        yield
    except OSError as e:
        if e.errno in FULL:
            raise _full(e.errno, where) from None
        raise
    except RuntimeError as e:   # torch.save's
        if _cut_write(e):
            raise OSError(errno.ENOSPC, "a write failed (full disk or file size limit?): free space and run "
                                        "again", str(where)) from None
        raise
    except Exception as e:      # noqa: BLE001 - safetensors' error class is its Rust module's own
        m = re.search(r"os error (\d+)", str(e))
        if type(e).__name__ == "SafetensorError" and m and int(m.group(1)) in FULL:
            raise _full(int(m.group(1)), where) from None
        raise


def _full(code: int, where) -> OSError:
    """The one-line error of a write refused for space (``code``: ENOSPC, EDQUOT or EFBIG) at ``where``."""
    return OSError(code, f"{os.strerror(code)}: free space and run again", str(where))


def _cut_write(e: RuntimeError) -> bool:
    """Whether torch's zip writer failed to write (its messages for a short write: ``file write failed``,
    ``unexpected pos``)."""
    msg = str(e)
    return "inline_container" in msg and ("write failed" in msg or "unexpected pos" in msg)


@contextlib.contextmanager
def exclusive(target, refusal: str):
    """Hold an exclusive lock on ``target`` (a hidden ``.<name>.lock`` file beside it) while the block runs: a second
    process asking for the same target gets a one-line ValueError (``refusal``, then where the lock is) instead of
    writing beside the first. The lock is the operating system's (``flock``): a killed holder releases it, and the
    file is removed when the block ends (one left by a killed holder is reported on stderr and removed). A folder
    made here for the lock is removed again if left empty."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    target = Path(target)
    made = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    stale = lock.exists()
    try:
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise ValueError(f"{refusal} (lock {lock})") from None
            if stale:   # its holder is gone (a living one holds the flock): say so, it is removed below
                print(f"[dsh] a lock left by a process that is gone was cleared: {lock}", file=sys.stderr)
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)
                fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        if made and target.parent.is_dir() and not any(target.parent.iterdir()):
            target.parent.rmdir()


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


MAX_LINE_BYTES = 16 * 2 ** 20     # a longer line is not one record (a model response, a metrics row)


def read_jsonl(path, strict: bool = True, check=None, what: str = "FILE") -> list[dict]:
    """The records (JSON objects) of the JSON-lines file ``path``, read as UTF-8 (a byte-order mark and CRLF line
    ends accepted; ``.gz`` read through gzip), blank lines skipped. ``check(record)`` may raise a ValueError
    ``"<anything>: <why>"`` for a record it refuses.

    ``strict``: a line that is not UTF-8, not JSON, not an object, longer than ``MAX_LINE_BYTES`` or refused by
    ``check`` raises a one-line ValueError naming the file and the line (``what`` names the argument when the file
    is missing). Lenient (``strict=False``): such lines are skipped, and a missing file reads as no records (a
    working file that an interruption cut mid-line is resumed)."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"{what} must be a JSON-lines file path, got {path!r}")
    p = Path(path)
    if not p.is_file():
        if not strict and not p.exists():
            return []
        raise ValueError(f"{what} must be an existing JSON-lines file; {path} not found" if not p.exists() else
                         f"{what} must be a JSON-lines file; {path} is a folder")
    recs = []
    try:
        _read_lines(p, strict, check, recs)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:      # a .gz cut short or not gzip at all
        if strict:
            raise ValueError(f"{p.name}: the gzip data is cut or damaged ({type(e).__name__}: "
                             f"{str(e).strip() or 'ends early'}); {len(recs)} records before it") from None
    return recs


def _read_lines(p: Path, strict: bool, check, recs: list) -> None:
    with (gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")) as f:
        for i, raw in enumerate(f, start=1):
            try:
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"longer than {MAX_LINE_BYTES // 2 ** 20} MB; a record holds one response")
                try:
                    line = raw.decode("utf-8-sig" if i == 1 else "utf-8")
                except UnicodeDecodeError:
                    raise ValueError("not UTF-8 text") from None
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"not valid JSON ({e.msg})") from None
                except RecursionError:
                    raise ValueError("nested too deeply to be a record") from None
                if check is not None:
                    try:
                        check(r)
                    except ValueError as e:
                        raise ValueError(str(e).split(": ", 1)[-1]) from None
                if not isinstance(r, dict):
                    raise ValueError(f"a record must be a JSON object, got {type(r).__name__}")
            except ValueError as e:
                if strict:
                    raise ValueError(f"{p.name} line {i}: {e}") from None
                continue
            recs.append(r)


def write_gz(path, fill) -> Path:
    """What ``fill(stream)`` writes, gzipped into ``path`` atomically, with no file name and no timestamp in the
    header: the same content gives the same bytes (a name given to ``GzipFile`` would be the temporary file's,
    random)."""

    def w(tmp):
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as g:
            fill(g)

    return atomic_write(path, w)


def gzip_copy(src, dst) -> Path:
    """``src`` gzipped into ``dst`` (:func:`write_gz`: the same input gives the same bytes)."""

    def fill(g):
        with open(src, "rb") as f:
            shutil.copyfileobj(f, g)

    return write_gz(dst, fill)


def write_jsonl_gz(path, records) -> Path:
    """Records as gzipped JSON lines (:func:`write_gz`: the same records give the same bytes)."""

    def fill(g):
        for r in records:
            g.write((json.dumps(r) + "\n").encode())

    return write_gz(path, fill)


def write_json_gz(path, obj) -> Path:
    """One JSON object, gzipped (:func:`write_gz`: the same object gives the same bytes): a study record of many
    thousand rows at about an eighth of its indented text."""
    return write_gz(path, lambda g: g.write(json.dumps(obj).encode()))


def read_json(path):
    """The JSON value in ``path``, read through gzip when the name ends in ``.gz``. Raises OSError (no file, or gzip
    data that is not gzip), EOFError or zlib.error (gzip cut short or damaged) or ValueError (not JSON)."""
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "rb") as f:
            return json.loads(f.read())
    return json.loads(p.read_text())
