"""A run directory is never overwritten or lost (issue 54): a refused command touches nothing, a
new run into a used directory stops (or moves the old run aside whole), an empty directory name
is refused, a row is whole or absent, a full disk is one line and exit 3, and resume never
measures a point twice."""

from __future__ import annotations

import hashlib
import resource
import signal
import subprocess
import sys

import pytest
from test_suite_cli import PROJECT_ROOT, assert_one_line_error, suite_cmd

import experiments
from reports.results import COLUMNS, append_row, read_table, write_whole
from suite.resume import complete, whole_rows
from suite.rundir import Snapshot

SIM = ("experiment=adam_fusion", "backend=sim", "scale=smoke")


def digest(folder) -> dict:
    """Every file under `folder` (hidden ones too) -> its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "a"
    proc = suite_cmd(*SIM, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.mark.parametrize(
    "extra",
    [
        (),  # the same command again
        ("backend.comm=nope",),  # a bad setting
        ("experiment=lamb_fusion", "resume=true"),  # a resume the earlier settings refuse
    ],
)
@pytest.mark.slow
def test_a_refused_command_leaves_the_earlier_run_as_it_was(earlier, extra):
    before = digest(earlier)
    args = [a for a in SIM if not a.startswith(tuple(e.split("=")[0] + "=" for e in extra))]
    proc = suite_cmd(*args, *extra, f"hydra.run.dir={earlier}")
    assert_one_line_error(proc)
    assert digest(earlier) == before


@pytest.mark.slow
def test_an_empty_run_dir_is_refused_and_nothing_is_written(tmp_path):
    proc = suite_cmd(*SIM, "hydra.run.dir=", cwd=tmp_path)
    assert_one_line_error(proc, "hydra.run.dir is empty")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_refused_run_into_a_new_dir_leaves_no_dir(tmp_path):
    proc = suite_cmd(
        "experiment=adam_fusion",
        "scale=smoke",
        "experiment.sizes=[{N:7}]",
        f"hydra.run.dir={tmp_path / 'new'}",
    )
    assert_one_line_error(proc, "does not divide")
    assert not (tmp_path / "new").exists()


def test_snapshot_takes_back_what_hydra_wrote(tmp_path):
    """What a run refused after Hydra started leaves: Hydra's files restored, a folder Hydra
    made removed."""
    used, new = tmp_path / "used", tmp_path / "new"
    (used / ".hydra").mkdir(parents=True)
    (used / ".hydra" / "config.yaml").write_text("earlier")
    (used / "results.csv").write_text("rows")
    before, fresh = Snapshot.of(used), Snapshot.of(new)
    (used / ".hydra" / "config.yaml").write_text("rewritten")
    (used / ".hydra" / "overrides.yaml").write_text("new")
    (used / "suite.log").write_text("log")
    (new / ".hydra").mkdir(parents=True)
    (new / ".hydra" / "config.yaml").write_text("new")
    (new / "suite.log").write_text("log")
    before.restore()
    fresh.restore()
    assert digest(used) == {
        ".hydra/config.yaml": hashlib.sha1(b"earlier").hexdigest(),
        "results.csv": hashlib.sha1(b"rows").hexdigest(),
    }
    assert not new.exists()


@pytest.mark.slow
def test_existing_aside_moves_the_earlier_run_whole(tmp_path):
    run = tmp_path / "a"
    assert suite_cmd(*SIM, f"hydra.run.dir={run}").returncode == 0
    before = digest(run)
    proc = suite_cmd(*SIM, f"hydra.run.dir={run}", "existing=aside")
    assert proc.returncode == 0, proc.stderr
    assert digest(tmp_path / "a.1") == before  # the earlier run, every file as it was
    assert (run / "results.csv").exists() and not (run / "results.1.csv").exists()


def _small_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_one_line_and_exit_3(tmp_path):
    """A file size limit (RLIMIT_FSIZE) stands in for a full disk: results.csv reaches it."""
    proc = subprocess.run(
        [sys.executable, "-m", "suite", *SIM, f"hydra.run.dir={tmp_path}"],
        cwd=PROJECT_ROOT,
        preexec_fn=_small_disk,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert lines[0] == f"error: {tmp_path / 'results.csv'}: File too large"
    text = (tmp_path / "results.csv").read_text()
    assert text.endswith("\n") and len(read_table(tmp_path / "results.csv"))  # whole rows


def test_a_write_cut_short_is_taken_back(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"a,b\n1,2\n")
    code = (
        "import resource, signal, sys; from reports.results import write_whole; "
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (12, 12)); "
        f"write_whole(__import__('pathlib').Path({str(path)!r}), b'3,4\\n5,6\\n')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "File too large" in proc.stderr
    assert path.read_bytes() == b"a,b\n1,2\n"  # nothing of the cut row left
    write_whole(path, b"3,4\n")
    assert path.read_bytes() == b"a,b\n1,2\n3,4\n"


def test_resume_reads_whole_rows_of_complete_points_only(tmp_path):
    exp = experiments.get("adam_fusion")
    path = tmp_path / "results.csv"
    point = dict(
        experiment="adam_fusion", source="measured", world_size=2, dtype="f32", time_ms=1.0
    )
    for n, schedules in ((4096, ("baseline", "AR-C")), (8192, ("baseline",))):
        for s in schedules:
            append_row(path, {**point, "schedule": s, "size": n, "shape": f"[{n}]"})
    whole = path.read_bytes()
    path.write_bytes(whole + b"adam_fusion,AR-C,measured,cpu,local,2,8192,[8")  # cut mid-row
    rows = whole_rows(path).to_dict("records")
    assert len(rows) == 3 and list(whole_rows(path).columns) == list(COLUMNS)
    kept = complete(rows, ["AR-C"], exp)
    assert [(r["size"], r["schedule"]) for r in kept] == [(4096, "baseline"), (4096, "AR-C")]


@pytest.mark.slow
def test_suite_report_on_a_copied_run_remakes_its_report_byte_for_byte(earlier, tmp_path):
    """The report is a function of the run directory's results.csv and settings.json (the
    checks and the calibration it recorded) and its configuration."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(earlier, copy)
    (copy / "report.md").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "report", str(copy)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (copy / "report.md").read_bytes() == (earlier / "report.md").read_bytes()
