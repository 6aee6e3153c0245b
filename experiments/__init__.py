"""The paper's experiments, one module each.

Every module defines `NAME`, `FIGURE` (the paper figure it reproduces), `program()` (the
unscheduled DSL program), `schedules()` (paper schedule name -> scheduled program, derived from
`program()` by `dsl.transforms`, the unscheduled one included) and `verify_bindings(scale)` (size
bindings to check the schedules at, P excluded).
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS: tuple[str, ...] = ("adam_fusion", "lamb_fusion", "model_parallel", "pipeline_parallel")


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"experiments.{name}")
