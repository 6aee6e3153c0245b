"""Loading the experiment a run names: the registered `experiments.Experiment`, its programs.

    exp = load_experiment(name, module=None)     # module: a user's dotted module or .py file
    exp = derive_experiment(cfg, exp, topology, out_dir)   # target=NAME (autotune)
    reference, schedules = load_programs(exp, cfg)
    check_settings(cfg, reference, schedules)    # world sizes vs. pipeline stages

Each raises `SuiteError` (one line) for a name, module, schedule or setting no run can use.
"""
from __future__ import annotations

from pathlib import Path

import dsl
import experiments
from experiments import Experiment

from .config import Config
from .errors import SuiteError, one_line


def load_experiment(name: str, module: str | None = None) -> Experiment:
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


def derive_experiment(cfg: Config, exp: Experiment, topology, out_dir: Path) -> Experiment:
    """The experiment a run of `exp` runs: `exp` itself, or, for one made from another
    (`Experiment.derive`, e.g. autotune), what it makes of `target=NAME`."""
    if exp.derive is None:
        if cfg.target:
            raise SuiteError(f"target={cfg.target} is for an experiment made from another "
                             f"(e.g. experiment=autotune); {exp.name} is not")
        return exp
    if not cfg.target:
        known = ", ".join(e.name for e in experiments.registry.program_experiments())
        raise SuiteError(f"experiment {exp.name} needs target=NAME, one of: {known}")
    target = load_experiment(cfg.target, cfg.experiment.module)
    if not target.has_program or target.derive is not None:
        raise SuiteError(f"target {target.name} has no DSL program to work on")
    settings = experiments.DeriveSettings(
        scale=cfg.scale.name, backend=cfg.backend.name, topology=topology,
        world_size=cfg.world_size, max_elements=cfg.scale.max_elements, out_dir=Path(out_dir),
        sizes=cfg.experiment.sizes)
    try:
        return exp.derive(target, settings)
    except ValueError as e:
        raise SuiteError(f"{exp.name}: {one_line(e)}") from None


def load_programs(exp: Experiment, cfg: Config) -> tuple[dsl.Program, dict[str, dsl.Program]]:
    """The unscheduled program and the schedules cfg.experiment.schedules selects (all: null);
    (None, {}) for an experiment without a program."""
    if not exp.has_program:
        return None, {}
    reference, schedules = exp.program(), dict(exp.schedules())
    wanted = cfg.experiment.schedules
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
                raise SuiteError(f"world size {ws} is not divisible by the {program.stages} "
                                 f"pipeline stages of {program.name}")
