"""The experiment kinds: what every experiment fills in, shipped or a user's own.

Experiments are frozen, keyword-only records. A program experiment (`Experiment`: a DSL step
compared with the library code a practitioner writes) fills in:

- `name`, `figure`: its name on the command line, the paper figure it reproduces (or what it shows);
- `program(dtype)`: the unscheduled DSL program; `schedules(dtype)`: schedule name -> scheduled
  program, derived from it by `dsl.transforms` (the unscheduled one included);
- `verify_bindings(scale)`: size bindings to check every schedule at (`dsl.check_equivalent`);
- `points(scale, max_elements)`: size bindings to measure at (the sweep);
- `baseline(ctx)`: the library baseline on one rank (see `Baseline`, `BaselineContext`); without
  one the experiment is verified and predicted, not measured;
- `principal`: the size symbols whose product is the `size` column (N; or S, B, H);
- `paper`: the paper's setting to predict (`PaperSetting`), or None.

and optionally `measure_worlds` (world sizes to measure at; default: the run's), `split_schedule`
(whose communication an overlapped `ol(...)` schedule is compared with), `check_bindings` (where
the baseline is checked against `dsl.interpret`; default the first verification binding).

The measurement (`experiments.harness.measure`) and the predictions (`experiments.predict`) work
from these fields alone: `Experiment.measure(settings)` and `.predict(settings)` call them.

Every experiment is one of three kinds, each with only the fields it needs, and all answer the
`ExperimentKind` protocol (`experiments.api`) the orchestration (`suite`) calls:

- `Experiment`: a DSL program, as above.
- `MeasurementExperiment`: no DSL program (calibrate, collectives, training, validate); its own
  `measure(settings)` (left out: nothing measured here) and `predict(settings)`, `summary(measured,
  predicted)` (the table a run ends with), `fits_topology` (the run makes its own calibration),
  `needs_measurement` (runs with backend=cpu only).
- `DerivedExperiment`: made from another (`target=NAME`, autotune): `derive(target, settings)`
  returns the `Experiment` to run (the target with the schedules it chose) and
  `recorded(target, run_dir)` the same one again from a finished run's directory (the report's
  rebuild).

Units: sizes in elements (bytes for collectives), times in milliseconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

import numpy as np

from . import harness, predict
from .api import (
    Baseline,
    BaselineContext,
    DeriveSettings,
    MeasureSettings,
    PaperSetting,
    PredictSettings,
)

Bindings = Mapping[str, int]
_log = logging.getLogger("experiments.predict")  # a program experiment's prediction progress


def _no_bindings(scale: str) -> list:
    return []


def _no_points(scale: str, max_elements: int) -> list:
    return []


def _no_summary(measured: list, predicted: list) -> Optional[str]:
    return None


def _measures_nothing(settings: MeasureSettings) -> list:
    return []


@dataclass(frozen=True, kw_only=True)
class _Kind:
    """The fields every kind has, and the defaults of the methods a kind does not need."""

    name: str
    figure: str
    doc: str = field(default="", compare=False)
    fits_topology: bool = False
    needs_measurement: bool = False
    has_program = False
    paper = None  # where the paper ran it (`Experiment.paper`: program experiments)

    def summary(self, measured: list, predicted: list) -> Optional[str]:
        return None

    def section(self, df, out_dir: Path) -> str:
        return ""


@dataclass(frozen=True, kw_only=True)
class Experiment(_Kind):
    """A DSL-program experiment (the module doc lists its fields): verified, measured by the
    harness against its baseline, predicted by the cost model, all from these fields alone."""

    program: Callable[..., object]  # (dtype=f32) -> dsl.Program
    schedules: Callable[..., dict]  # (dtype=f32) -> {name: dsl.Program}
    verify_bindings: Callable[[str], list] = _no_bindings
    points: Callable[[str, int], list] = _no_points
    baseline: Optional[Callable[[BaselineContext], Baseline]] = None
    principal: tuple[str, ...] = ("N",)
    paper: Optional[PaperSetting] = None
    measure_worlds: Optional[tuple[int, ...]] = None
    split_schedule: Optional[str] = None
    check_bindings: Optional[Mapping[str, int]] = None
    # schedule name -> the NCCL algorithm forced for it (NCCL_ALGO; autotune's picks on sim):
    # predicted on the topology with `algo` set (a GPU topology; ignored elsewhere)
    algos: Mapping[str, str] = field(default_factory=dict, compare=False)
    # (results table, run directory) -> a markdown section of its own for the report (autotune's)
    report_section: Optional[Callable[[object, Path], str]] = None
    has_program = True

    @property
    def measurable(self) -> bool:
        """Measured on local ranks against its baseline (without one: verified and predicted)."""
        return self.baseline is not None

    def measure(self, settings: MeasureSettings) -> list:
        return harness.measure(self, settings)

    def predict(self, settings: PredictSettings) -> list:
        return predict.predictions(self, settings, show=_log.info)

    def section(self, df, out_dir: Path) -> str:
        return self.report_section(df, out_dir) if self.report_section else ""

    def size_and_shape(self, bindings: Bindings) -> tuple[int, str]:
        """The `size` (product of the principal symbols) and `shape` columns of a point."""
        size = int(np.prod([bindings[k] for k in self.principal], dtype=np.int64))
        if set(bindings) == set(self.principal) and len(self.principal) == 1:
            return size, f"[{size}]"
        return size, ",".join(f"{k}={v}" for k, v in bindings.items())

    def bindings_of(self, size: int, shape: str) -> dict[str, int]:
        """A point's bindings back from its size and shape columns."""
        if "=" not in str(shape):
            return {self.principal[0]: int(size)}
        return {k: int(v) for k, v in (part.split("=") for part in str(shape).split(","))}


@dataclass(frozen=True, kw_only=True)
class MeasurementExperiment(_Kind):
    """An experiment without a DSL program (calibrate, collectives, training, validate): its own
    `measure(settings) -> rows` (none given: nothing measured here, e.g. validate's published
    points) and `predict(settings) -> rows`; `summary(measured, predicted)` its closing table."""

    measure: Callable[[MeasureSettings], list] = _measures_nothing
    predict: Callable[[PredictSettings], list]
    summary: Callable[[list, list], Optional[str]] = _no_summary

    @property
    def measurable(self) -> bool:
        return self.measure is not _measures_nothing


@dataclass(frozen=True, kw_only=True)
class DerivedExperiment(_Kind):
    """An experiment made from another (`target=NAME`, autotune): `derive(target, settings)`
    returns the `Experiment` the run verifies, measures, predicts and reports (the target with
    the schedules it chose); `recorded(target, run_dir)` the same one again from a finished run's
    directory alone (nothing searched again: the report's rebuild)."""

    derive: Callable[[Experiment, DeriveSettings], Experiment]
    recorded: Callable[[Experiment, Path], Experiment]
    measurable = False

    def measure(self, settings: MeasureSettings) -> list:
        raise TypeError(f"{self.name} is measured as the experiment it derives (`derive`)")

    def predict(self, settings: PredictSettings) -> list:
        raise TypeError(f"{self.name} is predicted as the experiment it derives (`derive`)")
