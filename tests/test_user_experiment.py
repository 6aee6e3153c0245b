"""A user's own experiment, kept outside the project's packages (tests/fixtures/user_experiments/),
runs through `python -m suite` as a shipped one does: verification, measured rows against its own
torch baseline (torch.optim.SGD with momentum), predictions over that baseline, and a report."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from test_suite_cli import assert_one_line_error, suite_cmd

import experiments
from suite import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "user_experiments"
SGD = FIXTURES / "sgd_momentum.py"
SCHEDULES = ["AR-C", "RS-C-AG", "RS-C-AG+as_slice", "fuse(RS-C-AG)", "fuse(RS-C-AG)+as_slice"]


@pytest.mark.slow
def test_sgd_momentum_runs_through_the_suite(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "experiment=sgd_momentum",
            f"experiment.module={SGD}",
            "scale=smoke",
            "verify.world_sizes=[2]",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=PROJECT_ROOT,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# sgd_momentum\n") and "## Verification" in report
    for name in SCHEDULES:
        assert f"| `{name}` | 2 |" in report  # verified against the unscheduled program
    df = pd.read_csv(tmp_path / "results.csv")
    measured = df[df.source == "measured"]
    assert set(measured.schedule) == {"baseline", *SCHEDULES}
    assert set(measured["size"]) == {1 << 12, 1 << 14, 1 << 16}
    assert measured.verified.all()
    predicted = df[(df.source == "predicted") & (df.topology == "local")]
    assert set(predicted.schedule) == {"baseline", *SCHEDULES}
    # the baseline's predicted computation is the time its own torch.optim.SGD step took
    for _, row in measured[measured.schedule == "baseline"].iterrows():
        pred = predicted[(predicted.schedule == "baseline") & (predicted["size"] == row["size"])]
        assert pred.compute_ms.iloc[0] == pytest.approx(row.compute_ms, rel=1e-3, abs=1e-3)
    assert (tmp_path / "figures" / "sgd_momentum.png").exists()


def test_a_dotted_module_on_the_python_path_registers_too(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    (exp,) = experiments.load_module("sgd_momentum")
    try:
        assert exp.name == "sgd_momentum" and list(exp.schedules()) == SCHEDULES
        assert experiments.get("sgd_momentum") is exp
    finally:
        experiments.registry.unregister("sgd_momentum")
    assert "sgd_momentum" not in experiments.names()


@pytest.mark.slow
def test_a_module_that_cannot_load_is_one_line(tmp_path):
    proc = suite_cmd(
        "experiment=sgd_momentum", "experiment.module=no_such_module", f"hydra.run.dir={tmp_path}"
    )
    assert_one_line_error(proc, "cannot import experiment module 'no_such_module'")
    proc = suite_cmd("experiment=other", f"experiment.module={SGD}", f"hydra.run.dir={tmp_path}")
    assert_one_line_error(proc, "unknown experiment 'other'", "sgd_momentum")
