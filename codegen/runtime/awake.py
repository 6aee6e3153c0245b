"""Keep this machine's CPUs awake while ranks are timed.

    with keep_awake(True):     # one idle-priority spinner per CPU until the block ends
        ...                    # calibrate, measure

gloo's ranks wait for a message by blocking (a condition variable, an epoll loop), not by polling
as MPI's progress engines and NCCL's kernels do. A CPU with nothing to run then goes idle, and on
a virtual machine whose idle vCPU halts at once (this project's VMs: cpuidle haltpoll with
`haltpoll.guest_halt_poll_ns=0`) the woken thread waits until the host schedules that vCPU
again: milliseconds, at the host's whim. Measured here (2 gloo ranks, an all-reduce after a
barrier, 280 calls, three alternations): 1 KiB took 0.74-1.21 ms in the median with 32-57% of
calls over 1 ms, against 0.59-0.71 ms and 11-24% with the spinners; 1 MiB took 2.4-3.9 ms
against 1.3-1.7 ms. Without them, one paper run timed the all-reduce of 1-64 KiB at 0.8-0.9 ms
in calibration and at up to 2.5 ms in `experiment=collectives` minutes later.

Contract: `keep_awake(enabled)` starts, for each CPU this process may run on, a child process
pinned to that CPU at SCHED_IDLE (it gets a CPU only when no other thread wants it, so it takes
no time from the ranks' work) that calls sched_yield in a loop; it stops and reaps them when the
block ends, however it ends. Each child also dies with this process (PR_SET_PDEATHSIG: SIGKILL),
so a launcher killed outright leaves none behind. Where SCHED_IDLE or prctl is missing (not
Linux) or `enabled` is false, it does nothing. The calibration a run uses is keyed by whether
it was on (`experiments.calibration.cache`), since it changes every communication's time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager, suppress

# the child (argv: cpu, parent pid): die with the parent (PR_SET_PDEATHSIG = 1, SIGKILL = 9; and
# at once if it is already gone), pin to its CPU, idle priority, then yield forever (a syscall
# loop keeps the vCPU busy without taking a core's execution units from a sibling as a tight
# loop would)
_SPIN = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    sys.exit(0)\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True:\n"
    "    os.sched_yield()\n"
)


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE")


@contextmanager
def keep_awake(enabled: bool = True):
    """Idle-priority spinners on every CPU of this process for the block (see the module)."""
    if not enabled or not supported():
        yield []
        return
    procs: list[subprocess.Popen] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-S", "-c", _SPIN, str(cpu), str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for p in procs:
            with suppress(OSError):
                p.kill()
        for p in procs:
            with suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
