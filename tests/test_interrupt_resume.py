"""Faults in a real run (`python -m suite`, 2 gloo ranks, adam_fusion at smoke scale): SIGINT and
SIGTERM of the entry point, SIGKILL of a rank, a kernel that does not compile, and resume. Each
checks the exit status, the one line that says what happened, that the rows measured before are
kept, that the report is written, and that no process of the run is left."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POINTS = 5  # adam_fusion at smoke: 2^12 .. 2^16
SCHEDULES = 6  # the baseline and five schedules


def _start(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "experiment=adam_fusion",
        "scale=smoke",
        "calibration=off",
        "verify.world_sizes=[2]",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _measured(run_dir: Path, name: str = "results.csv") -> list[dict]:
    path = run_dir / name
    if not path.exists():
        return []
    return [r for r in csv.DictReader(path.open()) if r["source"] == "measured"]


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out |= {int(k) for k in kids}
        todo += [int(k) for k in kids]
    return out


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(p)
    return left


def _run_until_measured(run_dir: Path, rows: int, *extra: str) -> tuple[subprocess.Popen, set]:
    """Start a run and wait until results.csv holds `rows` measured rows; its processes."""
    proc = _start(run_dir, *extra)
    deadline = time.monotonic() + 600
    while len(_measured(run_dir)) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no point measured in 600 s"
        time.sleep(0.2)
    ranks = _descendants(proc.pid)
    assert ranks, "the run has no rank processes"
    return proc, ranks


def _ended(proc: subprocess.Popen, ranks: set) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    time.sleep(2)  # orphans are reaped by init
    assert not _alive(ranks | {proc.pid}), "processes of the run left behind"
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_ranks_keeps_the_rows_and_writes_the_report(tmp_path, sig, status):
    proc, ranks = _run_until_measured(tmp_path, SCHEDULES)
    proc.send_signal(sig)
    code, err = _ended(proc, ranks)
    assert code == status, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines[-1].startswith("interrupted after "), err
    done = int(lines[-1].split()[2])
    assert 1 <= done <= POINTS and f"of {POINTS} points" in lines[-1]
    rows = _measured(tmp_path)
    assert len(rows) >= done * SCHEDULES
    report = (tmp_path / "report.md").read_text()
    assert "## Measured" in report


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_with_exit_3_and_the_rows_kept(tmp_path):
    proc, ranks = _run_until_measured(tmp_path, SCHEDULES)
    os.kill(max(ranks), signal.SIGKILL)  # a rank (the parent's children are the ranks)
    code, err = _ended(proc, ranks)
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: rank ") and "Traceback" not in err
    assert len(_measured(tmp_path)) >= SCHEDULES
    assert (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_resume_skips_the_points_measured_and_keeps_every_earlier_file(tmp_path):
    proc, ranks = _run_until_measured(tmp_path, SCHEDULES)
    proc.send_signal(signal.SIGINT)
    assert _ended(proc, ranks)[0] == 130
    before = _measured(tmp_path)
    resumed = _start(tmp_path, "resume=true")
    out, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err
    assert f"resume: {len(before)} measured rows kept" in out
    after = _measured(tmp_path)
    assert len(after) == POINTS * SCHEDULES  # every point once: none measured twice
    assert after[: len(before)] == before  # the earlier rows, as they were
    assert _measured(tmp_path, "results.1.csv") == before  # the interrupted file, kept
    # python -m suite.report rebuilds the report of this cpu run (its config has the
    # coconet.comm resolver of suite/conf/backend/cpu.yaml)
    (tmp_path / "report.md").unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "suite.report", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert "## Measured" in (tmp_path / "report.md").read_text()
    other = _start(tmp_path, "resume=true", "seed=1")  # other settings: refused before any work
    _, err = other.communicate(timeout=300)
    assert (
        other.returncode == 2
        and err.strip().startswith("error: resume=true:")
        and len(err.strip().splitlines()) == 1
    )


@pytest.mark.slow
def test_a_kernel_that_does_not_compile_ends_the_run_with_exit_3(tmp_path):
    """A compiler that fails (CXX a script that prints an error, a fresh build cache so nothing
    is loaded from it): the run started, so exit 3 (not 2, bad input), one line naming the
    compiler's error, no traceback, the report written, no process left."""
    (tmp_path / "bin").mkdir()
    cxx = tmp_path / "bin" / "g++"  # the real one answers torch's questions; sources fail
    cxx.write_text(
        '#!/bin/sh\ncase "$*" in *.cpp*) ;; *) exec g++ "$@";; esac\n'
        "echo 'main.cpp:1:1: error: the compiler is broken' >&2\nexit 1\n"
    )
    cxx.chmod(0o755)
    run_dir = tmp_path / "run"
    proc = _start(
        run_dir, env={"CXX": str(cxx), "COCONET_KERNELS_DIR": str(tmp_path / "extensions")}
    )
    code, err = _ended(proc, set())
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "the compiler is broken" in lines[0], err
    assert _measured(run_dir) == []
    assert (run_dir / "report.md").exists()


@pytest.mark.slow
def test_an_interrupted_paper_run_writes_the_report_of_the_runs_so_far(tmp_path):
    """experiment=paper (two runs here, to be short) stopped by SIGINT during its first run:
    that run's report and rows are kept, the reproduction report is written from them, one line
    says where it stopped, exit 130, no process left."""
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "experiment=paper",
        "scale=smoke",
        "calibration=off",
        "verify.world_sizes=[2]",
        "predict_also=[]",
        f"hydra.run.dir={tmp_path}",
        "experiment.runs=[{name:adam_fusion,share_s:1},{name:lamb_fusion,share_s:1}]",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while len(_measured(tmp_path / "adam_fusion")) < SCHEDULES:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no point measured in 600 s"
        time.sleep(0.2)
    ranks = _descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    code, err = _ended(proc, ranks)
    assert code == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines[-2].startswith("interrupted after "), err
    assert lines[-1].startswith(
        "paper: stopped during adam_fusion (1 of 2 runs, exit status "
        "130); report (from the runs so far): "
    ), err
    assert (tmp_path / "adam_fusion" / "report.md").exists()
    report = (tmp_path / "report.md").read_text()
    assert "\n## adam_fusion\n" in report and "\n## lamb_fusion\n" not in report
    merged = [
        r for r in csv.DictReader((tmp_path / "results.csv").open()) if r["source"] == "measured"
    ]
    assert len(merged) >= SCHEDULES and {r["experiment"] for r in merged} == {"adam_fusion"}
