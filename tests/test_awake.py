"""codegen.runtime.awake: idle-priority spinners, one per CPU, for the block only, and never left
behind (the block's end, or the launcher killed outright)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from codegen.runtime.awake import keep_awake, supported

pytestmark = pytest.mark.skipif(not supported(), reason="needs Linux's SCHED_IDLE")


def _gone(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True  # a zombie: dead, waiting for its parent to reap it
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_one_idle_priority_spinner_per_cpu_for_the_block_only():
    cpus = sorted(os.sched_getaffinity(0))
    with keep_awake(True) as procs:
        assert len(procs) == len(cpus)
        time.sleep(0.5)  # each sets its own affinity and policy once started
        assert all(p.poll() is None for p in procs)  # spinning, not exited
        assert sorted(min(os.sched_getaffinity(p.pid)) for p in procs) == cpus
        assert all(len(os.sched_getaffinity(p.pid)) == 1 for p in procs)
        assert all(os.sched_getscheduler(p.pid) == os.SCHED_IDLE for p in procs)
    assert all(p.poll() is not None for p in procs)  # stopped and reaped when the block ends


def test_disabled_starts_nothing():
    with keep_awake(False) as procs:
        assert procs == []


def test_an_error_in_the_block_still_stops_them():
    with pytest.raises(RuntimeError):
        with keep_awake(True) as procs:
            raise RuntimeError("boom")
    assert procs and all(p.poll() is not None for p in procs)


def test_a_launcher_killed_outright_leaves_no_spinner():
    code = textwrap.dedent("""
        import sys, time
        from codegen.runtime.awake import keep_awake
        with keep_awake(True) as procs:
            print(" ".join(str(p.pid) for p in procs), flush=True)
            time.sleep(60)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    pids = [int(x) for x in parent.stdout.readline().split()]
    assert pids
    time.sleep(0.5)
    parent.kill()
    parent.wait(timeout=10)
    assert all(_gone(pid) for pid in pids)  # PR_SET_PDEATHSIG: SIGKILL with the parent
