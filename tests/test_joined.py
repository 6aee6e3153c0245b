"""A job's ranks started by a scheduler and led by rank 0 (codegen.runtime.joined): each rank a
process of its own here, as SLURM's tasks are (tests/joined_ranks.py); the same code joins
SLURM's tasks in tests/test_slurm.py."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(case: str, world: int = 2, only=None) -> list[dict]:
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "joined_ranks.py"), str(r), str(world), str(port), case],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (only if only is not None else range(world))
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    results = []
    for out in outs:
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert line, out[-3000:]
        results.append(json.loads(line[-1][len("RESULT ") :]))
    return results


@pytest.mark.slow
def test_rank_zero_leads_and_every_rank_runs_fn():
    lead, serve = _ranks("ok")
    assert lead["value"] == "led" and "error" not in lead and "error" not in serve
    # both ranks ran fn, in rank order; 1 + 2 summed on the two ranks; 2 nodes x 1 rank per node
    assert lead["first"] == [[0, 2, 30.0, [2, 1]], [1, 2, 30.0, [2, 1]]]


@pytest.mark.slow
@pytest.mark.parametrize("bad", [1, 0])
def test_a_ranks_failure_ends_every_rank_with_that_ranks_error(bad):
    start = time.monotonic()
    results = _ranks(f"fail{bad}")
    want = f"rank {bad} failed: ValueError: boom on rank {bad}"
    assert [r.get("error") for r in results] == [want, want]
    assert "second" not in results[0]
    assert time.monotonic() - start < 60  # the waiting peer stopped at once, not at its timeout


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_rendezvous_times_out_with_one_line(rank):
    start = time.monotonic()
    (alone,) = _ranks("timeout", only=[rank])
    assert time.monotonic() - start < 30
    what = (
        "rank 0 could not gather the 1 other ranks on port"
        if rank == 0
        else "rank 1 could not reach rank 0 at 127.0.0.1:"
    )
    assert alone["error"].startswith(f"rendezvous: {what}"), alone
    assert "within 2 s" in alone["error"] and "\n" not in alone["error"]
