"""Loading the experiment a run names: the registered `experiments.Experiment`, its programs.

    exp = load_experiment(name, module=None)     # module: a user's dotted module or .py file
    exp = derive_experiment(cfg, exp, topology, out_dir)   # target=NAME (autotune)
    exp = recorded_experiment(cfg, exp, run_dir)   # the same, made again from a finished run
    reference, schedules = load_programs(exp, cfg)
    check_settings(cfg, reference, schedules)    # world sizes vs. pipeline stages

Each raises `SuiteError` (one line) for a name, module, schedule or setting no run can use.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import dsl
import experiments
from codegen.lower import lower
from dsl.equivalence import symbols
from experiments import DerivedExperiment, Experiment, ExperimentKind
from experiments.optimizers import DataParallelBaseline

from .config import Config
from .errors import SuiteError, one_line
from .paper import run_config, runs_of

MEMORY_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_experiment(name: str, module: str | None = None) -> ExperimentKind:
    """The registered experiment `name`, after importing the user's `module` (a dotted name or a
    .py file) when one is given."""
    try:
        if module:
            experiments.load_module(module)
        return experiments.get(name)
    except experiments.RegistryError as e:
        raise SuiteError(one_line(e)) from None
    except KeyError as e:
        raise SuiteError(e.args[0]) from None


def derive_experiment(cfg: Config, exp: ExperimentKind, topology, out_dir: Path) -> ExperimentKind:
    """The experiment a run of `exp` runs: `exp` itself, or, for one made from another
    (`DerivedExperiment.derive`, e.g. autotune), what it makes of `target=NAME`."""
    if not isinstance(exp, DerivedExperiment):
        if cfg.target:
            raise SuiteError(
                f"target={cfg.target} is for an experiment made from another "
                f"(e.g. experiment=autotune); {exp.name} is not"
            )
        return exp
    if not cfg.target:
        known = ", ".join(e.name for e in experiments.registry.program_experiments())
        raise SuiteError(f"experiment {exp.name} needs target=NAME, one of: {known}")
    target = load_experiment(cfg.target, cfg.experiment.module)
    if not target.has_program:
        raise SuiteError(f"target {target.name} has no DSL program to work on")
    settings = experiments.DeriveSettings(
        scale=cfg.scale.name,
        backend=cfg.backend.name,
        topology=topology,
        world_size=cfg.world_size,
        max_elements=cfg.scale.max_elements,
        out_dir=Path(out_dir),
        sizes=cfg.experiment.sizes,
        verify_world_sizes=tuple(cfg.verify.world_sizes),
    )
    try:
        return exp.derive(target, settings)
    except ValueError as e:
        raise SuiteError(f"{exp.name}: {one_line(e)}") from None


def recorded_experiment(cfg: Config, exp: ExperimentKind, run_dir: Path) -> ExperimentKind:
    """What `derive_experiment` made in the finished run in `run_dir`, from its records alone
    (`DerivedExperiment.recorded`; nothing searched again); `exp` itself when it is not made from
    another."""
    if not isinstance(exp, DerivedExperiment):
        return exp
    if not cfg.target:
        raise SuiteError(f"{run_dir}: a run of {exp.name} records no target=NAME")
    target = load_experiment(cfg.target, cfg.experiment.module)
    try:
        return exp.recorded(target, Path(run_dir))
    except ValueError as e:
        raise SuiteError(f"{exp.name}: {one_line(e)}") from None


def load_programs(exp: ExperimentKind, cfg: Config) -> tuple[dsl.Program, dict[str, dsl.Program]]:
    """The unscheduled program and the schedules cfg.experiment.schedules selects (all: null);
    (None, {}) for an experiment without a program."""
    if not exp.has_program:
        return None, {}
    reference, schedules = exp.program(), dict(exp.schedules())
    wanted = cfg.experiment.schedules
    if wanted is not None and not wanted:
        raise SuiteError(
            "experiment.schedules is empty; name at least one schedule, or null for all"
        )
    if wanted is not None:
        for name in wanted:
            if name not in schedules:
                known = ", ".join(schedules)
                raise SuiteError(f"unknown schedule {name!r} for {exp.name}; known: {known}")
        schedules = {name: schedules[name] for name in wanted}
    return reference, schedules


def check_settings(cfg: Config, reference: dsl.Program, schedules: dict[str, dsl.Program]) -> None:
    """World sizes must divide into the pipeline stages of every program."""
    for program in [reference, *schedules.values()]:
        for ws in sorted({*cfg.verify.world_sizes, cfg.world_size}):
            if ws % program.stages:
                raise SuiteError(
                    f"world size {ws} is not divisible by the {program.stages} "
                    f"pipeline stages of {program.name}"
                )


def check_sizes(
    cfg: Config, exp: Experiment, reference: dsl.Program, schedules: dict[str, dsl.Program]
) -> None:
    """Every point to measure or predict (experiment.sizes, else the scale's sweep) binds exactly
    the program's size symbols to positive integers that every schedule lowers with at the run's
    world size (divisible as its layouts and chunks require), and fits in this machine's memory;
    a measuring run has at least one point."""
    given = cfg.experiment.sizes
    points = given or exp.points(cfg.scale.name, cfg.scale.max_elements)
    if not points and cfg.backend.name != "sim" and exp.baseline is not None:
        raise SuiteError(
            f"no point of {exp.name} to measure: scale.max_elements="
            f"{cfg.scale.max_elements} is below its smallest size"
        )
    wanted = symbols(reference) - {"P"}
    for b in points or []:
        b = dict(b)
        if set(b) != wanted:
            raise SuiteError(
                f"experiment.sizes entry {b} must bind exactly {sorted(wanted)} of "
                f"{exp.name}'s program"
            )
        bad = {k: v for k, v in b.items() if not isinstance(v, int) or v < 1}
        if bad:
            raise SuiteError(f"experiment.sizes entry {b}: sizes must be positive integers")
        for name, program in schedules.items():
            for ws in (
                (exp.measure_worlds or (cfg.world_size,))
                if cfg.backend.name != "sim"
                else (cfg.world_size,)
            ):
                try:
                    lower(program, b, ws)
                except (dsl.DSLError, ValueError, KeyError, ZeroDivisionError) as e:
                    raise SuiteError(
                        f"size {b} on {ws} ranks does not fit schedule {name}: {one_line(e)}"
                    ) from None
        shm = cfg.backend.comm == "shm"
        need = point_bytes(exp, reference, b, len(schedules), cfg.world_size, shm)
        if cfg.backend.name == "cpu" and need > MEMORY_BYTES:
            raise SuiteError(
                f"size {b} needs about {need / 2**30:.0f} GiB on {cfg.world_size} "
                f"ranks for its {len(schedules)} schedules and "
                f"{_baselines(exp, shm)} baseline copies; "
                f"this machine has {MEMORY_BYTES / 2**30:.0f} GiB"
            )


def point_bytes(
    exp: Experiment,
    reference: dsl.Program,
    b: dict,
    schedules: int,
    world_size: int,
    shm: bool = False,
) -> int:
    """A lower bound of the memory a measured point holds at once (bytes, every rank together):
    at least one whole copy of the inputs per schedule (a schedule's slices add up to one over
    its ranks) and for the reference the checks compare with, and the baselines' copies
    (`_baselines`), each a whole replica on every rank for a data-parallel baseline."""
    per = (
        world_size
        if isinstance(exp.baseline, type) and issubclass(exp.baseline, DataParallelBaseline)
        else 1
    )
    return _bytes(reference, b) * (schedules + 1 + per * _baselines(exp, shm))


def _baselines(exp: Experiment, shm: bool) -> int:
    """Copies of the inputs a point's baselines hold (`experiments.harness`): the baseline's,
    its gloo twin's with comm=shm, its memory probe's where it names one (each its own copy)."""
    if exp.baseline is None:
        return 0
    return 1 + int(shm) + int(bool(getattr(exp.baseline, "probe", "")))


def _bytes(program: dsl.Program, b: dict) -> int:
    """Bytes of the program's global inputs at bindings b (a lower bound of a point's memory)."""
    total = 0
    for i in program.inputs:
        n = 1
        for d in i.value.type.shape:
            n *= int(d.evaluate({**b, "P": 1})) if hasattr(d, "evaluate") else int(d)
        total += n * np.dtype(i.value.type.dtype.numpy).itemsize
    return total


def check_experiment(cfg: Config) -> ExperimentKind | None:
    """Everything about the run's experiment checkable before any work: its name (and module),
    schedules, world sizes and sizes (one line each: SuiteError). experiment=paper (a list of
    runs): every run it will run, each as `suite.paper.run_config` makes it, before the first
    starts (a world size one of them cannot take ends the paper run here, not after the runs
    before it)."""
    if cfg.experiment.runs:
        for exp in runs_of(cfg):
            check_experiment(run_config(cfg, exp.name))
        return None
    exp = load_experiment(cfg.experiment.name, cfg.experiment.module)
    if exp.name == "training":  # its model: before the run directory is made, not in a rank
        from experiments.training import check_model

        try:
            check_model(cfg.experiment.model)
        except ValueError as e:
            raise SuiteError(one_line(e)) from None
    if isinstance(
        exp, DerivedExperiment
    ):  # made from a target at run time (autotune): the target's
        if not cfg.target:  # program with its own schedules now, the made ones then
            return exp
        target = load_experiment(cfg.target, cfg.experiment.module)
        if not target.has_program:
            return exp  # derive_experiment says why
        schedules = dict(target.schedules())
        check_settings(cfg, target.program(), schedules)
        check_sizes(cfg, target, target.program(), schedules)
        return exp
    reference, schedules = load_programs(exp, cfg)
    if reference is not None:
        check_settings(cfg, reference, schedules)
        check_sizes(cfg, exp, reference, schedules)
    return exp
