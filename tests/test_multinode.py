"""Ranks on several hosts: the same measurement under `torchrun --nnodes=2`, one agent per "node",
both on this host with a loopback c10d rendezvous, against the suite's own single-node launch; and
the SLURM launcher's configuration (its two spellings; a job of tasks as ranks checked before it
is submitted). A SLURM job whose tasks are the ranks runs in tests/test_slurm.py."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reports.sections import placement

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
CONTENT = [
    "experiment",
    "schedule",
    "source",
    "backend",
    "world_size",
    "size",
    "shape",
    "dtype",
    "verified",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return env


@pytest.mark.slow
def test_two_node_torchrun_measures_what_one_node_does(tmp_path):
    port, two, one = _free_port(), tmp_path / "two", tmp_path / "one"
    cmd = [
        str(TORCHRUN),
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=coconet-test",
        "--max-restarts=0",
        "-m",
        "experiments",
        "adam_fusion",
        "--scale",
        "smoke",
        "--out",
        str(two),
    ]
    agents = [
        subprocess.Popen(
            cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    try:
        logs = [a.communicate(timeout=600)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments",
            "adam_fusion",
            "--scale",
            "smoke",
            "--world-size",
            "2",
            "--out",
            str(one),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    a, b = pd.read_csv(two / "results.csv"), pd.read_csv(one / "results.csv")
    assert len(a) == len(b) > 0  # written once, by rank 0
    assert a[CONTENT].astype(str).values.tolist() == b[CONTENT].astype(str).values.tolist()
    assert set(a.nodes) == {2} and set(a.ranks_per_node) == {1}
    assert set(b.nodes) == {1} and set(b.ranks_per_node) == {2}
    assert "2 = 2 nodes x 1 rank per node" in placement(a)
    assert "2 = 1 node x 2 ranks per node" in placement(b)


def test_submitit_slurm_is_the_suites_launcher_and_slurm_the_same():
    from hydra import compose, initialize_config_dir

    from suite import CONF_DIR
    from suite.config import register
    from suite.slurm import register_launcher

    register()
    register_launcher()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        a, b = (
            compose(
                "config",
                overrides=[f"hydra/launcher={name}", "experiment=adam_fusion"],
                return_hydra_config=True,
            ).hydra.launcher
            for name in ("submitit_slurm", "slurm")
        )
    assert a == b
    assert a._target_ == "hydra_plugins.coconet_suite.slurm_launcher.SweepLauncher"
    for key in (
        "partition",
        "account",
        "timeout_min",
        "nodes",
        "tasks_per_node",
        "gpus_per_node",
        "rendezvous_timeout_s",
        "rendezvous_port",
    ):
        assert key in a


@pytest.mark.slow
def test_a_job_of_tasks_as_ranks_needs_world_size_tasks_before_submitting(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "-m",
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.nodes=2",
            "experiment=adam_fusion",
            "backend=sim",
            "world_size=4",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip() == (
        "error: hydra.launcher: a job of 2 tasks (nodes x tasks_per_node) "
        "runs 2 ranks, but world_size=4 (job: experiment=adam_fusion "
        "backend=sim world_size=4); set world_size=2"
    )
    assert not (tmp_path / ".submitit").exists()  # nothing submitted
