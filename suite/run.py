"""Orchestration: one run of one experiment, as a short sequence of named steps.

    run(cfg, out_dir) -> exit status   (experiment=paper: suite.paper, every experiment)
    run_one(cfg, out_dir) -> Outcome   (one experiment)
      load      experiments.load(cfg.experiment.name): program(), schedules(), verify_bindings()
      check     settings no run can use (world sizes vs. the program's pipeline stages, ...)
      show      print each schedule's program
      verify    every schedule against the unscheduled program (suite.verification)
      generate  every schedule's kernels, written (and for cuda compiled) by the run's backend
                into out_dir/kernels/ (suite.generate)
      measure   on the run's backend (codegen.runtime.backend: cpu, cuda): run every schedule and
                the library baseline on local ranks, append each point to results.csv (rows say
                the backend); where the backend cannot run here (cuda without a GPU), one line
                says why and nothing is measured
      predict   the cost model (experiments._predict): backend=cpu, the measured points on the
                local topology (`topology=local topology.path=FILE` for a calibrated one) and the
                paper's setting; backend=sim, the chosen topology alone; rows to results.csv
      report    out_dir/report.md (suite.report) and report.html, figures/<experiment>.png,
                figures/predicted_vs_measured.png, tables/*.csv|tex (reports/); then a short
                summary table (reports.summary) and the report's path are printed

Experiments without a DSL program (calibrate, collectives, validate) skip show and verify. Exit status: 0 when
every check verified, 1 when a schedule failed verification (the report is still written), 2 for
bad input (`fail`: one line on stderr, `error: ...`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import NoReturn, Union

import dsl

from codegen.build import BuildError
from codegen.runtime import backend as backends
from codegen.runtime.launch import RankError
from experiments import MeasureSettings
from reports.predicted import predicted_section
from reports.html import write_html
from reports.latex import write_tables
from reports.sections import measured_section
from reports.table import append_row, read_table

from .config import Config, extra_topologies, topology_of, validate
from .errors import SuiteError, one_line
from .generate import generate
from .report import render_report, write_report
from .verification import Check, verify_schedules


@dataclass(frozen=True)
class Outcome:
    status: int  # 0: every check and measured point verified; 1: one did not
    checks: list  # verification checks (suite.verification.Check)
    report: Path  # report.md


def run(cfg: Config, out_dir: Union[str, Path]) -> int:
    """Run the experiment `cfg` names, write its report into `out_dir`; return the exit status."""
    if cfg.experiment.name == "paper":
        from .paper import run_paper
        return run_paper(cfg, Path(out_dir))
    return run_one(cfg, out_dir).status


def run_one(cfg: Config, out_dir: Union[str, Path]) -> Outcome:
    """One experiment (not `paper`): its steps, its report and its verdict."""
    try:
        validate(cfg)
        exp = load_experiment(cfg.experiment.name)
        reference, schedules = load_programs(exp, cfg)
        checks = []
        backend = runtime_backend(cfg)
        if reference is not None:
            check_settings(cfg, reference, schedules)
            show_programs(schedules)
            checks = verify(cfg, exp, reference, schedules)
            if backend is not None:
                generate(cfg, exp, schedules, backend, Path(out_dir))
        elif cfg.backend.name != "cpu" and getattr(exp, "NEEDS_MEASUREMENT", False):
            raise SuiteError(f"experiment {exp.NAME} measures this machine: it needs backend=cpu")
        set_aside_old_results(Path(out_dir))
        rows = measure(cfg, exp, backend, Path(out_dir))
        predict(cfg, exp, Path(out_dir), rows)
    except (SuiteError, dsl.DSLError, RankError, BuildError) as e:
        fail(e)
    path = report(cfg, exp, schedules, checks, Path(out_dir))
    calibrated = bool(cfg.topology.path) or exp.NAME == "calibrate"
    print(final_summary(exp.NAME, Path(out_dir), calibrated), flush=True)
    return Outcome(summarize(checks, rows, path), checks, path)


def fail(error: Exception) -> NoReturn:
    """End the run for bad input: one line on stderr, exit status 2."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    sys.exit(2)


def load_experiment(name: str) -> ModuleType:
    try:
        import experiments
    except ModuleNotFoundError as e:
        if e.name != "experiments":
            raise
        raise SuiteError(f"experiment {name!r} is not available: no experiments package") from None
    if name not in experiments.EXPERIMENTS:
        known = ", ".join(experiments.EXPERIMENTS)
        raise SuiteError(f"unknown experiment {name!r}; known: {known}")
    return experiments.load(name)


def load_programs(exp: ModuleType, cfg: Config) -> tuple[dsl.Program, dict[str, dsl.Program]]:
    """The unscheduled program and the schedules cfg.experiment.schedules selects (all: null);
    (None, {}) for an experiment without a program."""
    if not hasattr(exp, "program"):
        return None, {}
    reference, schedules = exp.program(), dict(exp.schedules())
    wanted = cfg.experiment.schedules
    if wanted is not None:
        for name in wanted:
            if name not in schedules:
                known = ", ".join(schedules)
                raise SuiteError(f"unknown schedule {name!r} for {exp.NAME}; known: {known}")
        schedules = {name: schedules[name] for name in wanted}
    return reference, schedules


def check_settings(cfg: Config, reference: dsl.Program, schedules: dict[str, dsl.Program]) -> None:
    """World sizes must divide into the pipeline stages of every program."""
    for program in [reference, *schedules.values()]:
        for ws in sorted({*cfg.verify.world_sizes, cfg.world_size}):
            if ws % program.stages:
                raise SuiteError(f"world size {ws} is not divisible by the {program.stages} "
                                 f"pipeline stages of {program.name}")


def show_programs(schedules: dict[str, dsl.Program]) -> None:
    for name, program in schedules.items():
        print(f"== {name} ==\n{program}\n", flush=True)


def verify(cfg: Config, exp: ModuleType, reference: dsl.Program,
           schedules: dict[str, dsl.Program]) -> list[Check]:
    bindings = exp.verify_bindings(cfg.scale.name) or [None]
    return verify_schedules(reference, schedules, cfg.verify.world_sizes, bindings,
                            trials=cfg.verify.trials, seed=cfg.seed,
                            show=lambda line: print(line, flush=True))


def set_aside_old_results(out_dir: Path) -> None:
    """A run into a directory that has results keeps them as results.previous.csv."""
    old = out_dir / "results.csv"
    if old.exists():
        old.replace(out_dir / "results.previous.csv")
        print(f"kept the directory's earlier results as {out_dir / 'results.previous.csv'}",
              flush=True)


def runtime_backend(cfg: Config):
    """The backend the run's ranks use (codegen.runtime.backend), None for backend=sim."""
    if cfg.backend.name == "sim":
        return None
    try:
        return backends.get(cfg.backend.name, comm=cfg.backend.comm, archs=list(cfg.backend.archs))
    except ValueError as e:
        raise SuiteError(f"backend: {e}") from None


def measure(cfg: Config, exp: ModuleType, backend, out_dir: Path) -> list[dict]:
    """Measured rows on the run's backend, for experiments that run on local ranks."""
    if backend is None or not hasattr(exp, "measure"):
        print(f"measure: skipped ({exp.NAME} on backend {cfg.backend.name} has no local "
              "measurement)", flush=True)
        return []
    why = backend.cannot_run()
    if why:
        print(f"measure: skipped: backend {backend.name} cannot measure on this machine ({why})",
              flush=True)
        return []
    settings = MeasureSettings(scale=cfg.scale.name, max_elements=cfg.scale.max_elements,
                               world_size=cfg.world_size, warmup=cfg.scale.warmup,
                               repeats=cfg.scale.repeats, csv_path=out_dir / "results.csv",
                               kernels_dir=out_dir / "kernels", seed=cfg.seed,
                               backend=backend.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"measuring {exp.NAME} on {cfg.world_size} {backend.name} ranks ({cfg.scale.name} "
          "scale)", flush=True)
    return exp.measure(settings)


def predict(cfg: Config, exp: ModuleType, out_dir: Path, measured: list[dict]) -> list[dict]:
    """Predicted rows (every backend), appended to results.csv; prints predicted speedups."""
    from experiments import PredictSettings

    settings = PredictSettings(scale=cfg.scale.name, backend=cfg.backend.name,
                               topology=topology_of(cfg), world_size=cfg.world_size,
                               max_elements=cfg.scale.max_elements, measured=measured,
                               out_dir=out_dir, sizes=cfg.experiment.sizes)
    print(f"predicting {exp.NAME} with the cost model ({settings.topology.name} topology"
          f"{'' if cfg.backend.name == 'sim' else ' and the paper setting'})", flush=True)
    show = lambda line: print(line, flush=True)  # noqa: E731
    try:
        rows = _predict(exp, settings, show)
        if not getattr(exp, "NEEDS_MEASUREMENT", False):
            for topo in extra_topologies(cfg):
                if topo.name in {r["topology"] for r in rows}:
                    continue  # the paper setting already predicts on it
                print(f"predicting {exp.NAME} on {topo.name} ({topo.nodes} nodes)", flush=True)
                rows += _predict(exp, replace(settings, backend="sim", topology=topo,
                                              measured=[], sizes=None), show)
    except ValueError as e:
        raise SuiteError(f"predict: {e}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in rows:
        append_row(out_dir / "results.csv", r)
    print(prediction_summary(exp.NAME, rows, measured), flush=True)
    return rows


def _predict(exp: ModuleType, settings, show) -> list[dict]:
    from experiments._predict import predictions

    return exp.predict(settings) if hasattr(exp, "predict") else \
        predictions(exp, settings, show=show)


def prediction_summary(name: str, rows: list[dict], measured: list[dict] = ()) -> str:
    """Predicted speedups over baseline per topology and point (for collectives: busbw per size,
    measured beside predicted)."""
    import pandas as pd

    if not rows:
        return "predict: no rows"
    df = pd.DataFrame(rows)
    if name == "collectives":
        from experiments.collectives import table
        return table(list(measured) + rows)
    if name == "validate":
        from experiments.validate import table
        return table(rows)
    df = df[df.source == "predicted"]  # not the paper's published rows
    if "speedup" not in df or df.speedup.isna().all():
        return f"predict: {len(rows)} rows"
    out = []
    for (topo, ws), part in df.groupby(["topology", "world_size"], sort=False):
        pivot = part.pivot_table(index="shape", columns="schedule", values="speedup",
                                 sort=False)
        out.append(f"predicted speedup over baseline: {topo}, {ws} ranks\n"
                   f"{pivot.to_string(float_format=lambda x: f'x{x:.2f}')}")
    return "\n".join(out)


def results_section(exp: ModuleType, out_dir: Path) -> str:
    """Markdown for the measured and predicted results, from results.csv alone (reports/)."""
    csv = out_dir / "results.csv"
    if not csv.exists():
        return ""
    df = read_table(csv)
    measured = measured_section(df, exp.NAME, out_dir) if hasattr(exp, "program") else ""
    return measured + "\n" + predicted_section(df, exp.NAME, out_dir)


def report(cfg: Config, exp: ModuleType, schedules: dict[str, dsl.Program], checks: list[Check],
           out_dir: Path) -> Path:
    settings = {"scale": cfg.scale.name, "backend": cfg.backend.name,
                "topology": cfg.topology.name,
                "topology.path": cfg.topology.path or "none: the shipped figures (uncalibrated; "
                "see experiment=calibrate)", "verify.world_sizes": cfg.verify.world_sizes,
                "verify.trials": cfg.verify.trials, "seed": cfg.seed}
    text = render_report(experiment=exp.NAME, figure=exp.FIGURE, settings=settings,
                         programs={name: str(p) for name, p in schedules.items()}, checks=checks,
                         results=results_section(exp, out_dir))
    path = write_report(out_dir, text)
    write_html(path)  # report.html, figures embedded
    if (out_dir / "results.csv").exists():
        write_tables(read_table(out_dir / "results.csv"), out_dir)  # tables/*.csv, *.tex
    return path


def final_summary(name: str, out_dir: Path, calibrated: bool = True) -> str:
    """What a run prints last, before the verdict: a short table of its results."""
    from reports.predicted import accuracy, summary, summary_line
    from reports.summary import schedule_summary, text_table

    csv = out_dir / "results.csv"
    if not csv.exists():
        return "summary: no results"
    df = read_table(csv)
    lines = [f"== summary: {name} =="]
    header, rows = schedule_summary(df, name)
    if any(any(cell for cell in r[1:]) for r in rows):
        lines.append(text_table(header, rows))
    if not accuracy(df, name).empty:
        lines.append(f"local prediction: {summary_line(summary(accuracy(df, name)))}"
                     + ("" if calibrated else " (uncalibrated local topology: run "
                        "experiment=calibrate and pass topology.path=<its topology.yaml>)"))
    return "\n".join(lines)


def summarize(checks: list[Check], rows: list[dict], path: Path) -> int:
    failed = sum(not c.verified for c in checks)
    unverified = [f"{r['schedule']}@{r['size']}" for r in rows if r.get("verified") is False]
    if unverified:
        print(f"FAILED: measured points not verified: {', '.join(unverified)}; see {path}",
              file=sys.stderr, flush=True)
        return 1
    if failed:
        print(f"FAILED: {failed} of {len(checks)} checks did not verify; see {path}",
              file=sys.stderr, flush=True)
        return 1
    print(f"verified {len(checks)} checks; report: {path}", flush=True)
    return 0
