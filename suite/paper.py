"""experiment=paper: several experiments into one run directory, and one reproduction report.

    python -m suite experiment=paper [scale=smoke|default|paper] [backend=cpu|sim]

Runs the experiments `experiment.runs` lists (suite/conf/experiment/paper.yaml: each a name and its
typical share of the whole in seconds at default scale, for the ETA), in that order, each as a
complete run of its own (`run_one`, suite.run's, passed in) into `out_dir/<name>/` (report.md,
report.html, results.csv, figures/, tables/, kernels/), each also predicted on `predict_also`:

- an experiment that fits the local topology (`Experiment.fits_topology`) runs first
  in the list; every later run predicts this machine with the `topology.yaml` it wrote (unless
  `topology.path` is given), so the predicted-vs-measured figures use a calibration made minutes
  before; one that measures this machine only (`needs_measurement`) is left out unless
  backend=cpu.

Then writes into `out_dir`: `results.csv` (every run's rows), `environment.json`, `report.md` and
a self-contained `report.html` (`reports.reproduction`), and `tables/` (CSV and LaTeX). After each
run it prints a progress bar with the time left, estimated from the runs' typical shares of the
whole (`SHARE`, measured at default scale); at the end, the summary table and the report's path.
Exit status: the worst run's (1: something did not verify); bad input ends everything (exit 2).
`python -m suite.report DIR` rebuilds every run's report and the reproduction report
(`rebuild_paper`; the checks' counts from environment.json, where `finish` records them).
A run that ends early (SIGINT / SIGTERM: 130 / 143; a rank or a build failed: 3) ends the paper
run after it: the reproduction report is written from the runs so far (the stopped one's rows
included, as far as it got), one line on stderr says where it stopped, and the exit status is
that run's.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

import experiments
from experiments.calibration.machine import compiler, cpu_model, git_commit, memory_gib
from reports.html import write_html
from reports.latex import write_tables
from reports.progress import Progress, clock_text
from reports.reproduction import reproduction_report, summary_rows
from reports.results import read_table
from reports.summary import text_table

from .config import Config
from .errors import SuiteError
from .interrupt import Interrupted

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = "topology.yaml"  # what an experiment that fits the local topology writes


def run_paper(cfg: Config, out_dir: Path, run_one) -> int:
    """Every run of `cfg.experiment.runs` (run_one(cfg, dir) -> suite.run.Outcome), merged."""
    out_dir.mkdir(parents=True, exist_ok=True)
    share = {r.name: r.share_s for r in cfg.experiment.runs}
    runs = [(e, share[e.name]) for e in runs_of(cfg)]
    names = [e.name for e, _ in runs]
    env = environment(cfg, [e for e, _ in runs])
    (out_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    bar = Progress([s for _, s in runs], label="paper")
    topology_path = cfg.topology.path
    outcomes, started, stopped = {}, time.monotonic(), None
    for exp, _ in runs:
        name = exp.name
        try:
            log.info(f"\n======== paper: {name} ({names.index(name) + 1} of {len(names)}) ========")
            sub = replace(run_config(cfg, name), topology=replace(cfg.topology, path=topology_path))
            outcomes[name] = run_one(sub, out_dir / name)
        except (SystemExit, Interrupted) as e:  # the run ended early (its own report written)
            stopped = e.code if isinstance(e, SystemExit) else e.status
            outcomes[name] = Stopped(stopped if isinstance(stopped, int) else 1)
            break
        fitted = out_dir / name / TOPOLOGY
        if exp.fits_topology and topology_path is None and fitted.exists():
            topology_path = str(fitted)
            log.info(f"paper: the later runs predict this machine with {fitted}")
        log.info(bar.step(name))
    env["elapsed_s"] = round(time.monotonic() - started, 1)
    (out_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    if stopped is None:
        return finish(cfg, out_dir, outcomes, env)
    status = outcomes[name].status
    finish(cfg, out_dir, outcomes, env)
    log.warning(
        f"paper: stopped during {name} ({len(outcomes)} of {len(names)} runs, exit status "
        f"{status}); report (from the runs so far): {out_dir / 'report.md'}"
    )
    sys.exit(status)


def runs_of(cfg: Config) -> list:
    """The experiments `cfg.experiment.runs` lists that this backend runs, in order: one that
    measures this machine only (`needs_measurement`) only with backend=cpu; an unknown name is
    bad input (SuiteError)."""
    try:
        runs = [experiments.get(r.name) for r in cfg.experiment.runs]
    except KeyError as e:
        raise SuiteError(e.args[0]) from None
    return [e for e in runs if not e.needs_measurement or cfg.backend.name == "cpu"]


def run_config(cfg: Config, name: str) -> Config:
    """The paper run's configuration of its run `name`: that experiment, with its own schedules,
    sizes and no runs of its own."""
    return replace(
        cfg, experiment=replace(cfg.experiment, name=name, schedules=None, sizes=None, runs=[])
    )


@dataclass(frozen=True)
class Stopped:
    """A run that ended early (interrupted, a rank failed): its exit status; its report and
    rows are in its folder, as far as it got."""

    status: int
    checks: tuple = ()


def finish(cfg: Config, out_dir: Path, outcomes: dict, env: dict) -> int:
    """Merge the runs' results, write the reproduction report, print the summary."""
    checks = {n: (sum(c.verified for c in o.checks), len(o.checks)) for n, o in outcomes.items()}
    env["checks"] = {n: list(c) for n, c in checks.items() if c[1]}  # for python -m suite.report
    (out_dir / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    path = merged_report(out_dir, list(outcomes), checks, env)
    status = max((o.status for o in outcomes.values()), default=0)
    verdict = (
        "every check and measured point verified"
        if status == 0
        else "FAILED: something did not verify (see the runs' reports)"
    )
    if any(isinstance(o, Stopped) for o in outcomes.values()):
        verdict = "stopped early (the last run did not finish)"
    log.info(
        f"{verdict}; {len(outcomes)} runs in {clock_text(env['elapsed_s'])}; report: {path} "
        f"(and {path.with_suffix('.html')})"
    )
    return status


def merged_report(out_dir: Path, names: list[str], checks: dict, env: dict) -> Path:
    """The runs' results merged into out_dir/results.csv, the reproduction report (report.md,
    report.html), tables/; prints the summary table. Returns report.md's path."""
    frames = [
        read_table(out_dir / n / "results.csv")
        for n in names
        if (out_dir / n / "results.csv").exists()
    ]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df.to_csv(out_dir / "results.csv", index=False)
    path = out_dir / "report.md"
    path.write_text(reproduction_report(df, out_dir, names, checks, env))
    write_html(path)
    if not df.empty:
        write_tables(df, out_dir)
    header, rows = summary_rows(df, names, checks)
    log.info("\n== summary: paper ==\n" + text_table(header, rows))
    return path


def rebuild_paper(cfg: Config, out_dir: Path, rebuild_one) -> Path:
    """`python -m suite.report` on an experiment=paper run: each run's report rebuilt from its
    folder (rebuild_one(cfg of that run, its folder), as `run_paper` configured it), then the
    merged results and the reproduction report, with the checks and environment the run
    recorded (environment.json; a run without checks recorded shows none)."""
    names = [r.name for r in cfg.experiment.runs if (out_dir / r.name / "results.csv").exists()]
    if not names:
        raise SuiteError(f"{out_dir}: an experiment=paper run with no run's results.csv in it")
    env_path = out_dir / "environment.json"
    try:
        env = json.loads(env_path.read_text()) if env_path.exists() else {}
    except (OSError, ValueError) as e:
        raise SuiteError(f"{env_path}: not readable as JSON ({e})") from None
    for name in names:
        rebuild_one(run_config(cfg, name), out_dir / name)
    checks = {n: tuple(c) for n, c in env.get("checks", {}).items()}
    return merged_report(out_dir, names, checks, env)


def environment(cfg: Config, runs: list) -> dict:
    """Where and how the run was made (the report's environment section)."""
    worlds = [
        f"{e.name} measures at {' and '.join(map(str, e.measure_worlds))} ranks"
        for e in runs
        if e.has_program and e.measure_worlds
    ]
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m suite " + " ".join(sys.argv[1:]),
        "suite_commit": git_commit(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "compiler": compiler(),
        "scale": cfg.scale.name,
        "backend": cfg.backend.name,
        "world_size": cfg.world_size,
        "world_sizes_note": "; ".join(worlds) or "every experiment at world_size",
        "verify_world_sizes": list(cfg.verify.world_sizes),
        "experiments": [e.name for e in runs],
        "predict_also": [
            f"{t.name}" + (f" x{t.nodes} nodes" if t.nodes else "") for t in cfg.predict_also
        ],
    }
