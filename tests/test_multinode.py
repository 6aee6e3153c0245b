"""Ranks on several hosts: the same measurement under `torchrun --nnodes=2`, one agent per "node",
both on this host with a loopback c10d rendezvous, against the suite's own single-node launch."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd

from reports.sections import placement

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
CONTENT = ["experiment", "schedule", "source", "backend", "world_size", "size", "shape", "dtype",
           "verified"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return env


def test_two_node_torchrun_measures_what_one_node_does(tmp_path):
    port, two, one = _free_port(), tmp_path / "two", tmp_path / "one"
    cmd = [str(TORCHRUN), "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=coconet-test", "--max-restarts=0",
           "-m", "experiments", "adam_fusion", "--scale", "smoke", "--out", str(two)]
    agents = [subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        logs = [a.communicate(timeout=600)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    single = subprocess.run([sys.executable, "-m", "experiments", "adam_fusion", "--scale",
                             "smoke", "--world-size", "2", "--out", str(one)], cwd=ROOT,
                            env=_env(), capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-2000:]
    a, b = pd.read_csv(two / "results.csv"), pd.read_csv(one / "results.csv")
    assert len(a) == len(b) > 0  # written once, by rank 0
    assert a[CONTENT].astype(str).values.tolist() == b[CONTENT].astype(str).values.tolist()
    assert set(a.nodes) == {2} and set(a.ranks_per_node) == {1}
    assert set(b.nodes) == {1} and set(b.ranks_per_node) == {2}
    assert "2 = 2 nodes x 1 rank per node" in placement(a)
    assert "2 = 1 node x 2 ranks per node" in placement(b)
