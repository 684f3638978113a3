"""Typed settings: one reader for every ``KEY=VALUE`` a user types (``--set``, ``--eval-set``, ``--attribution-set``)
and for the values of papermill's ``overrides`` mappings.

A value is read by the type its dataclass field declares, never guessed from its spelling: a boolean field takes
true/false/1/0/yes/no/on/off (any case) and nothing else, so ``trust_remote_code=False`` is ``False`` and not the
truthy string ``"False"``; an integer field takes an integer (``1e3`` is refused, not rounded); a list field takes a
comma-separated list or a JSON list; ``None`` is taken only where the field admits it (``none`` or ``null``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing

TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")
NONE = ("none", "null")


def _parts(annotation) -> tuple:
    """The types a field admits: ``int | None`` -> (int, NoneType); a plain type -> (type,)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return (origin or annotation,)


@functools.cache        # every TrainConfig built checks its booleans with it: resolve the annotations once a class
def field_types(cls) -> dict:
    """Field name -> the tuple of types it admits, for a dataclass ``cls`` (annotations resolved; not to be
    modified: the answer is shared)."""
    hints = typing.get_type_hints(cls)
    return {f.name: _parts(hints[f.name]) for f in dataclasses.fields(cls)}


def _describe(kinds) -> str:
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list",
             list: "a list", dict: "a JSON object", type(None): "none"}
    return " or ".join(words.get(k, getattr(k, "__name__", str(k))) for k in kinds)


def _from_text(name: str, text: str, kinds: tuple):
    low = text.strip().lower()
    if type(None) in kinds and low in NONE:
        return None
    for kind in kinds:
        if kind is bool:
            if low in TRUE + FALSE:
                return low in TRUE
        elif kind is int:
            try:
                return int(text.strip(), 10)
            except ValueError:
                pass
        elif kind is float:
            try:
                x = float(text)
            except ValueError:
                continue
            if math.isfinite(x):
                return x
        elif kind in (tuple, list):
            if text.strip().startswith("["):
                try:
                    got = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if isinstance(got, list):
                    return tuple(got)
                continue
            return tuple(x.strip() for x in text.split(",") if x.strip())
        elif kind is dict:
            try:
                got = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(got, dict):
                return got
        elif kind is str:
            return text
    raise ValueError(f"{name} must be {_describe(kinds)}; got {text!r}")


def coerce(name: str, value, kinds: tuple):
    """``value`` for a field admitting ``kinds``: text is read by those types (:func:`_from_text`); a value of
    another type is kept where it is of an admitted kind (an int where a float is admitted; a list as a tuple) and
    refused in one line otherwise. A boolean field takes a real bool only."""
    if isinstance(value, str) and str not in kinds:
        return _from_text(name, value, kinds)
    if value is None:
        if type(None) in kinds:
            return None
        raise ValueError(f"{name} must be {_describe(kinds)}; got None")
    if bool in kinds and isinstance(value, bool):
        return value
    if isinstance(value, bool):            # True is an int to Python; not to a setting
        raise ValueError(f"{name} must be {_describe(kinds)}; got {value!r}")
    for kind in kinds:
        if kind is float and isinstance(value, (int, float)):
            return value
        if kind in (tuple, list) and isinstance(value, (list, tuple)):
            return tuple(value)
        if kind not in (float, tuple, list) and isinstance(value, kind):
            return value
    raise ValueError(f"{name} must be {_describe(kinds)}; got {value!r}")


def typed(cls, values: dict, name: str = "overrides") -> dict:
    """``values`` (field -> value or text) read by the fields' declared types of dataclass ``cls``; an unknown field
    is refused in one line naming ``name`` and the valid fields."""
    if not isinstance(values, dict):
        raise ValueError(f"{name} must be a mapping of {cls.__name__} fields to values, got {values!r}")
    kinds = field_types(cls)
    unknown = sorted(k for k in values if k not in kinds)
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {', '.join(map(str, unknown))}; {cls.__name__}'s fields: "
                         f"{', '.join(kinds)}")
    return {k: coerce(k, x, kinds[k]) for k, x in values.items()}


def assignments(flag: str, items, fixed: dict | None = None) -> dict:
    """``KEY=VALUE`` strings (``flag``'s repeated values) as a dict of key -> text: each value is read by its
    field's declared type where the settings are made (:func:`typed`). ``fixed``: keys the command sets itself (key
    -> the flag to use instead), refused in one line."""
    out = {}
    for item in items or ():
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"{flag} must look like key=value; got {item!r}")
        k, text = item.split("=", 1)
        k = k.strip()
        if fixed and k in fixed:
            raise ValueError(f"{flag} {k}=... is not taken by this command: use {fixed[k]}")
        out[k] = text
    return out
