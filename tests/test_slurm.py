"""SLURM sweeps on a real one-host cluster (munged + slurmctld + slurmd, tests/slurm_cluster.py).

Skipped, with the reason, where the daemons are not installed or this is not root; `.ci/run`
installs Debian's packages first.
"""
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_cluster import LocalSlurm, available

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(available() is not None, reason=f"no local SLURM: {available()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2) as c:
        yield c


def _sweep(cluster, sweep: Path, *overrides: str, wait: bool = True):
    cmd = [sys.executable, "-m", "suite", "-m", "hydra/launcher=slurm",
           "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
           "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}", *overrides]
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    if wait:
        return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _rows(sweep: Path) -> list[dict]:
    with open(sweep / "sweep.csv") as f:
        return list(csv.DictReader(f))


def test_sweep_of_two_experiments(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    r = _sweep(cluster, sweep, "experiment=adam_fusion,model_parallel", "backend=sim",
               "scale=smoke")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = _rows(sweep)
    assert [row["state"] for row in rows] == ["COMPLETED", "COMPLETED"]
    assert [row["status"] for row in rows] == ["0", "0"]
    assert all(row["job_id"] in r.stdout for row in rows)
    finished = cluster.job_states()  # the cluster's own record of the jobs
    assert {row["job_id"].split("_")[0] for row in rows} <= set(finished)
    for sub in ("0_adam_fusion", "1_model_parallel"):
        results = (sweep / sub / "results.csv").read_text()
        assert "predicted" in results and (sweep / sub / "report.md").exists()


def test_cancelled_job_is_reported_with_its_id_and_state(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(cluster, sweep, "experiment=adam_fusion", "backend=sim", "scale=smoke",
                  "+hydra.launcher.additional_parameters.hold=true", wait=False)
    try:
        job = None
        for _ in range(120):  # the held job waits in the queue until cancelled
            out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=cluster.env,
                                 capture_output=True, text=True, timeout=30).stdout.split()
            if out:
                job = out[0]
                break
            time.sleep(0.5)
        assert job, "the job never reached the queue"
        subprocess.run(["scancel", job], env=cluster.env, check=True, timeout=30)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 3, stdout[-2000:] + stderr[-2000:]
    (row,) = _rows(sweep)
    assert row["job_id"] == job and row["state"] == "CANCELLED" and row["status"] == "3"
    assert f"job {job}" in stdout and "CANCELLED" in stdout
    assert "Traceback" not in stderr
