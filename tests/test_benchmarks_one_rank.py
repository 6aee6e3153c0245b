"""benchmarks.one_rank runs on one gloo rank: every Adam schedule timed beside the baseline, and
the profile of the fused one (its figures are the benchmark's to report, not asserted); with
--graph each line adds the host time per step and why the step ran eagerly (the CPU: no graphs)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_one_rank_times_every_schedule_and_profiles_the_fused_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.one_rank",
            "--backend",
            "cpu",
            "--sizes",
            "10",
            "--reps",
            "3",
            "--profile",
            "--graph",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MASTER_PORT": str(port)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("N=2^10: baseline")
    timed = [ln.split()[0] for ln in lines[1:6]]
    assert timed == [
        "AR-C",
        "RS-C-AG",
        "RS-C-AG+as_slice",
        "fuse(RS-C-AG)",
        "fuse(RS-C-AG)+as_slice",
    ]
    assert all(" ms  x" in ln for ln in lines[1:6])
    assert all(
        ln.endswith("us eager: no CUDA graphs on the CPU") and "  host " in ln for ln in lines[1:6]
    )
    assert any(ln.startswith("cProfile, 3 calls of fuse(RS-C-AG)+as_slice") for ln in lines)
