"""Orchestration: one run of one experiment, as a short sequence of named steps.

    run(cfg, out_dir) -> exit status   (experiment.runs set, experiment=paper: suite.paper)
    run_one(cfg, out_dir) -> Outcome   (one experiment)
      resolve   the config made into one immutable `suite.resolve.Run`, once: the experiment
                (a user's module loaded first; autotune's made from `target=NAME` after the
                calibration, since it ranks schedules with the cost model), its programs and the
                settings no run of them can use, the calibration (experiments.calibration.cache: cached per
                machine fingerprint, calibration=auto|refresh|off), the topologies (each loaded
                once), the runtime backend, each collective's timeout; every step below reads it
      show      print each schedule's program
      verify    every schedule against the unscheduled program (suite.verification)
      generate  every schedule's kernels, written (and for cuda compiled) by the run's backend
                into out_dir/kernels/ (suite.generate)
      measure   on the run's backend (codegen.runtime.backend: cpu, cuda): the experiment's own
                measure, else the harness (experiments.harness: every schedule and the library
                baseline on local ranks), each point appended to results.csv (rows say the
                backend); where the backend cannot run here (cuda without a GPU), one line says
                why and nothing is measured
      predict   the cost model (experiments.predict) on run.topology: backend=cpu, the measured
                points on the local topology (calibrated; `topology.path=FILE` for another) and
                the paper's setting; backend=sim, the chosen topology alone; then the
                predict_also topologies; rows to results.csv
      report    out_dir/report.md (reports.markdown) and report.html, figures/<experiment>.png,
                figures/predicted_vs_measured.png, tables/*.csv|tex (reports/); then a short
                summary table (reports.summary) and the report's path are printed

The whole run (calibrating and measuring) runs with the CPUs kept awake by idle-priority spinners
(`keep_awake=true`, codegen.runtime.awake; not with backend=sim, which measures nothing).

Each step calls the experiment's methods (`experiments.ExperimentKind`): a DSL-program experiment
is measured by the harness and predicted by `experiments.predict`; a measurement experiment
(no program: show and verify skipped) gives its own; a derived one (autotune) is first made into
the program experiment it runs. Exit status: 0 when every check verified, 1 when a schedule failed
verification (the report is still written), 2 for bad input before any work (`fail`: one line on
stderr, `error: ...`), 3 when the run failed once started (a rank died, a kernel did not compile:
`fail_run`, one line, the report written from the rows so far), 130 / 143 interrupted.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn, Optional, Union

import pandas as pd

import dsl
from codegen.build import BuildError
from codegen.runtime.awake import keep_awake
from codegen.runtime.launch import RankError
from experiments import ExperimentKind
from experiments.calibration.cache import CalibrationError, describe
from reports.html import write_html
from reports.latex import write_tables
from reports.markdown import compared, render_report, write_report
from reports.predicted import accuracy, predicted_section, summary, summary_line
from reports.results import append_row, read_table
from reports.sections import measured_section
from reports.summary import schedule_summary, text_table

from .config import Config
from .errors import SuiteError, fail, fail_run
from .generate import generate
from .interrupt import Interrupted, received
from .paper import run_paper
from .resolve import Run, resolve
from .resume import (
    complete,
    done_points,
    keep_earlier_results,
    record_report,
    restart_with,
    resume_rows,
    write_settings,
)
from .verification import Check, verify_schedules

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: every check and measured point verified; 1: one did not
    checks: list  # verification checks (suite.verification.Check)
    report: Path  # report.md


def run(cfg: Config, out_dir: Union[str, Path]) -> int:
    """Run the experiment `cfg` names, write its report into `out_dir`; return the exit status."""
    with keep_awake(cfg.keep_awake and cfg.backend.name != "sim"):
        if cfg.experiment.runs:
            return run_paper(cfg, Path(out_dir), run_one)
        return run_one(cfg, out_dir).status


def run_one(cfg: Config, out_dir: Union[str, Path]) -> Outcome:
    """One experiment (not `paper`): its steps, its report and its verdict. Interrupted (SIGINT,
    SIGTERM: suite.interrupt), it writes the report from the rows so far and exits 130 / 143;
    a rank that died or a kernel that did not compile ends it with exit 3 (the report written
    too)."""
    out_dir, stopped, rows, checks = Path(out_dir), None, [], []
    try:
        run = resolve(cfg, out_dir)  # the config's one change of form (suite.resolve)
        kept = start_results(run)
    except (SuiteError, CalibrationError, dsl.DSLError, BuildError) as e:
        fail(e)
    except Interrupted as e:  # calibrating or ranking (autotune): nothing measured yet
        log.warning(f"{e} before any point was measured")
        sys.exit(e.status)
    except RankError as e:  # a calibrating rank died
        fail_run(e)
    exp = run.experiment
    try:
        if run.reference is not None:
            show_programs(run.schedules)
            checks = verify(run)
            if run.backend is not None:
                generate(cfg, exp, run.schedules, run.backend, out_dir)
        skip = done_points(kept, list(run.schedules), exp) if kept else frozenset()
        rows = kept + measure(run, skip)
        predict(run, rows)
    except Interrupted as e:
        stopped = e
    except (RankError, BuildError) as e:  # the run failed (a rank died, a kernel did not build)
        stopped = Interrupted(received()) if received() else e
    except (SuiteError, dsl.DSLError) as e:
        fail(e)
    fitted = out_dir / "topology.yaml" if exp.fits_topology else None
    path = report(cfg, exp, run.schedules, checks, out_dir, describe(run.calibration, cfg, fitted))
    if stopped is not None:
        end_early(stopped, exp, cfg, out_dir, path)
    log.info(final_summary(exp.name, out_dir, run.calibrated or exp.fits_topology))
    return Outcome(summarize(checks, rows, path), checks, path)


def start_results(run: Run) -> list[dict]:
    """Earlier results kept numbered; with resume=true, the measured rows to keep (suite.resume)."""
    cfg, exp, schedules, out_dir = run.cfg, run.experiment, run.schedules, run.out_dir
    settings = {
        "experiment": exp.name,
        "scale": dataclasses.asdict(cfg.scale),
        "seed": cfg.seed,
        "backend": cfg.backend.name,
        "comm": cfg.backend.comm,
        "world_size": cfg.world_size,
        "schedules": sorted(schedules),
        "sizes": cfg.experiment.sizes,
        "keep_awake": cfg.keep_awake,
    }
    kept = complete(resume_rows(out_dir, settings), list(schedules), exp) if cfg.resume else []
    keep_earlier_results(out_dir)
    write_settings(out_dir, settings)
    restart_with(out_dir, kept)
    if cfg.resume:
        log.info(f"resume: {len(kept)} measured rows kept from the earlier run")
    return kept


def end_early(
    stopped: BaseException, exp: ExperimentKind, cfg: Config, out_dir: Path, path: Path
) -> NoReturn:
    """The line that says how far the run got, then its exit status (130/143, or 3)."""
    if isinstance(stopped, Interrupted):
        done, planned = points_measured(exp, out_dir), points_planned(cfg, exp)
        log.warning(
            f"interrupted after {done} of {planned if planned else '?'} points; report "
            f"(from the rows so far): {path}"
        )
        sys.exit(stopped.status)
    log.info(f"report (from the rows so far): {path}")
    fail_run(stopped)


def points_measured(exp: ExperimentKind, out_dir: Path) -> int:
    csv = out_dir / "results.csv"
    if not csv.exists():
        return 0
    df = read_table(csv)
    df = df[(df.source == "measured") & (df.experiment == exp.name)]
    return len(df.drop_duplicates(["world_size", "size", "shape"]))


def points_planned(cfg: Config, exp: ExperimentKind) -> int:
    """Points the measurement would make (0 when the experiment measures on its own)."""
    if not exp.has_program:
        return 0
    points = cfg.experiment.sizes or exp.points(cfg.scale.name, cfg.scale.max_elements)
    return len(points) * len(exp.measure_worlds or (cfg.world_size,))


def show_programs(schedules: dict[str, dsl.Program]) -> None:
    for name, program in schedules.items():
        log.info(f"== {name} ==\n{program}\n")


def verify(run: Run) -> list[Check]:
    """Every schedule against the unscheduled program; the paper setting's schedules in the
    paper's own precision (`PaperSetting.published`) against theirs, where the run predicts
    them (a chosen schedule list names them)."""
    cfg, exp = run.cfg, run.experiment
    bindings = exp.verify_bindings(cfg.scale.name) or [None]
    pairs = [(run.reference, run.schedules)]
    if exp.paper is not None and exp.paper.published:
        pairs.append(exp.paper.published())
    checks = []
    for reference, schedules in pairs:
        checks += verify_schedules(
            reference,
            schedules,
            cfg.verify.world_sizes,
            bindings,
            trials=cfg.verify.trials,
            seed=cfg.seed,
            show=log.info,
        )
    return checks


def measure(run: Run, skip: frozenset = frozenset()) -> list[dict]:
    """Measured rows on the run's backend: the experiment's own measure, else the harness;
    `skip`: the points an earlier run measured (resume)."""
    cfg, exp, backend, out_dir = run.cfg, run.experiment, run.backend, run.out_dir
    if backend is None or not exp.measurable:
        log.info(
            f"measure: skipped ({exp.name} on backend {cfg.backend.name} has no local measurement)"
        )
        return []
    why = backend.cannot_run()
    if why:
        log.info(f"measure: skipped: backend {backend.name} cannot measure on this machine ({why})")
        return []
    settings = replace(run.measure_settings, skip=skip)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info(
        f"measuring {exp.name} on {cfg.world_size} {backend.name} ranks ({cfg.scale.name} "
        f"scale; a collective times out after {settings.collective_timeout_s:.0f} s)"
    )
    return exp.measure(settings)


def predict(run: Run, measured: list[dict]) -> list[dict]:
    """Predicted rows (every backend), appended to results.csv; prints predicted speedups. The
    library baseline on gloo (comm=shm) is predicted on `run.gloo_topology`."""
    exp, out_dir = run.experiment, run.out_dir
    settings = replace(run.predict_settings, measured=measured)
    log.info(
        f"predicting {exp.name} with the cost model ({settings.topology.name} topology"
        f"{' and the paper setting' if exp.paper else ''})"
    )
    try:
        rows = exp.predict(settings)
        if not exp.needs_measurement:
            for topo in run.extra_topologies:
                if topo.name in {r["topology"] for r in rows}:
                    continue  # the paper setting already predicts on it
                log.info(f"predicting {exp.name} on {topo.name} ({topo.nodes} nodes)")
                rows += exp.predict(
                    replace(
                        settings, backend="sim", topology=topo, measured=[], sizes=None, paper=False
                    )
                )
    except ValueError as e:
        raise SuiteError(f"predict: {e}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in rows:
        append_row(out_dir / "results.csv", r)
    log.info(prediction_summary(exp, rows, measured))
    return rows


def prediction_summary(exp: ExperimentKind, rows: list[dict], measured: list[dict] = ()) -> str:
    """Predicted speedups over baseline per topology and point (or the experiment's own summary:
    `summary`, e.g. bandwidth per size, measured beside predicted)."""
    if not rows:
        return "predict: no rows"
    own = exp.summary(list(measured), rows)
    if own is not None:
        return own
    df = pd.DataFrame(rows)
    df = df[df.source == "predicted"]  # not the paper's published rows
    if "speedup" not in df or df.speedup.isna().all():
        return f"predict: {len(rows)} rows"
    out = []
    for (topo, ws), part in df.groupby(["topology", "world_size"], sort=False):
        pivot = part.pivot_table(index="shape", columns="schedule", values="speedup", sort=False)
        out.append(
            f"predicted speedup over baseline: {topo}, {ws} ranks\n"
            f"{pivot.to_string(float_format=lambda x: f'x{x:.2f}')}"
        )
    return "\n".join(out)


def results_section(exp: ExperimentKind, out_dir: Path) -> str:
    """Markdown for the measured and predicted results, from results.csv alone (reports/)."""
    csv = out_dir / "results.csv"
    if not csv.exists():
        return ""
    df = read_table(csv)
    measured = measured_section(df, exp.name, out_dir) if exp.has_program else ""
    own = exp.section(df, out_dir)
    return measured + "\n" + own + "\n" + predicted_section(df, exp.name, out_dir)


SMOKE_NOTE = (
    " (a check that every step runs: its sizes are too small and its rounds too few "
    "for its times and speedups to mean anything)"
)


def report(
    cfg: Config,
    exp: ExperimentKind,
    schedules: dict[str, dsl.Program],
    checks: list[Check],
    out_dir: Path,
    calibration: str = "",
    rebuilt: Optional[dict] = None,
) -> Path:
    """report.md, report.html and tables/ from results.csv and the run's checks; `rebuilt`
    (`python -m suite.report`): the checks and calibration the run recorded, instead."""
    settings = {
        "scale": cfg.scale.name + (SMOKE_NOTE if cfg.scale.name == "smoke" else ""),
        "backend": cfg.backend.name,
        "topology": (
            f"{cfg.topology.name} (from {cfg.topology.path})"
            if cfg.topology.path
            else cfg.topology.name
        ),
        "calibration": calibration or describe(None, cfg),
        "verify.world_sizes": cfg.verify.world_sizes,
        "verify.trials": cfg.verify.trials,
        "seed": cfg.seed,
    }
    if rebuilt is None:  # the run's own: kept for `python -m suite.report`
        record_report(
            out_dir,
            {
                "calibration": settings["calibration"],
                "checks": [dataclasses.asdict(c) for c in checks],
            },
        )
    else:
        settings["calibration"] = rebuilt.get("calibration", settings["calibration"])
        checks = [Check(**c) for c in rebuilt.get("checks", [])]
    comparison = compared(
        cfg.backend.name,
        cfg.backend.comm,
        cfg.scale.name,
        exp.measurable,
        bool(cfg.predict_also) or exp.paper is not None,
    )
    text = render_report(
        experiment=exp.name,
        figure=exp.figure,
        settings=settings,
        programs={name: str(p) for name, p in schedules.items()},
        checks=checks,
        results=results_section(exp, out_dir),
        comparison=comparison,
    )
    path = write_report(out_dir, text)
    write_html(path)  # report.html, figures embedded
    if (out_dir / "results.csv").exists():
        write_tables(read_table(out_dir / "results.csv"), out_dir)  # tables/*.csv, *.tex
    return path


def final_summary(name: str, out_dir: Path, calibrated: bool = True) -> str:
    """What a run prints last, before the verdict: a short table of its results."""
    csv = out_dir / "results.csv"
    if not csv.exists():
        return "summary: no results"
    df = read_table(csv)
    lines = [f"== summary: {name} =="]
    header, rows = schedule_summary(df, name)
    if any(any(cell for cell in r[1:]) for r in rows):
        lines.append(text_table(header, rows))
    if not accuracy(df, name).empty:
        lines.append(
            f"local prediction: {summary_line(summary(accuracy(df, name)))}"
            + (
                ""
                if calibrated
                else " (uncalibrated local topology: calibration=off; "
                "calibration=auto uses this machine's)"
            )
        )
    return "\n".join(lines)


def summarize(checks: list[Check], rows: list[dict], path: Path) -> int:
    failed = sum(not c.verified for c in checks)
    unverified = [f"{r['schedule']}@{r['size']}" for r in rows if r.get("verified") is False]
    if unverified:
        log.warning(f"FAILED: measured points not verified: {', '.join(unverified)}; see {path}")
        return 1
    if failed:
        log.warning(f"FAILED: {failed} of {len(checks)} checks did not verify; see {path}")
        return 1
    log.info(f"verified {len(checks)} checks; report: {path}")
    return 0
