"""A run, resolved once: what measure, predict and report read, made from the Config in one place.

    run = resolve(cfg, out_dir)   # SuiteError / DSLError / BuildError: input no run can use;
                                  # Interrupted, RankError: while calibrating
    run.topology                  # the cost_model.Topology the run predicts with, loaded once

In order: the config's own checks (`suite.config.validate`); the experiment
(`suite.load.load_experiment`, a user's module first); its programs and the settings no run of
them can use (`suite.load`), before any work; the calibration (`suite.calibration`, cached per
machine; for an experiment made from another, before it is made, since it ranks with the cost
model: `suite.load.derive_experiment`); then the topologies, each loaded once: the run's (the
calibrated file, else `topology.path`, else the composed group), comm=shm's gloo topology of the
same calibration, and the `predict_also` ones; the runtime backend; each collective's timeout.

A parameter from the command line reaches the cost model in three plain calls on this object:
`topology=` -> `resolve` (run.topology) -> `suite.run.predict(run, ...)` ->
`experiments.predict.predictions(exp, settings)` (settings.topology is run.topology).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import dsl
from codegen.runtime import backend as backends
from cost_model.topology import Topology
from experiments import Experiment

from .calibration import Calibration, local_calibration
from .config import Config, collective_timeout, extra_topologies, topology_of, validate
from .errors import SuiteError
from .load import check_settings, check_sizes, derive_experiment, load_experiment, load_programs


@dataclass(frozen=True)
class Run:
    """One run of one experiment, resolved; immutable. `cfg` stays for what the report states."""

    cfg: Config
    out_dir: Path
    experiment: Experiment  # for autotune: the experiment it made (`Experiment.derive`)
    reference: Optional[dsl.Program]  # the unscheduled program (None: no DSL program)
    schedules: Mapping[str, dsl.Program]  # the selected schedules, by name
    backend: object  # codegen.runtime.backend.Backend of the ranks; None for backend=sim
    calibration: Optional[Calibration]  # the local calibration used (None: none applies)
    topology: Topology  # the topology the run predicts with (calibrated where there is one)
    gloo_topology: Optional[Topology]  # comm=shm: the same calibration's gloo topology
    extra_topologies: tuple[Topology, ...]  # predict_also
    collective_timeout_s: float  # each collective's timeout in the ranks

    @property
    def calibrated(self) -> bool:
        """Predicted with a measured topology: this machine's calibration or a given file."""
        return self.calibration is not None or bool(self.cfg.topology.path)


def resolve(cfg: Config, out_dir: Union[str, Path]) -> Run:
    """The run `cfg` describes, resolved (see the module)."""
    out_dir = Path(out_dir)
    validate(cfg)
    configured = topology_of(cfg)  # a bad value or file is refused here, before any work
    extras = tuple(extra_topologies(cfg))
    exp = load_experiment(cfg.experiment.name, cfg.experiment.module)
    if exp.derive is None:
        derive_experiment(cfg, exp, None, out_dir)  # refuses target= for a plain experiment
        reference, schedules = _checked_programs(cfg, exp)
        found = local_calibration(cfg, exp, cfg.world_size)
        topology = _calibrated(cfg, found, configured)
    else:  # it ranks schedules with the cost model on the run's topology: calibrate first
        found = local_calibration(cfg, exp, cfg.world_size)
        topology = _calibrated(cfg, found, configured)
        exp = derive_experiment(cfg, exp, topology, out_dir)
        reference, schedules = _checked_programs(cfg, exp)
    gloo = None
    if found is not None and found.gloo_path is not None:
        gloo = topology_of(cfg, found.gloo_path)
    return Run(
        cfg=cfg,
        out_dir=out_dir,
        experiment=exp,
        reference=reference,
        schedules=schedules,
        backend=runtime_backend(cfg),
        calibration=found,
        topology=topology,
        gloo_topology=gloo,
        extra_topologies=extras,
        collective_timeout_s=collective_timeout(cfg, topology),
    )


def _calibrated(cfg: Config, found: Optional[Calibration], configured: Topology) -> Topology:
    return topology_of(cfg, found.path) if found is not None else configured


def _checked_programs(cfg: Config, exp: Experiment):
    reference, schedules = load_programs(exp, cfg)
    if reference is not None:
        check_settings(cfg, reference, schedules)
        check_sizes(cfg, exp, reference, schedules)
    elif cfg.backend.name != "cpu" and exp.needs_measurement:
        raise SuiteError(f"experiment {exp.name} measures this machine: it needs backend=cpu")
    return reference, schedules


def runtime_backend(cfg: Config):
    """The backend the run's ranks use (codegen.runtime.backend), None for backend=sim."""
    if cfg.backend.name == "sim":
        return None
    try:
        return backends.get(cfg.backend.name, comm=cfg.backend.comm, archs=list(cfg.backend.archs))
    except ValueError as e:
        raise SuiteError(f"backend: {e}") from None
