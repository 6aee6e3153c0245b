"""`python -m suite.report DIR`: rebuild a run's report (report.md, report.html, figures/, tables/)
from its results.csv and its recorded configuration (DIR/.hydra/config.yaml, and settings.json's
record of the verification checks and the calibration used: `suite.resume.record_report`),
re-running nothing but the schedules' printing: report.md comes out as the run wrote it (a run
from before the record: without its checks, and it says so). A run of an
experiment made from another (experiment=autotune target=NAME) is rebuilt as that run made it,
from its own records (`DerivedExperiment.recorded`: autotune.csv), with its own section. An
experiment=paper run is rebuilt run by run, then its reproduction report (`suite.paper`). Bad
input (no such run directory, no results) is one line on stderr and exit 2."""

import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from codegen.logs import configure

from ..config import Config, register
from ..errors import SuiteError, fail
from ..load import load_experiment, load_programs, recorded_experiment
from ..paper import rebuild_paper
from ..resume import recorded_report
from ..run import final_summary, report

log = logging.getLogger("suite.report")  # not __name__: run as __main__


def rebuild(run_dir: Path) -> Path:
    conf = run_dir / ".hydra" / "config.yaml"
    if not (run_dir / "results.csv").exists() or not conf.exists():
        raise SuiteError(
            f"{run_dir} is not a run directory with results (needs results.csv and "
            ".hydra/config.yaml)"
        )
    register()  # the schema and the coconet.comm resolver a recorded config may interpolate
    try:
        cfg = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(conf))
        )
    except (OmegaConfBaseException, ValueError) as e:
        raise SuiteError(f"{conf}: {e}") from None
    if cfg.experiment.runs:  # experiment=paper: its runs, then the reproduction report
        return rebuild_paper(cfg, run_dir, rebuild_one)
    return rebuild_one(cfg, run_dir)


def rebuild_one(cfg: Config, run_dir: Path) -> Path:
    """One experiment's report from its folder (results.csv) and its configuration."""
    exp = recorded_experiment(
        cfg, load_experiment(cfg.experiment.name, cfg.experiment.module), run_dir
    )
    _, schedules = load_programs(exp, cfg)
    kept = recorded_report(run_dir)
    path = report(
        cfg,
        exp,
        schedules,
        [],
        run_dir,
        "as recorded in the run (report rebuilt by python -m suite.report)",
        rebuilt=kept if kept is not None else {},
    )
    log.info(final_summary(exp.name, run_dir))
    return path


def main(argv: list[str]) -> None:
    configure()
    if len(argv) != 1:
        fail(SuiteError("usage: python -m suite.report RUN_DIR"))
    try:
        log.info(f"report: {rebuild(Path(argv[0]))}")
    except SuiteError as e:
        fail(e)


if __name__ == "__main__":
    main(sys.argv[1:])
