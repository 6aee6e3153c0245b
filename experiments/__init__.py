"""The paper's experiments, one module each.

Every module defines `NAME`, `FIGURE` (the paper figure it reproduces), `program()` (the
unscheduled DSL program), `schedules()` (paper schedule name -> scheduled program, derived from
`program()` by `dsl.transforms`, the unscheduled one included) and `verify_bindings(scale)` (size
bindings to check the schedules at, P excluded). A module that can be measured on local ranks also
defines `measure(settings: MeasureSettings) -> list[dict]` (rows of the results table, each also
appended to `settings.csv_path` as soon as it is measured).

Every run also predicts (`experiments._predict`: the cost model on the local topology at the
measured points and on the paper's setting; with backend=sim on the chosen topology only). A
module with its own predictions defines `predict(settings: PredictSettings) -> list[dict]`.
`calibrate` and `collectives` have no DSL program (no `program`/`schedules`): they measure and
predict microbenchmarks and collectives; `calibrate` sets `NEEDS_MEASUREMENT` (backend=cpu only).
`validate` has neither program nor measurement: it predicts the published collective
measurements (cost_model/data) on their systems' topologies.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

PROGRAMS: tuple[str, ...] = ("adam_fusion", "lamb_fusion", "model_parallel", "pipeline_parallel")
EXPERIMENTS: tuple[str, ...] = PROGRAMS + ("calibrate", "collectives", "validate")  # PROGRAMS: with a DSL program


def load(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"experiments.{name}")


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    scale: str  # smoke | default | paper: picks the size sweep
    max_elements: int  # the largest principal tensor to measure
    world_size: int
    warmup: int
    repeats: int
    csv_path: Path  # results.csv of the run
    kernels_dir: Path  # where the generated sources are written
    seed: int = 0
    timeout_s: float = 1800.0  # the whole measurement; a hung rank ends the run after this
    backend: str = "cpu"  # codegen.runtime.backend.get(backend): where the ranks run (rows say it)


@dataclass(frozen=True, kw_only=True)
class PredictSettings:
    scale: str
    backend: str  # cpu: predict the measured points (local) and the paper's setting; sim: topology
    topology: object  # cost_model.topology.Topology of the run
    world_size: int
    max_elements: int
    measured: list  # the rows this run measured (empty with backend=sim)
    out_dir: Path
    sizes: Optional[list] = None  # experiment.sizes: bindings replacing the sweep
