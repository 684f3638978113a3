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


def positive_int(name: str, value) -> int:
    """Return ``value`` after checking that it is an integer >= 1."""
    return length(name, value, minimum=1)


def real(name: str, value) -> float:
    """Return ``value`` as a finite float."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


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
