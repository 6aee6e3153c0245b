"""Command-line checks that run before Hydra, so bad input ends with one line, not a traceback.

`prevalidate(argv)` parses the command line with Hydra's own argument parser, then composes the
configuration for every job it describes (a multirun sweep such as `experiment=a,b` is expanded)
against the schema in `suite.config`, and raises `SuiteError` with one line naming the problem:
an unknown experiment (or other group option), an unknown key, a value of the wrong type, an
override Hydra cannot parse, or a setting `suite.config.validate` rejects. Hydra's own error
output is several lines long (and a traceback without HYDRA_FULL_ERROR's help), hence this step.
Commands that only ask Hydra for information (`--help`, `--info`, ...) or read configuration
from elsewhere (`--config-dir`, `--config-path`) are left to Hydra.

A user's experiment has no file in suite/conf/experiment/: `user_experiment_overrides(argv)` turns
`experiment=NAME` into `experiment.name=NAME` when `experiment.module=SPEC` is given (SPEC: a
dotted module on the Python path or a .py file that registers NAME), and adds
`experiment.name=NAME` when the module is given alone and registers exactly one experiment.
The experiment option is checked against suite/conf/experiment/ and the registry (after the module).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import experiments

from . import CONF_DIR
from .config import Config, extra_topologies, register, topology_of, validate
from .errors import SuiteError, one_line
from .load import check_experiment, load_experiment

INFO_FLAGS = (
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--info",
    "--shell-completion",
    "-sc",
    "--experimental-rerun",
)
GROUPS = ("experiment", "scale", "backend", "topology")  # each option sets <group>.name
MAX_CHECKED_JOBS = 256  # a larger sweep is checked on its first jobs only


def prevalidate(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> Optional[Config]:
    """Check the command line; return the first job's Config, or None when Hydra only informs."""
    if any(a.split("=")[0] in INFO_FLAGS for a in argv):
        return None
    args = _parse_args(argv)
    if args.config_dir or args.config_path:  # configuration from elsewhere: Hydra checks it
        return None
    if not conf_dir.is_dir():
        raise SuiteError(
            f"configuration folder {conf_dir} not found; install the project "
            "editable from its checkout (pip install -e .)"
        )
    register()
    first = None
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name="suite"):
        for overrides in itertools.islice(_jobs(args.overrides), MAX_CHECKED_JOBS):
            cfg = compose_config(overrides, args.config_name or "config", conf_dir)
            if cfg.experiment.module:
                load_experiment(cfg.experiment.name, cfg.experiment.module)
            for group in GROUPS:
                _check_option(group, getattr(cfg, group).name, conf_dir)
            validate(cfg)
            topology_of(cfg)
            extra_topologies(cfg)
            check_experiment(cfg)
            first = first or cfg
    check_run_dir(args.overrides, first, args.multirun)
    return first


def compose_config(
    overrides: list[str], config_name: str = "config", conf_dir: Path = CONF_DIR
) -> Config:
    """Compose one job's configuration (inside initialize_config_dir) as a typed Config."""
    try:
        cfg = compose(config_name=config_name, overrides=overrides)
        obj = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        _check_group_overrides(overrides, conf_dir)
        raise SuiteError(_describe(e)) from None
    unknown = _unknown_keys(cfg)
    if unknown:  # `+key=value` adds keys even to a structured config
        raise SuiteError(
            f"bad configuration: unknown key {unknown[0]!r} (not in the schema, suite/config.py)"
        )
    if not isinstance(obj, Config):
        raise SuiteError(f"config {config_name!r} does not start from config_schema")
    return obj


def _unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Keys of `node` (recursively) that its dataclass schema does not declare."""
    schema = OmegaConf.get_type(node)
    declared = {f.name for f in fields(schema)} if is_dataclass(schema) else None
    unknown = []
    for key in node.keys():
        path = f"{prefix}{key}"
        if declared is not None and key not in declared:
            unknown.append(path)
        elif OmegaConf.is_dict(child := node[key]):
            unknown += _unknown_keys(child, f"{path}.")
    return unknown


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = get_args_parser()

    def fail(message: str) -> None:
        raise SuiteError(f"bad command line: {message}")

    parser.error = fail  # type: ignore[method-assign]  # argparse prints usage and exits
    return parser.parse_args(list(argv))


def _jobs(overrides: list[str]) -> Iterator[list[str]]:
    """The override list of every job: sweeps (`a=1,2`, `b=range(3)`) expanded, Hydra-style."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise SuiteError(f"bad override: {one_line(e)}") from None
    choices = []
    for line, o in zip(overrides, parsed):
        if not o.is_sweep_override():
            choices.append([line])
            continue
        key = line.split("=", 1)[0]
        try:
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        except HydraException:  # e.g. interval(): only a sweeper plugin can draw from it
            choices.append([])
    yield from (list(job) for job in itertools.product(*(c for c in choices if c)))


def _describe(e: Exception) -> str:
    """One line for a compose error: the override at fault and the rule it breaks."""
    text = str(e)
    head = text.split("\n")[0].rstrip(".")
    cause = e.__cause__ or e.__context__
    detail = (getattr(cause, "msg", None) or str(cause or "")).split("\n")[0]
    if detail and detail not in head:
        head = f"{head}: {detail}"
    return f"bad configuration: {one_line(head)}"


def user_experiment_overrides(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """argv with a user's experiment named through `experiment.name` (see the module doc)."""
    argv = list(argv)
    module = next((a.split("=", 1)[1] for a in argv if a.startswith("experiment.module=")), None)
    if not module:
        return argv
    named = [i for i, a in enumerate(argv) if a.startswith("experiment=")]
    for i in named:
        value = argv[i].split("=", 1)[1]
        if value and "," not in value and not (conf_dir / "experiment" / f"{value}.yaml").exists():
            argv[i] = f"experiment.name={value}"
    if not named and not any(a.startswith("experiment.name=") for a in argv):
        try:
            found = experiments.load_module(module)
        except experiments.RegistryError as e:
            raise SuiteError(one_line(e)) from None
        if len(found) != 1:
            raise SuiteError(
                f"module {module!r} registers {len(found)} experiments "
                f"({', '.join(e.name for e in found)}): name one with experiment=NAME"
            )
        argv.append(f"experiment.name={found[0].name}")
    return argv


def _check_option(group: str, name: str, conf_dir: Path) -> None:
    """`<group>.name` must name an option of the group (`experiment.name=x` bypasses the files;
    an experiment may also be a registered one without a file)."""
    known = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
    if group == "experiment":
        known = sorted({*known, *experiments.names()})
    if name not in known:
        raise SuiteError(f"unknown {group} {name!r}; known: {', '.join(known)}")


def _check_group_overrides(overrides: list[str], conf_dir: Path) -> None:
    """Raise 'unknown experiment ...' when an override names a group option with no file."""
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        if value and (conf_dir / key).is_dir():
            _check_option(key, value, conf_dir)


RUN_FILES = ("results.csv", "report.md", "settings.json", ".hydra")  # what an earlier run left


def run_dir(overrides: Sequence[str]) -> Optional[Path]:
    """The directory `hydra.run.dir=DIR` names (None: Hydra's own, a fresh dated folder)."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if not given or "${" in given[-1]:
        return None
    if not given[-1].strip():
        raise SuiteError(
            "hydra.run.dir is empty: name the run's directory (an empty one would "
            "write the run into the current directory)"
        )
    return Path(given[-1]).expanduser().absolute()


def holds_a_run(path: Optional[Path]) -> bool:
    return path is not None and path.is_dir() and any((path / f).exists() for f in RUN_FILES)


def check_run_dir(
    overrides: Sequence[str], cfg: Optional[Config] = None, multirun: bool = False
) -> None:
    """`hydra.run.dir=DIR` must be a directory this user can create or write into, and one
    that holds no earlier run unless the run continues it (resume=true) or moves it aside
    (existing=aside)."""
    path = run_dir(overrides)
    if path is None:
        return
    given = str(path)
    if path.exists() and not path.is_dir():
        raise SuiteError(f"hydra.run.dir={given} is a file, not a directory")
    if (
        holds_a_run(path)
        and cfg is not None
        and not multirun
        and not cfg.resume
        and cfg.existing == "stop"
    ):
        raise SuiteError(
            f"hydra.run.dir={given} holds an earlier run; name a new directory, "
            "continue it (resume=true) or move it aside (existing=aside)"
        )
    probe = path
    while not probe.exists():
        probe = probe.parent
    try:  # a real try (root passes os.access checks, /proc refuses anyway)
        os.rmdir(tempfile.mkdtemp(prefix=".suite-probe-", dir=probe))
    except OSError as e:
        raise SuiteError(
            f"hydra.run.dir={given} cannot be written ({probe}: {e.strerror or e})"
        ) from None
