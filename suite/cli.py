"""Command-line checks that run before Hydra, so bad input ends with one line, not a traceback.

`prevalidate(argv)` parses the command line with Hydra's own argument parser, then composes the
configuration for every job it describes (a multirun sweep such as `experiment=a,b` is expanded)
against the schema in `suite.config`, and raises `SuiteError` with one line naming the problem:
an unknown experiment (or other group option), an unknown key, a value of the wrong type, an
override Hydra cannot parse, or a setting `suite.config.validate` rejects. Hydra's own error
output is several lines long (and a traceback without HYDRA_FULL_ERROR's help), hence this step.
Commands that only ask Hydra for information (`--help`, `--info`, ...) are left to Hydra.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Iterator, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import CONF_DIR
from .config import Config, register, validate
from .errors import SuiteError, one_line

INFO_FLAGS = ("--help", "-h", "--hydra-help", "--version", "--info", "--shell-completion", "-sc",
              "--experimental-rerun")
MAX_CHECKED_JOBS = 256  # a larger sweep is checked on its first jobs only


def prevalidate(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> Optional[Config]:
    """Check the command line; return the first job's Config, or None when Hydra only informs."""
    if any(a.split("=")[0] in INFO_FLAGS for a in argv):
        return None
    args = _parse_args(argv)
    if not conf_dir.is_dir():
        raise SuiteError(f"configuration folder {conf_dir} not found; install the project "
                         "editable from its checkout (pip install -e .)")
    register()
    first = None
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name="suite"):
        for overrides in itertools.islice(_jobs(args.overrides), MAX_CHECKED_JOBS):
            cfg = compose_config(overrides, args.config_name or "config", conf_dir)
            validate(cfg)
            first = first or cfg
    return first


def compose_config(overrides: list[str], config_name: str = "config",
                   conf_dir: Path = CONF_DIR) -> Config:
    """Compose one job's configuration (inside initialize_config_dir) as a typed Config."""
    try:
        cfg = compose(config_name=config_name, overrides=overrides)
        obj = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise SuiteError(_describe(e, overrides, conf_dir)) from None
    if not isinstance(obj, Config):
        raise SuiteError(f"config {config_name!r} does not start from config_schema")
    return obj


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
    fixed = [[c for c in options] for options in choices if options]
    yield from (list(job) for job in itertools.product(*fixed))


def _describe(e: Exception, overrides: list[str], conf_dir: Path) -> str:
    """One line for a compose error: the override at fault and the rule it breaks."""
    text = str(e)
    if isinstance(e, MissingConfigException) or text.startswith("In '"):
        missing = _missing_option(overrides, conf_dir)
        if missing:
            return missing
    cause = e.__cause__ or e.__context__
    detail = getattr(cause, "msg", None) or (str(cause) if cause else "")
    head = one_line(text.split("\n")[0])
    if detail and detail.split("\n")[0] not in head:
        head = f"{head} {one_line(detail.split(chr(10))[0])}"
    return f"bad configuration: {head}"


def _missing_option(overrides: list[str], conf_dir: Path) -> Optional[str]:
    """'unknown experiment ...' when an override names a group option that has no file."""
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        group = conf_dir / key
        if not value or not group.is_dir() or (group / f"{value}.yaml").is_file():
            continue
        known = sorted(p.stem for p in group.glob("*.yaml"))
        return f"unknown {key} {value!r}; known: {', '.join(known)}"
    return None
