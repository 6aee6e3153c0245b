"""`python -m suite` as users run it (subprocesses), and the run's steps in-process.

Bad input: a non-zero exit (2) and exactly one line on stderr, never a traceback. A good run: one
progress line per schedule x world size, report.md in `hydra.run.dir`, exit 0; a schedule that
fails verification: still a report, exit 1. The toy experiment (tests/suite_fakes.py) keeps these
tests independent of experiments/; the real ones' smoke runs are tests/test_paper.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from suite_fakes import toy

import dsl
import suite.load
import suite.resolve
import suite.run
from suite import PROJECT_ROOT
from suite.cli import prevalidate
from suite.errors import SuiteError

TESTS = Path(__file__).resolve().parent
KNOWN = (
    "known: adam_fusion, autotune, calibrate, collectives, fsdp_prefetch, lamb_fusion, "
    "model_parallel, paper, pipeline_parallel, tensor_parallel, tp_attention, training, validate"
)


def suite_cmd(
    *args: str, toy_run: bool = False, wrong: bool = False, cwd: Path = PROJECT_ROOT
) -> subprocess.CompletedProcess:
    """Run the suite (with the toy experiment when asked) and capture its output."""
    entry = (
        [str(TESTS / "suite_fakes.py")] + (["--wrong"] if wrong else [])
        if toy_run
        else ["-m", "suite"]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), str(TESTS)])}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, *entry, *args],
        cwd=cwd,
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in lines[0]


# -- bad input, end to end --------------------------------------------------------------------
@pytest.mark.slow
def test_unknown_experiment(tmp_path):
    proc = suite_cmd("experiment=nope", f"hydra.run.dir={tmp_path}")
    assert_one_line_error(proc, "unknown experiment 'nope'", KNOWN)
    assert not any(tmp_path.iterdir())  # failed before Hydra made the run directory


@pytest.mark.parametrize(
    "override,expected",
    [
        ("verify.trials=abc", "verify.trials=abc"),
        ("nonexistent_key=1", "nonexistent_key"),
        ("+nonexistent_key=1", "nonexistent_key"),
        ("world_size=0", "world size 0 is impossible"),
        ("scale=huge", "unknown scale 'huge'"),
    ],
)
@pytest.mark.slow
def test_bad_override(override, expected):
    assert_one_line_error(suite_cmd(override), expected)


@pytest.mark.slow
def test_unknown_option_flag():
    assert_one_line_error(suite_cmd("--bogus"), "--bogus")


@pytest.mark.slow
def test_runs_from_another_directory(tmp_path):
    assert_one_line_error(suite_cmd("experiment=nope", cwd=tmp_path), KNOWN)


@pytest.mark.slow
def test_help_is_hydras():
    proc = suite_cmd("--help")
    assert proc.returncode == 0 and "experiment: " in proc.stdout


# -- a run with the toy experiment ------------------------------------------------------------
@pytest.mark.slow
def test_run_writes_report_into_run_dir(tmp_path):
    out = tmp_path / "run"
    proc = suite_cmd("scale=smoke", f"hydra.run.dir={out}", toy_run=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    progress = [line for line in proc.stdout.splitlines() if "max abs error" in line]
    assert len(progress) == 2 and all(" OK " in line for line in progress)  # AR-C x P in {2, 4}
    report = (out / "report.md").read_text()
    assert report.startswith("# toy\n") and "Fig. 0" in report and "all_reduce" in report
    assert "| `AR-C` | 4 | N=16 |" in report and "4 of 4 checks verified" in report
    assert (out / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
def test_failed_verification_exits_1_with_a_report(tmp_path):
    proc = suite_cmd("scale=smoke", f"hydra.run.dir={tmp_path}", toy_run=True, wrong=True)
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and "did not verify" in proc.stderr
    assert any("wrong" in line and "FAILED" in line for line in proc.stdout.splitlines())
    report = (tmp_path / "report.md").read_text()
    assert "| `wrong` | 2 | N=8 | - | no |" in report and "### Failures" in report


def test_impossible_world_size_for_the_program(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite.resolve, "load_experiment", lambda name, module=None: toy(stages=2))
    cfg = prevalidate(["verify.world_sizes=[2,3]"])
    with pytest.raises(SystemExit) as info:
        suite.run.run(cfg, tmp_path)
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: world size 3 is not divisible by the 2 pipeline stages of toy"]


def test_dsl_error_is_one_line(tmp_path, monkeypatch, capsys):
    def check(*args, **kwargs):
        raise dsl.BindError("N=7 is not divisible by P=2\nsecond line")

    monkeypatch.setattr(suite.resolve, "load_experiment", lambda name, module=None: toy())
    monkeypatch.setattr(dsl, "check_equivalent", check)
    with pytest.raises(SystemExit) as info:
        suite.run.run(prevalidate([]), tmp_path)
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: schedule AR-C at P=2, N=8: N=7 is not divisible by P=2; second line"]


def test_unknown_schedule():
    with pytest.raises(SuiteError, match="unknown schedule 'nope' for adam_fusion; known: AR-C"):
        prevalidate(["experiment.schedules=[AR-C,nope]"])  # refused before any work
    cfg = prevalidate(["experiment.schedules=[AR-C]"])
    cfg = replace(cfg, experiment=replace(cfg.experiment, schedules=["AR-C", "nope"]))
    with pytest.raises(SuiteError, match="unknown schedule 'nope' for toy; known: AR-C"):
        suite.load.load_programs(toy(), cfg)


# -- the real experiments (each one's smoke run: tests/test_paper.py, which runs them all) ------
@pytest.mark.slow
def test_real_pipeline_rejects_odd_world_size(tmp_path):
    proc = suite_cmd(
        "experiment=pipeline_parallel", "verify.world_sizes=[3]", f"hydra.run.dir={tmp_path}"
    )
    assert_one_line_error(proc, "world size 3 is not divisible by the 2 pipeline stages")


def test_caches_stay_inside_the_project():
    drop = ("MPLCONFIGDIR", "COCONET_CACHE_DIR", "COCONET_KERNELS_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    code = "import os, suite; from codegen import build; print(os.environ['MPLCONFIGDIR'], build.cache_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=env,
        text=True,
        capture_output=True,
        check=True,
    ).stdout.split()
    assert out == [
        str(PROJECT_ROOT / ".cache" / "matplotlib"),
        str(PROJECT_ROOT / ".cache" / "kernels"),
    ]
