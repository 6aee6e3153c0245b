"""`python -m suite experiment=NAME scale=smoke|default|paper hydra.run.dir=DIR [key=value ...]`,
and `python -m suite report DIR` (the same as `python -m suite.report DIR`: rebuild a run's report).

A user's experiment (`experiment=NAME experiment.module=SPEC`) is named through `experiment.name`
(`suite.cli.user_experiment_overrides`). The command line is checked first
(`suite.cli.prevalidate`: one line on stderr and exit 2 for bad input), then Hydra composes the
configuration, makes the run directory and calls `suite.run.run` once per job (several with `-m`,
on SLURM with `hydra/launcher=submitit_slurm`: suite/slurm.py); the exit
status is the worst job's (1: a schedule failed; 3: a rank or a job failed or was cancelled, or
the file system failed it (a full disk: one line); 130 / 143: interrupted by SIGINT / SIGTERM,
the report written from the rows so far). A run directory that holds an earlier run is refused
before Hydra touches it, moved aside whole (`existing=aside`) or continued (`resume=true`); a
run refused after Hydra started (exit 2) leaves Hydra's files there as they were
(`suite.rundir`).
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from codegen.logs import configure, level_of
from codegen.runtime.rank import preload

from . import CONF_DIR, PROJECT_ROOT
from .cli import holds_a_run, prevalidate, run_dir, user_experiment_overrides
from .config import register
from .errors import SuiteError, fail
from .interrupt import install
from .run import run
from .rundir import Snapshot, move_aside
from .slurm import SWEPT, register_launcher

statuses: list[int] = []


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def job(cfg: DictConfig) -> int:
    """One job: its exit status, also when it ends early (a SLURM job returns it to the sweep)."""
    try:
        status = run(OmegaConf.to_object(cfg), HydraConfig.get().runtime.output_dir)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except OSError as e:  # the file system failed the run (a full disk, a folder gone)
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr, flush=True)
        status = 3
    statuses.append(status)
    return status


def plugins_on_path() -> None:
    """Hydra finds launchers only in the `hydra_plugins` namespace, by walking sys.path. An
    installed package puts `hydra_plugins/coconet_suite` (the SLURM launcher) in site-packages,
    where that walk finds it; an editable install maps the packages with an import hook the walk
    cannot see, so there (only) the checkout that holds the plugin goes on the path."""
    if (
        (PROJECT_ROOT / "hydra_plugins").is_dir()
        and (PROJECT_ROOT / "pyproject.toml").exists()
        and str(PROJECT_ROOT) not in sys.path
    ):
        sys.path.append(str(PROJECT_ROOT))


def main() -> None:
    configure()  # progress on stdout, warnings on stderr (codegen.logs); the run's level below
    preload("suite.__main__")  # what each rank imports again as its main module: once, forked
    if sys.argv[1:2] == ["report"]:  # python -m suite report DIR
        from .report.__main__ import main as report_main

        report_main(sys.argv[2:])
        return
    plugins_on_path()
    register_launcher()  # hydra/launcher=submitit_slurm: ours, for prevalidate's compose too
    try:
        sys.argv[1:] = user_experiment_overrides(sys.argv[1:])  # Hydra reads sys.argv too
        cfg = prevalidate(sys.argv[1:])
        where = run_dir(sys.argv[1:]) if cfg is not None else None
    except SuiteError as e:
        fail(e)
    if cfg is not None:
        configure(level_of(cfg.quiet, cfg.verbose))
    if holds_a_run(where) and not cfg.resume and cfg.existing == "aside":
        move_aside(where)
    before = Snapshot.of(where)  # put back if the run refuses its input (exit 2)
    register()
    install()  # SIGINT / SIGTERM: the report from the rows so far, exit 130 / 143
    job()
    status = max(statuses + [j.status for j in SWEPT], default=0)
    if status == 2 and before is not None:
        before.restore()
    sys.exit(status)


if __name__ == "__main__":
    main()
