"""SLURM sweeps on a real one-host cluster (munged + slurmctld + two slurmd, "node1" and "node2",
2 CPUs each, all on this host: tests/slurm_cluster.py).

Skipped, with the reason, where the daemons are not installed or this is not root; `.ci/run`
installs Debian's packages first. What the two nodes do not test: two machines' networks and
disks (both nodes share this host's loopback, cores and file system).
"""

import csv
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from slurm_cluster import LocalSlurm, available

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(available() is not None, reason=f"no local SLURM: {available()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=2, nodes=2) as c:
        yield c


def _sweep(cluster, sweep: Path, *overrides: str, wait: bool = True, launcher: str = "slurm"):
    cmd = [
        sys.executable,
        "-m",
        "suite",
        "-m",
        f"hydra/launcher={launcher}",
        "hydra.launcher.partition=debug",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
        f"hydra.sweep.dir={sweep}",
        *overrides,
    ]
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    if wait:
        return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _rows(sweep: Path) -> list[dict]:
    with open(sweep / "sweep.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_of_two_experiments(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    r = _sweep(
        cluster, sweep, "experiment=adam_fusion,model_parallel", "backend=sim", "scale=smoke"
    )
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


@pytest.mark.slow
def test_cancelled_job_is_reported_with_its_id_and_state(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(
        cluster,
        sweep,
        "experiment=adam_fusion",
        "backend=sim",
        "scale=smoke",
        "+hydra.launcher.additional_parameters.hold=true",
        wait=False,
    )
    try:
        job = None
        for _ in range(120):  # the held job waits in the queue until cancelled
            out = subprocess.run(
                ["squeue", "-h", "-o", "%i %T"],
                env=cluster.env,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
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


# one measurement whose ranks are a job's two tasks, one on each node; small, and verified at 2
# ranks only, to stay short
RANKS_JOB = (
    "hydra.launcher.nodes=2",
    "hydra.launcher.tasks_per_node=1",
    "experiment=adam_fusion",
    "scale=smoke",
    "calibration=off",
    "experiment.sizes=[{N:4096}]",
    "verify.world_sizes=[2]",
)


@pytest.fixture(scope="module")
def ranks_sweep(cluster, tmp_path_factory):
    sweep = tmp_path_factory.mktemp("ranks") / "sweep"
    return sweep, _sweep(cluster, sweep, *RANKS_JOB, launcher="submitit_slurm")


def _measured(run_dir: Path):
    df = pd.read_csv(run_dir / "results.csv")
    return df[df.source == "measured"]


@pytest.mark.slow
def test_one_job_whose_tasks_are_the_ranks(cluster, ranks_sweep):
    sweep, r = ranks_sweep
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = _rows(sweep)
    assert (row["state"], row["status"], row["nodes"], row["tasks_per_node"]) == (
        "COMPLETED",
        "0",
        "2",
        "1",
    )
    assert row["points_measured"] == "1" and row["points_resumed"] == "0"
    assert f"job {row['job_id']}" in r.stdout and "2 ranks = 2 nodes x 1 task" in r.stdout
    logs = {
        p.name.split("_log")[0][-1]: p.read_text() for p in (sweep / ".submitit").rglob("*_log.out")
    }
    assert "rank 0 of 2 on node1 (node 0 of 2): joined rank 0 at 127.0.0.1:" in logs["0"]
    assert "rank 1 of 2 on node2 (node 1 of 2): joined rank 0 at 127.0.0.1:" in logs["1"]
    run = Path(row["run_dir"])
    m = _measured(run)
    assert len(m) == 6 and not m.duplicated(["schedule", "size"]).any()  # written once
    assert set(m.world_size) == {2} and set(m.nodes) == {2} and set(m.ranks_per_node) == {1}
    assert m.verified.all()
    assert "2 = 2 nodes x 1 rank per node" in (run / "report.md").read_text()
    print(
        f"ranks job {row['job_id']} {row['state']}: 2 nodes x 1 task, "
        f"{len(m)} measured rows in {run}"
    )


@pytest.mark.slow
def test_resumed_sweep_skips_each_jobs_measured_points(cluster, ranks_sweep):
    sweep, first = ranks_sweep
    assert first.returncode == 0
    r = _sweep(cluster, sweep, *RANKS_JOB, "resume=true", launcher="submitit_slurm")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = _rows(sweep)
    assert (row["state"], row["status"]) == ("COMPLETED", "0")
    assert (row["points_resumed"], row["points_measured"]) == ("1", "0")
    assert "points measured 0, resumed 1" in r.stdout
    run = Path(row["run_dir"])
    assert len(_measured(run)) == 6 and (run / "results.1.csv").exists()
    log = "".join(p.read_text() for p in (sweep / ".submitit").rglob(f"{row['job_id']}_0_log.out"))
    assert "resume: 6 measured rows kept" in log
    print(
        f"resumed job {row['job_id']} {row['state']}: points resumed "
        f"{row['points_resumed']}, measured {row['points_measured']}"
    )


@pytest.mark.slow
def test_a_failed_rendezvous_ends_the_job_with_its_error(cluster, tmp_path):
    with socket.socket() as taken:  # rank 0 cannot serve on this port
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _sweep(
            cluster,
            tmp_path / "sweep",
            *RANKS_JOB,
            f"hydra.launcher.rendezvous_port={port}",
            "hydra.launcher.rendezvous_timeout_s=5",
            launcher="submitit_slurm",
        )
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = _rows(tmp_path / "sweep")
    assert (row["state"], row["status"]) == ("FAILED", "3")
    assert "rendezvous: rank 0 could not gather the 1 other ranks on port" in row["error"]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_ranks_failure_ends_the_job_with_that_ranks_error(cluster, tmp_path):
    sweep = tmp_path / "sweep"
    module = ROOT / "tests" / "fixtures" / "user_experiments" / "rank1_fails.py"
    r = _sweep(
        cluster,
        sweep,
        *RANKS_JOB[:2],
        "experiment=adam_rank1_fails",
        f"experiment.module={module}",
        *RANKS_JOB[3:],
        launcher="submitit_slurm",
    )
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = _rows(sweep)
    assert row["status"] == "3"
    assert row["error"] == (
        "rank 1 failed: RuntimeError: the baseline cannot start on rank 1 (a test)"
    )
    assert (Path(row["run_dir"]) / "report.md").exists()  # rank 0 wrote its report
    print(f"job {row['job_id']} {row['state']} exit {row['status']}: {row['error']}")
