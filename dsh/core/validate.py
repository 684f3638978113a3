"""Argument checks shared by the public functions of :mod:`dsh`.

Every check raises a one-line ``ValueError`` that names the argument and the valid values,
before any heavy work starts.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from pathlib import Path


def probability(name: str, value) -> float:
    """Return ``value`` as a float after checking that it lies in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(float(value)):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return v


def gamma(value, name: str = "gamma") -> float:
    """Return the discount factor after checking that it lies in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(float(value)):
        raise ValueError(f"{name} must be a discount factor in (0, 1], got {value!r}")
    v = float(value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"{name} must be a discount factor in (0, 1], got {value!r}")
    return v


def length(name: str, value, minimum: int = 0) -> int:
    """Return ``value`` as an int after checking that it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def at_most(name: str, value, bound: int, why: str) -> int:
    """Return ``value`` (an integer >= 1) after checking that it is at most ``bound``; ``why`` says what the bound
    protects (memory, time), in the one-line error."""
    value = positive_int(name, value)
    if value > bound:
        raise ValueError(f"{name} must be an integer in 1..{bound:,} ({why}); got {value:,}")
    return value


def names(name: str, value) -> tuple:
    """A list of names (levels, objectives) as a tuple of strings: a list or tuple of strings, or one comma-separated
    string ("1x1,2x2", what papermill's ``-p`` gives); a one-line ValueError otherwise (a bare string is not taken
    apart into its characters)."""
    if isinstance(value, str):
        value = [x.strip() for x in value.split(",") if x.strip()]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(x, str) and x for x in value):
        raise ValueError(f"{name} must be a non-empty list of names or one comma-separated string; got {value!r}")
    return tuple(value)


def positive_int(name: str, value) -> int:
    """Return ``value`` after checking that it is an integer >= 1."""
    return length(name, value, minimum=1)


def real(name: str, value) -> float:
    """Return ``value`` as a finite float."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def temperature(name: str, value) -> float:
    """A sampling temperature: a finite number >= 0 (0: greedy)."""
    if real(name, value) < 0:
        raise ValueError(f"{name} must be a number >= 0 (0: greedy), got {value!r}")
    return float(value)


def within_context(name: str, tokens: int, context: int | None) -> int:
    """A token limit no larger than a model's context (``context`` None: unknown, not checked)."""
    if context and tokens > context:
        raise ValueError(f"{name} must be at most the model's context of {context:,} tokens; got {tokens:,}")
    return tokens


def collection(name: str, value, what: str, nonempty: bool = False) -> list:
    """``value`` as a list, refused in one line (naming ``what`` it must hold) when it is not a collection: a string,
    bytes, a single mapping, a number, None; and, with ``nonempty``, when it is empty."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a {'non-empty ' if nonempty else ''}list of {what}, got {type(value).__name__}")
    out = list(value)
    if nonempty and not out:
        raise ValueError(f"{name} must be a non-empty list of {what}, got an empty one")
    return out


def choice(name: str, value, valid) -> str:
    """Return ``value`` after checking that it is one of ``valid``."""
    valid = list(valid)
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(str, valid))}; got {value!r}")
    return value


def output_path(name: str, path, kind: str = "file") -> Path:
    """Return ``path`` as a Path after checking that a ``kind`` ("file" or "folder") can be written there: it is
    not an existing item of the other kind, and no existing parent is a file."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"{name} must be a {kind} path, got {path!r}")
    p = Path(path)
    if p.exists() and (p.is_dir() if kind == "file" else not p.is_dir()):
        raise ValueError(f"{name} must be a {kind} path; {p} is a {'folder' if p.is_dir() else 'file'}")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{name} cannot be written: {parent} is a file, not a folder")
            break
    return p


IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})


def papermill_parameters(known, namespace) -> None:
    """Refuse a papermill parameter the chapter does not have: ``known`` is the chapter's namespace as its
    parameters cell left it (``set(globals())`` at its end), ``namespace`` the one after papermill's injected cell;
    a value that appeared in between (not IPython's ``_...``, not a module, function or class the cell imported) was
    passed with ``-p``/``-r`` but is no parameter of the chapter, which papermill only warns about. One-line
    ValueError naming it and the valid ones."""
    import types

    unknown = sorted(k for k, x in namespace.items() if not k.startswith("_") and k not in known and k != "PARAMETERS"
                     and not callable(x) and not isinstance(x, types.ModuleType))   # imports are no parameters
    if unknown:
        valid = sorted(k for k in known if not k.startswith("_") and k not in IPYTHON_NAMES)
        raise ValueError(f"unknown papermill parameter(s) {', '.join(unknown)}; this chapter's parameters: "
                         f"{', '.join(valid)}")
