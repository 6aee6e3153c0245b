"""The experiment interface's records: what an experiment's functions take and give.

- `Baseline` (protocol) and `BaselineContext`: the library baseline a program experiment times
  against, built on one rank from its inputs;
- `PaperSetting`: where the paper ran an experiment (predicted beside every run);
- `MeasureSettings`, `PredictSettings`, `DeriveSettings`: what the orchestration hands an
  experiment's `measure`, `predict` and `derive` (made once per run: `suite.resolve`);
- `ExperimentKind`: the protocol every experiment answers, whatever its kind.

The experiments themselves, their three kinds and the protocol the orchestration calls, are in
`experiments.kinds`. Units: sizes in elements (bytes for collectives), times in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Protocol, runtime_checkable

import numpy as np
import torch

Bindings = Mapping[str, int]

GLOO_BASELINE = "baseline(gloo)"  # comm=shm: the library baseline on gloo, in the same rounds
# the communication rate's reference timed in each measured point's rounds (`comm_probe_ms`): an
# all-reduce of this many bytes of float32 over every rank, on the run's transport
COMM_PROBE_BYTES = 8 << 20


class Baseline(Protocol):
    """The library baseline on one rank, built from this rank's inputs of the unscheduled program.

    `step()` runs one whole step (communication and computation), in place, as often as timed;
    `outputs()` returns the program's outputs this rank holds (global shapes, numpy); `compute_ms`
    is the time spent in the library's computation since the harness last set it to 0; a
    baseline whose computation includes calls the cost model models itself (a matmul) also keeps
    `library_ms`, the part of compute_ms in the rest (Megatron's bias, dropout and residual in
    torch ops), which is what the cost model takes from the measurement (all of compute_ms
    where a baseline has no `library_ms`: a library optimizer step)."""

    compute_ms: float

    def step(self) -> None: ...

    def outputs(self) -> dict[str, np.ndarray]: ...


class TimedCalls:
    """A baseline's `compute_ms` and `library_ms` (`Baseline`'s) from the calls it times:
    `timed(fn, library)` runs fn, adds its milliseconds to compute_ms, and to library_ms unless
    `library` is False (a matmul or an attention, which the cost model times itself), and
    returns fn's result."""

    compute_ms = 0.0
    library_ms = 0.0

    def timed(self, fn, library: bool = True):
        start = time.perf_counter()
        out = fn()
        ms = (time.perf_counter() - start) * 1e3
        self.compute_ms += ms
        self.library_ms += ms if library else 0.0
        return out


def with_defaults(program, inputs: dict) -> dict:
    """A rank's inputs plus the hyper-parameters' defaults (what a baseline reads them from)."""
    defaults = {
        i.value.name: np.asarray(i.default, dtype=i.value.type.dtype.numpy)
        for i in program.inputs
        if i.default is not None
    }
    return {**defaults, **inputs}


@dataclass(frozen=True, kw_only=True)
class BaselineContext:
    """What a baseline is built from on one rank: where it runs and its inputs."""

    rank: int
    world_size: int
    P: int  # ranks per pipeline stage (the tensor-parallel group's size)
    backend: object  # codegen.runtime.backend.Backend of the run: device, communicator, ...
    groups: object  # its process groups (codegen.runtime.backend.Groups: world, stages)
    inputs: Mapping[str, np.ndarray]  # this rank's inputs of the unscheduled program, by name
    exact: bool  # True when checked against the program (no library randomness), False when timed

    @property
    def stage(self) -> int:
        return self.rank // self.P

    @property
    def device(self):
        return self.backend.device

    @property
    def group(self):
        """This rank's tensor-parallel group (codegen.runtime.comm.Group)."""
        return self.groups.stages[self.stage]

    def tensors(self) -> dict:
        """The inputs as torch tensors on the backend's device (copies)."""
        return {k: torch.from_numpy(np.array(v)).to(self.device) for k, v in self.inputs.items()}


@dataclass(frozen=True, kw_only=True)
class PaperSetting:
    """Where the paper ran the experiment: predicted beside every run, and scaled to any topology."""

    topologies: tuple[tuple[str, Optional[int]], ...]  # (suite/conf/topology name, nodes)
    world_size: int
    dtype: object  # dsl dtype
    points: Mapping[str, list]  # scale -> size bindings
    world_on: Callable[[object], int]  # topology -> this setting's world size scaled to it
    # (reference, {schedule name: program}): schedules in the precision the paper ran them where
    # it differs from `dtype` (the fused optimizer step communicating f16) with the unscheduled
    # program they are verified against, predicted beside the others
    published: Optional[Callable[[], tuple[object, Mapping[str, object]]]] = None


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    scale: str  # smoke | default | paper
    max_elements: int  # the largest principal tensor to measure
    world_size: int
    warmup: int  # untimed calls of each step before timing
    repeats: int  # timed repeats of an experiment's own measure (calibrate, collectives)
    csv_path: Path  # results.csv of the run
    kernels_dir: Path  # where the generated sources are written
    seed: int = 0
    timeout_s: float = 1800.0  # the whole measurement; a hung rank ends the run after this
    # each collective's timeout in the ranks: a rank that stops answering (killed, stopped)
    # ends its peers' waits, and the run, after this (`codegen.runtime.launch`)
    collective_timeout_s: float = 120.0
    backend: str = "cpu"  # codegen.runtime.backend.get(backend): where the ranks run (rows say it)
    comm: Optional[str] = None  # the backend's transport (backend.comm: cpu ring|library|shm)
    schedules: Optional[Mapping[str, object]] = None  # the schedules to measure; None: all
    points: Optional[list] = None  # size bindings replacing the experiment's sweep
    model: Optional[str] = None  # experiment.model (experiment=training's MODELS); None: its own
    min_rounds: int = 3  # interleaved rounds per point (experiments.rounds), at least ...
    max_rounds: int = 20  # ... and at most (defaults: scale=smoke's; the suite passes the scale's)
    point_budget_s: float = 1.0  # wall seconds per point before the rounds stop unconverged
    long_rounds: int = 0  # ... unless fewer rounds than this (long steps): then up to ...
    long_budget_s: float = 0.0  # ... this many seconds (experiments.rounds.out_of_time)
    ci_pct: float = 2.5  # rounds stop when every speedup's 95% interval is within +-ci_pct%
    # points already measured (resume): (world size, sorted (symbol, value) pairs), skipped
    skip: frozenset = frozenset()
    # experiment=calibrate: the folder of this machine's earlier calibrations, which the fit
    # pools with this one and keeps it in (experiments.calibration.history; None: neither) ...
    calibration_history: Optional[Path] = None
    calibration_pool: int = 1  # ... and how many calibrations the fit pools, this one included


@dataclass(frozen=True, kw_only=True)
class PredictSettings:
    scale: str
    backend: str  # cpu: the measured points (local) and the paper's setting; sim: the topology
    topology: object  # cost_model.topology.Topology of the run
    world_size: int
    max_elements: int
    measured: list  # the rows this run measured (empty with backend=sim)
    out_dir: Path
    sizes: Optional[list] = None  # experiment.sizes: bindings replacing the sweep
    schedules: Optional[Mapping[str, object]] = None  # the schedules to predict; None: all
    # comm=shm: the gloo-calibrated Topology the library baseline on gloo (GLOO_BASELINE) is
    # predicted on (collectives: gloo's rows, measured beside shm's); None: not predicted
    gloo_topology: object = None
    # scale each measured point's memory rates by its baseline's optimizer step against
    # calibration's (experiments.predict.memory_scale); False: the calibrated rates as they are
    memory_scale: bool = False
    # also the paper's setting and the published figures (False: the topology alone, as a run
    # predicts its `predict_also` topologies after its own rows have them)
    paper: bool = True


@dataclass(frozen=True, kw_only=True)
class DeriveSettings:
    """What an experiment made from another (`DerivedExperiment.derive`) is made for: the run's."""

    scale: str
    backend: str  # sim: predicted on `topology` alone; cpu/cuda: measured here
    topology: object  # cost_model.topology.Topology of the run
    world_size: int
    max_elements: int
    out_dir: Path
    sizes: Optional[list] = None  # experiment.sizes: bindings replacing the sweep
    verify_world_sizes: tuple = (2, 4)  # verify.world_sizes: the run checks every schedule there


@runtime_checkable
class ExperimentKind(Protocol):
    """What the orchestration (`suite`) asks of every experiment, whatever its kind: a DSL program
    experiment (`Experiment`), a measurement experiment (`MeasurementExperiment`) or one made from
    another (`DerivedExperiment`). It calls these methods and reads these attributes; it never
    asks which optional fields are set."""

    name: str
    figure: str
    doc: str
    has_program: bool  # schedules to verify, compile and run (`Experiment`)
    measurable: bool  # measured on local ranks
    fits_topology: bool  # the run makes its own calibration (topology.yaml)
    needs_measurement: bool  # runs with backend=cpu only

    def measure(self, settings: MeasureSettings) -> list: ...

    def predict(self, settings: PredictSettings) -> list: ...

    def summary(self, measured: list, predicted: list) -> Optional[str]:
        """The run's closing table; None: the predicted speedups (`suite.run`)."""

    def section(self, df, out_dir: Path) -> str:
        """A markdown section of its own for the report ("" for none)."""
