"""Frozen schema dataclasses from plain data: validation with errors that name the field, and
their mutable mirrors for Hydra.

`build(cls, data, where)` makes a `cls` (a frozen, keyword-only dataclass whose fields may be
nested dataclasses, Optional, Dict, List, bool, int, float or str) from a plain dict, checking
unknown keys, missing required fields, types and the ranges its fields' metadata state (`min`,
`strict`, `max`, `choices`, `items`, `fraction`: {size > 0: fraction in (0, 1]}, `curves`:
{name: {size: time > 0}}, `positive_values`, `by_size`: {size > 0: value >= 0}), and raises
`TopologyError` naming the field (`topology.intra.link.bandwidth_gbps=-1: must be > 0`).
`hydra_schema(cls)` mirrors such a class as the mutable dataclass Hydra composes against (every
field optional, so ranges and required fields are checked by `build` when the run loads it).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import field
from typing import Dict, List, Optional, Union


class TopologyError(ValueError):
    """A topology value that is missing, of the wrong type or out of range (names the field)."""


# keys that moved, where they are now: a file written before says so instead of "unknown key"
MOVED = {
    "topology.peer_memory_gbps": "topology.device.stream_memory_gbps (one streaming rate "
    "for a step's kernels and comm=shm's peer reads)"
}


def build(cls, data, where: str):
    if not isinstance(data, dict):
        raise TopologyError(
            f"{where}={data!r}: must be a mapping with keys "
            f"{', '.join(f.name for f in dataclasses.fields(cls))}"
        )
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names and f"{where}.{key}" in MOVED:
            raise TopologyError(f"{where}.{key}: moved to {MOVED[f'{where}.{key}']}")
        if key not in names:
            raise TopologyError(f"{where}.{key}: unknown key (known: {', '.join(sorted(names))})")
    values = {}
    for f in dataclasses.fields(cls):
        path = f"{where}.{f.name}"
        if f.name not in data or data[f.name] is None and not _optional(hints[f.name]):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TopologyError(f"{path}: missing (required)")
            continue
        values[f.name] = _value(hints[f.name], data[f.name], path)
        _check_range(f, values[f.name], path)
    return cls(**values)


def _optional(tp) -> bool:
    return typing.get_origin(tp) is Union and type(None) in typing.get_args(tp)


def _value(tp, value, path: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        if value is None:
            return None
        return _value(next(a for a in args if a is not type(None)), value, path)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise TopologyError(f"{path}={value!r}: must be a mapping")
        return {
            _value(args[0], k, f"{path}[{k!r}]"): _value(args[1], v, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    if origin in (list, List):
        if not isinstance(value, (list, tuple)):
            raise TopologyError(f"{path}={value!r}: must be a list")
        return [_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    return _scalar(tp, value, path)


def _scalar(tp, value, path: str):
    if tp is bool:
        if not isinstance(value, bool):
            raise TopologyError(f"{path}={value!r}: must be true or false")
        return value
    if tp is int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            and not (isinstance(value, str) and value.isdigit())
        ):
            raise TopologyError(f"{path}={value!r}: must be an integer")
        return int(value)
    if tp is float:
        try:
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
        except (TypeError, ValueError):
            raise TopologyError(f"{path}={value!r}: must be a number") from None
        if not math.isfinite(out):
            raise TopologyError(f"{path}={value!r}: must be finite")
        return out
    if tp is str:
        if not isinstance(value, str):
            raise TopologyError(f"{path}={value!r}: must be a string")
        return value
    raise TypeError(f"unsupported schema type {tp} at {path}")  # pragma: no cover


def _check_range(f, value, path: str) -> None:
    meta = f.metadata
    if value is None:
        return
    if "min" in meta and isinstance(value, (int, float)):
        if value < meta["min"] or meta.get("strict") and value == meta["min"]:
            op = ">" if meta.get("strict") else ">="
            raise TopologyError(f"{path}={value!r}: must be {op} {meta['min']:g}")
    if "max" in meta and value > meta["max"]:
        raise TopologyError(f"{path}={value!r}: must be <= {meta['max']:g}")
    if "choices" in meta and value not in meta["choices"]:
        raise TopologyError(f"{path}={value!r}: must be one of {', '.join(meta['choices'])}")
    if "items" in meta:
        for v in value:
            if v not in meta["items"]:
                raise TopologyError(f"{path}: {v!r} must be one of {', '.join(meta['items'])}")
    if meta.get("fraction"):
        for k, v in value.items():
            if k <= 0 or not 0 < v <= 1:
                raise TopologyError(f"{path}[{k}]={v!r}: sizes must be > 0 and fractions in (0, 1]")
    if meta.get("curves"):
        for name, curve in value.items():
            for k, v in curve.items():
                if k <= 0 or v <= 0:
                    raise TopologyError(
                        f"{path}[{name!r}][{k!r}]={v!r}: sizes and times must be > 0"
                    )
    if meta.get("by_size"):
        for k, v in value.items():
            if k <= 0 or v < 0:
                raise TopologyError(f"{path}[{k!r}]={v!r}: sizes must be > 0 and values >= 0")
    if meta.get("positive_values"):
        for k, v in value.items():
            if v <= 0:
                raise TopologyError(f"{path}[{k!r}]={v!r}: must be > 0")


def hydra_schema(cls, name: Optional[str] = None, extra: tuple = ()):
    """A mutable, OmegaConf-compatible mirror of a frozen schema class (every field optional,
    defaulting to None/empty, so ranges and required fields are checked by `from_dict`)."""
    hints = typing.get_type_hints(cls)
    made = []
    for f in dataclasses.fields(cls):
        tp = _mirror(hints[f.name])
        if dataclasses.is_dataclass(_inner(hints[f.name])):
            made.append((f.name, Optional[tp], field(default=None)))
        elif f.default_factory is not dataclasses.MISSING:
            made.append((f.name, tp, field(default_factory=f.default_factory)))
        else:
            default = None if f.default is dataclasses.MISSING else f.default
            made.append((f.name, Optional[tp], field(default=default)))
    return dataclasses.make_dataclass(
        name or f"{cls.__name__}Conf", made + list(extra), kw_only=True
    )


def _inner(tp):
    if typing.get_origin(tp) is Union:
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _mirror(tp):
    tp = _inner(tp)
    if dataclasses.is_dataclass(tp):
        return hydra_schema(tp)
    return tp
