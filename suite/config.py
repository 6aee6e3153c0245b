"""The configuration's schema: keyword-only dataclasses registered in Hydra's ConfigStore.

`suite/conf/config.yaml` lists `config_schema` first in its defaults, so every value composed on top of
it (the group files in `suite/conf/<group>/`, command-line overrides) is checked against these types at
compose time: an unknown key or a value of the wrong type fails before anything runs.

One config group per axis of variation:
- `experiment`: which experiment (`experiment.name`, a registered one: `experiments.names()`,
  or a user's, registered by `experiment.module`), plus per-experiment knobs;
  `suite/conf/experiment/<name>.yaml` are deltas (`# @package _global_`).
- `scale`: smoke | default | paper, how much work (repeats, sizes, verification trials).
- `backend`: cpu | sim | cuda, what measures (gloo ranks, the cost model only, NCCL on GPUs).
- `topology`: local | dgx2 | dgx_a100 | dgx_h100 | dgx_b200 | dgx1_v100, the hardware predicted on
  (cost_model.topology's schema; `topology.path=FILE` loads a calibrated one instead).

`validate(cfg)` checks what types cannot express (world sizes >= 1, trials >= 1, ...);
`topology_of(cfg)` and `extra_topologies(cfg)` load (and so check) the topologies; checks that
need the experiment's program (divisibility by its pipeline stages) live in `suite.load`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from cost_model.topology import Topology, TopologyError, curve_us, hydra_schema, load_topology

from .errors import SuiteError, one_line


@dataclass(kw_only=True)
class PaperRun:
    """One run of experiment=paper: an experiment and its typical seconds at default scale (ETA)."""

    name: str = MISSING
    share_s: float = 60.0


@dataclass(kw_only=True)
class ExperimentConf:
    name: str = MISSING  # a registered experiment (experiments.names())
    # A user's module registering the experiment: a dotted module on the Python path or a .py
    # file (`experiment.module=my_pkg.my_experiment`); null: a shipped experiment.
    module: Optional[str] = None
    schedules: Optional[List[str]] = None  # the schedules to run (paper names); null: all
    # Size-symbol bindings (e.g. [{N: 1048576}]) to measure and predict at instead of the
    # experiment's own sweep for the scale; null: the experiment's sweep.
    sizes: Optional[List[Dict[str, int]]] = None
    # experiment=training: the model (experiments.training.MODELS: bert_base, bert_large, wide);
    # null: the scale's small encoder. Other experiments ignore it.
    model: Optional[str] = None
    # experiment=paper: the experiments to run into one directory, in order (suite.paper)
    runs: List[PaperRun] = field(default_factory=list)


@dataclass(kw_only=True)
class ScaleConf:
    name: str = MISSING  # smoke | default | paper
    warmup: int = 1  # untimed runs of each step before measuring a point
    repeats: int = 5  # timed repeats of the experiments that time on their own (calibrate, ...)
    # Interleaved rounds (experiments.rounds): at least min_rounds, at most max_rounds, until
    # every paired speedup's 95% interval is within +-ci_pct% of its median or the point has
    # used budget_s seconds and, if it has fewer than long_rounds rounds (long steps), up to
    # long_budget_s seconds (0: no extension).
    min_rounds: int = 10
    max_rounds: int = 400
    budget_s: float = 15.0
    ci_pct: float = 2.5
    long_rounds: int = 0
    long_budget_s: float = 0.0
    verify_trials: int = 3  # random input draws per equivalence check
    max_elements: int = 1 << 24  # the largest principal tensor measured at this scale


@dataclass(kw_only=True)
class BackendConf:
    name: str = MISSING  # cpu | sim | cuda
    # the ranks' transport (codegen.runtime.backend): cpu: ring (chunked rings over gloo) |
    # library (gloo's own calls, chunk by chunk) | shm (shared memory, ranks on one host);
    # cuda: nccl | symm (fused steps as one kernel over symmetric memory, GPUs of one node);
    # sim: none
    comm: str = "ring"
    # cuda: the GPU architectures the generated kernels are compiled for (PTX per sm_XY, written
    # to kernels/) when no GPU is present; with one, its own architecture is built as well.
    archs: List[str] = field(default_factory=lambda: ["sm_80", "sm_90"])


# The topology group's schema mirrors cost_model.topology.Topology (devices, intra-node fabric,
# NICs, efficiency curves, overlap slowdowns: see that module), plus `path`: a calibrated
# topology file (an experiment that fits the local topology writes one) to load instead of the group's figures. Types
# are checked at compose time; ranges and required fields when the run loads it (`topology_of`).
TopologyConf = hydra_schema(
    Topology, "TopologyConf", extra=(("path", Optional[str], field(default=None)),)
)


def _importable(schema: type) -> None:
    """Make a generated schema class and the ones nested in it attributes of this module, so
    that pickle finds them by name: Hydra's submitit launcher pickles the ConfigStore to its
    jobs, and a class pickled by value loses `dataclasses.MISSING` (a field without a default
    would read as an object of type _MISSING_TYPE)."""
    name, k = schema.__name__, 1
    while globals().get(name, schema) is not schema:  # _mirror makes one class per use
        name, k = f"{schema.__name__}_{k}", k + 1
    schema.__module__, schema.__qualname__ = __name__, name
    globals()[name] = schema
    for f in fields(schema):
        for tp in _nested(f.type):
            if is_dataclass(tp) and globals().get(tp.__qualname__) is not tp:
                _importable(tp)


def _nested(tp) -> list:
    return [tp, *(t for a in typing.get_args(tp) for t in _nested(a))]


_importable(TopologyConf)


@dataclass(kw_only=True)
class ExtraTopology:
    """A topology to predict on besides the run's own (`predict_also`): `suite/conf/topology/<name>`
    at `nodes` nodes (null: the file's), in the experiment's paper setting scaled to it."""

    name: str = MISSING
    nodes: Optional[int] = None


@dataclass(kw_only=True)
class VerifyConf:
    world_sizes: List[int] = field(default_factory=lambda: [2, 4])
    trials: int = 3


@dataclass(kw_only=True)
class Config:
    experiment: ExperimentConf = field(default_factory=ExperimentConf)
    scale: ScaleConf = field(default_factory=ScaleConf)
    backend: BackendConf = field(default_factory=BackendConf)
    topology: TopologyConf = field(default_factory=TopologyConf)
    verify: VerifyConf = field(default_factory=VerifyConf)
    world_size: int = 2  # ranks for measurement
    seed: int = 0
    # The ranks' transport, short for backend.comm: gloo (backend.comm=ring) | shm | library
    # on cpu, nccl | symm on cuda;
    # null: the backend's own (suite/conf/backend/*.yaml). backend.comm given as well wins.
    comm: Optional[str] = None
    # The experiment an experiment made from another works on (experiment=autotune target=NAME).
    target: Optional[str] = None
    # The local topology (experiments.calibration.cache): auto, the calibration cached for this machine
    # (calibrating first when none matches); refresh, calibrate again; off, the shipped figures.
    calibration: str = "auto"
    # How many calibrations of this machine a calibration's fit pools, itself included: the
    # latest kept in .cache/calibration/history/ of the same scale and ranks, per benchmark
    # the median (experiments.calibration.history); 1: this calibration alone.
    calibration_pool: int = 8
    # Idle-priority spinners keep the CPUs from halting while the run calibrates and measures
    # (codegen.runtime.awake: on a VM a halted vCPU wakes a blocked gloo thread milliseconds
    # late); the calibration cache is keyed by it.
    keep_awake: bool = True
    # Predict each measured optimizer point at the memory rate the run's own baseline step showed
    # there against calibration's (experiments.predict.memory_scale: follows a shared machine's
    # memory spells). Off by default: on the Intel VM it read x0.78-0.93 at every point of nine
    # paper runs while the generated kernels ran at the calibrated rate (README).
    memory_scale: bool = False
    # Continue the run directory: skip the points its results.csv already holds with the same
    # settings (suite.resume); the earlier file is kept, numbered, as on every re-run.
    resume: bool = False
    # A run into a directory that holds an earlier run (hydra.run.dir=DIR): stop, before any
    # work and touching nothing (one line, exit 2); aside, the earlier run moved whole to the
    # next free DIR.<k> first. resume=true continues it instead.
    existing: str = "stop"
    # Messages: quiet shows warnings and errors only, verbose adds debug detail (codegen.logs).
    quiet: bool = False
    verbose: bool = False
    # Each collective's timeout in the ranks, seconds: a rank that stops answering (killed,
    # suspended) ends the run after this, named. null: from the calibrated rate
    # (`collective_timeout`: 100x the calibrated all-reduce of the run's largest tensor, at
    # least 30 s; 120 s before a calibration exists).
    collective_timeout_s: Optional[float] = None
    # Topologies every run also predicts on (experiment=paper: DGX A100 and DGX H100 clusters);
    # a topology the experiment's paper setting already predicts on is not repeated.
    predict_also: List[ExtraTopology] = field(default_factory=list)


RANKS_PER_CORE = 8  # local CPU ranks at most per core (each a process with gloo's threads)
EXISTING = ("stop", "aside")  # what a run does with a directory that holds an earlier run
COMM_ALIASES = {"gloo": "ring"}  # comm=NAME -> backend.comm
COMMS = {"cpu": ("ring", "library", "shm"), "cuda": ("nccl", "symm")}  # backend.comm it takes
TAKES = {"cpu": "gloo|shm|library", "cuda": "nccl|symm"}  # comm=NAME it takes, for messages


def transport(comm: Optional[str], default: str) -> str:
    """backend.comm from the top-level `comm` (the resolver `${coconet.comm:${comm},DEFAULT}` in
    suite/conf/backend/*.yaml): the backend's default where comm is null."""
    return default if comm is None else COMM_ALIASES.get(comm, comm)


def register() -> None:
    """Register the schema as `config_schema`, the first entry of suite/conf/config.yaml's defaults,
    and the `coconet.comm` resolver."""
    ConfigStore.instance().store(name="config_schema", node=Config)
    if not OmegaConf.has_resolver("coconet.comm"):
        OmegaConf.register_new_resolver("coconet.comm", transport)


TIMEOUT_FLOOR_S = 30.0  # a collective's timeout at least: a peer's kernel and the VM's stalls
TIMEOUT_SLACK = 100  # times the calibrated all-reduce of the run's largest tensor
UNCALIBRATED_TIMEOUT_S = 120.0  # before a calibration exists (calibrating, calibration=off)


def collective_timeout(cfg: Config, topology: Optional[Topology] = None) -> float:
    """Each collective's timeout in the ranks, s: `collective_timeout_s` where set, else
    TIMEOUT_SLACK x the calibrated library all-reduce (`Topology.all_reduce_us`, at the run's
    world size or the nearest measured one) of the run's largest tensor (`scale.max_elements`
    f64 elements), at least TIMEOUT_FLOOR_S; UNCALIBRATED_TIMEOUT_S without a calibrated curve."""
    if cfg.collective_timeout_s is not None:
        return cfg.collective_timeout_s
    curves = topology.all_reduce_us if topology is not None else {}
    if not curves:
        return UNCALIBRATED_TIMEOUT_S
    ranks = min(curves, key=lambda r: (abs(r - cfg.world_size), -r))
    largest_us = curve_us(curves[ranks], 8.0 * cfg.scale.max_elements)
    return max(TIMEOUT_FLOOR_S, TIMEOUT_SLACK * largest_us / 1e6)


def max_ranks() -> int:
    """The most local CPU ranks a run may start here."""
    return RANKS_PER_CORE * (os.cpu_count() or 1)


def validate(cfg: Config) -> None:
    """Raise SuiteError naming the first setting no run can use."""
    if not cfg.verify.world_sizes:
        raise SuiteError("verify.world_sizes is empty; give at least one world size")
    for ws in [*cfg.verify.world_sizes, cfg.world_size]:
        if ws < 1:
            raise SuiteError(f"world size {ws} is impossible; world sizes must be >= 1")
    positive = {
        "verify.trials": cfg.verify.trials,
        "scale.repeats": cfg.scale.repeats,
        "scale.max_elements": cfg.scale.max_elements,
        "topology.nodes": cfg.topology.nodes,
    }
    for key, value in positive.items():
        if value < 1:
            raise SuiteError(f"{key}={value} is impossible; it must be >= 1")
    bounded = {"scale.budget_s": cfg.scale.budget_s, "scale.ci_pct": cfg.scale.ci_pct}
    if cfg.collective_timeout_s is not None:
        bounded["collective_timeout_s"] = cfg.collective_timeout_s
    for key, value in bounded.items():
        if not 0 < value < math.inf:
            raise SuiteError(f"{key}={value} is impossible; it must be > 0 and finite")
    if not 0 <= cfg.scale.long_budget_s < math.inf:
        raise SuiteError(
            f"scale.long_budget_s={cfg.scale.long_budget_s} is impossible; it must "
            "be >= 0 and finite"
        )
    if cfg.backend.name == "cpu" and cfg.world_size > max_ranks():
        raise SuiteError(
            f"world_size={cfg.world_size} is more ranks than this machine can run "
            f"({max_ranks()}: {RANKS_PER_CORE} per core, {os.cpu_count()} cores)"
        )
    if cfg.scale.long_rounds < 0 or cfg.scale.long_budget_s < 0:
        raise SuiteError(
            f"scale.long_rounds={cfg.scale.long_rounds}, scale.long_budget_s="
            f"{cfg.scale.long_budget_s} are impossible; they must be >= 0"
        )
    if not 1 <= cfg.scale.min_rounds <= cfg.scale.max_rounds:
        raise SuiteError(
            f"scale.min_rounds={cfg.scale.min_rounds}, scale.max_rounds="
            f"{cfg.scale.max_rounds} are impossible; need 1 <= min <= max"
        )
    if not 0 <= cfg.seed < 2**32:
        raise SuiteError(f"seed={cfg.seed} is out of range; seeds are integers in [0, 2^32)")
    if cfg.existing not in EXISTING:
        raise SuiteError(f"existing={cfg.existing!r} is not one of {', '.join(EXISTING)}")
    if cfg.calibration not in ("auto", "refresh", "off"):
        raise SuiteError(f"calibration={cfg.calibration!r} is not one of auto, refresh, off")
    if not 1 <= cfg.calibration_pool <= 100:
        raise SuiteError(
            f"calibration_pool={cfg.calibration_pool} is out of range; it is how "
            "many calibrations a fit pools, 1 to 100"
        )
    takes = TAKES.get(cfg.backend.name, cfg.backend.comm)
    if cfg.comm is not None and transport(cfg.comm, "") != cfg.backend.comm:
        raise SuiteError(
            f"comm={cfg.comm} and backend.comm={cfg.backend.comm} disagree; give "
            f"one (backend={cfg.backend.name} takes comm={takes})"
        )
    if cfg.backend.name in TAKES and cfg.backend.comm not in COMMS[cfg.backend.name]:
        said = (
            f"comm={cfg.comm} and backend={cfg.backend.name} disagree"
            if cfg.comm is not None
            else f"backend.comm={cfg.backend.comm} is unknown"
        )
        raise SuiteError(f"{said} (backend={cfg.backend.name} takes comm={takes})")
    if cfg.scale.warmup < 0:
        raise SuiteError(f"scale.warmup={cfg.scale.warmup} is impossible; it must be >= 0")


def extra_topologies(cfg: Config) -> list[Topology]:
    """The `predict_also` topologies, loaded (a bad name or node count is a SuiteError)."""
    out = []
    for extra in cfg.predict_also:
        try:
            out.append(load_topology(extra.name, nodes=extra.nodes))
        except (TopologyError, FileNotFoundError, OSError) as e:
            raise SuiteError(f"bad predict_also entry {extra.name!r}: {one_line(e)}") from None
    return out


def topology_of(cfg: Config, path: Optional[Union[str, Path]] = None) -> Topology:
    """The run's topology: the file `path` (a calibration's) or `topology.path` names, read once,
    else the composed `topology` group (validated: a bad value is a SuiteError naming it)."""
    file = path or cfg.topology.path
    try:
        if not file:
            data = {k: v for k, v in dataclasses.asdict(cfg.topology).items() if k != "path"}
            return Topology.from_dict(data)
        if not Path(file).is_file():
            raise SuiteError(f"bad topology: topology file {file} not found")
        top = yaml.safe_load(Path(file).read_text()) or {}
        if not isinstance(top, dict):
            raise SuiteError(
                f"bad topology file {file}: its top level is a "
                f"{type(top).__name__}, not a mapping of the topology's fields"
            )
        top.pop("path", None)
        return Topology.from_dict(top)
    except TopologyError as e:
        raise SuiteError(f"bad topology: {e}") from None
    except (
        yaml.YAMLError,
        UnicodeDecodeError,
        OSError,
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
    ) as e:  # a file that does not parse as a topology
        raise SuiteError(f"bad topology file {file}: {type(e).__name__}: {one_line(e)}") from None
