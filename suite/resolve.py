"""A run, resolved once: what measure, predict and report read, made from the Config in one place.

    run = resolve(cfg, out_dir)   # SuiteError / DSLError / BuildError: input no run can use;
                                  # Interrupted, RankError: while calibrating
    run.topology                  # the cost_model.Topology the run predicts with, loaded once

In order: the config's own checks (`suite.config.validate`); the experiment
(`suite.load.load_experiment`, a user's module first); its programs and the settings no run of
them can use (`suite.load`), before any work; the calibration (`experiments.calibration.cache`, cached per
machine; for an experiment made from another, before it is made, since it ranks with the cost
model: `suite.load.derive_experiment`); then the topologies, each loaded once: the run's (the
calibrated file, else `topology.path`, else the composed group), comm=shm's gloo topology of the
same calibration, and the `predict_also` ones; the runtime backend; each collective's timeout.

The settings the experiment is measured and predicted with (`experiments.MeasureSettings`,
`PredictSettings`) are made here too, once: the steps of `suite.run` read them from the `Run`.

A parameter from the command line reaches the cost model in three plain calls on this object:
`topology=` -> `resolve` (run.topology, run.predict_settings.topology) ->
`suite.run.predict(run, ...)` -> `run.experiment.predict(settings)` (a program experiment's:
`experiments.predict.predictions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import dsl
from codegen.runtime import backend as backends
from cost_model.topology import Topology
from experiments import DerivedExperiment, ExperimentKind, MeasureSettings, PredictSettings
from experiments.calibration.cache import Calibration, history_dir, local_calibration

from .config import Config, collective_timeout, extra_topologies, topology_of, validate
from .errors import SuiteError
from .load import check_settings, check_sizes, derive_experiment, load_experiment, load_programs


@dataclass(frozen=True)
class Run:
    """One run of one experiment, resolved; immutable. `cfg` stays for what the report states."""

    cfg: Config
    out_dir: Path
    experiment: ExperimentKind  # for autotune: the Experiment it made (`DerivedExperiment.derive`)
    reference: Optional[dsl.Program]  # the unscheduled program (None: no DSL program)
    schedules: Mapping[str, dsl.Program]  # the selected schedules, by name
    backend: object  # codegen.runtime.backend.Backend of the ranks; None for backend=sim
    calibration: Optional[Calibration]  # the local calibration used (None: none applies)
    topology: Topology  # the topology the run predicts with (calibrated where there is one)
    gloo_topology: Optional[Topology]  # comm=shm: the same calibration's gloo topology
    extra_topologies: tuple[Topology, ...]  # predict_also
    collective_timeout_s: float  # each collective's timeout in the ranks
    # what measure and predict hand the experiment, made here from the Config once; the steps add
    # only what they find at run time (the points measured before, for resume; the measured rows)
    measure_settings: MeasureSettings
    predict_settings: PredictSettings

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
    if not isinstance(exp, DerivedExperiment):
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
    timeout_s = collective_timeout(cfg, topology)
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
        collective_timeout_s=timeout_s,
        measure_settings=_measure_settings(cfg, exp, out_dir, schedules, timeout_s),
        predict_settings=_predict_settings(cfg, out_dir, schedules, topology, gloo),
    )


def _measure_settings(
    cfg: Config, exp, out_dir: Path, schedules, timeout_s: float
) -> MeasureSettings:
    """What the experiment is measured with (`experiments.MeasureSettings`), from the config."""
    return MeasureSettings(
        scale=cfg.scale.name,
        max_elements=cfg.scale.max_elements,
        world_size=cfg.world_size,
        warmup=cfg.scale.warmup,
        repeats=cfg.scale.repeats,
        csv_path=out_dir / "results.csv",
        kernels_dir=out_dir / "kernels",
        seed=cfg.seed,
        collective_timeout_s=timeout_s,
        backend=cfg.backend.name,
        comm=cfg.backend.comm,
        schedules=schedules or None,
        points=[dict(b) for b in cfg.experiment.sizes or []] or None,
        model=cfg.experiment.model,
        min_rounds=cfg.scale.min_rounds,
        max_rounds=cfg.scale.max_rounds,
        point_budget_s=cfg.scale.budget_s,
        ci_pct=cfg.scale.ci_pct,
        long_rounds=cfg.scale.long_rounds,
        long_budget_s=cfg.scale.long_budget_s,
        calibration_history=history_dir(cfg.keep_awake) if exp.fits_topology else None,
        calibration_pool=cfg.calibration_pool,
    )


def _predict_settings(cfg: Config, out_dir: Path, schedules, topology, gloo) -> PredictSettings:
    """What the experiment is predicted with (`experiments.PredictSettings`; the measured rows
    are added by `suite.run.predict`)."""
    return PredictSettings(
        scale=cfg.scale.name,
        backend=cfg.backend.name,
        topology=topology,
        world_size=cfg.world_size,
        max_elements=cfg.scale.max_elements,
        measured=[],
        out_dir=out_dir,
        sizes=cfg.experiment.sizes,
        schedules=None if cfg.experiment.schedules is None else schedules,
        gloo_topology=gloo,
        memory_scale=cfg.memory_scale,
    )


def _calibrated(cfg: Config, found: Optional[Calibration], configured: Topology) -> Topology:
    return topology_of(cfg, found.path) if found is not None else configured


def _checked_programs(cfg: Config, exp: ExperimentKind):
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
