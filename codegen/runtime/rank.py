"""The rank side of `codegen.runtime.launch`: how a rank process is started and what it runs.

`context()` is multiprocessing's 'forkserver' context, its server importing `PRELOAD` once (the
first launch of a process starts it; `preload(...)` adds modules): a rank is a fork of the
server, two of them started in 0.06 s here where a 'spawn'ed rank imports torch afresh (1.5 s
for two). `rank_main(...)` is a rank's body: it takes the launching process's environment and its
current stdout and stderr (`Fd`: a descriptor multiprocessing passes a duplicate of) as they were
at the launch, ends itself when the launching process is gone (`_exit_with`: end-of-file on a
pipe only that process writes to; the fork server, its parent, lives as long as its forks do),
initialises gloo, runs the function and sends ('ok', value) or ('err', type, message,
traceback) back, pickled plainly (`_send`). `set_threads(n)`: n threads for torch and for OpenMP
runtimes loaded from then on.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import pickle
import signal
import sys
import traceback
from contextlib import suppress
from multiprocessing import reduction

from ..logs import configure

HOST = "127.0.0.1"


def set_threads(threads: int) -> None:
    """Use `threads` threads in torch and in OpenMP runtimes loaded from now on."""
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


PRELOAD = ["torch", "torch.distributed", "codegen.runtime.rank"]


def preload(*modules: str) -> None:
    """Have the fork server import `modules` too, when it starts (a process's first launch):
    what the ranks of this process's runs would import each (`experiments` registers itself:
    0.85 s a rank here)."""
    PRELOAD.extend(m for m in modules if m not in PRELOAD)


def context():
    """The 'forkserver' context, its server importing `PRELOAD` once: a rank is a fork of it,
    started in ~0.1 s, where a 'spawn'ed one imports torch afresh (1.5 s for two ranks here)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class Fd:
    """One of the launching process's file descriptors, which the rank receives a duplicate of
    (multiprocessing passes it, as it does a Pipe's): the rank's `int` once unpickled."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _exit_with(alive) -> None:
    """A daemon thread that ends this process once the launching process is gone: `alive` is
    the read end of a pipe whose only write end that process holds, so its death (SIGKILL and
    SIGTERM run no cleanup) is end-of-file here, and its ranks do not live on."""
    import threading

    def watch() -> None:
        with suppress(EOFError, OSError):
            while True:
                alive.recv_bytes()
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


def rank_main(
    rank, world_size, port, fn, args, timeout_s, threads, conn, stacks_path, env, alive, outs
) -> None:
    """Body of a launched rank: init gloo, run fn, send ('ok', value) or ('err', ...) back.
    SIGUSR1 dumps every thread's Python stack into `stacks_path` (read by the parent on a
    timeout); the rank ends itself when its parent is gone. A terminal's Ctrl-C reaches every
    process of its group: the ranks ignore SIGINT and leave it to the parent, which stops them
    (no traceback from each rank)."""
    os.environ.clear()  # the launching process's, as it was at the launch (not the server's)
    os.environ.update(env)
    for fd, dup in zip((1, 2), outs):  # its stdout and stderr as they are now (a test's capture)
        os.dup2(dup, fd)
        os.close(dup)
    configure()  # the entry point's level, from the environment it exported
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with(alive)
    stacks = open(stacks_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    os.environ.update(
        MASTER_ADDR=HOST,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    failed = False
    try:
        import torch.distributed as dist

        set_threads(threads)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(HOST, port, None, False, timeout=timeout)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        value = fn(rank, world_size, *args)
        _send(conn, ("ok", value))
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        failed = True
        with suppress(BaseException):  # if the pipe is gone, the exit code still tells
            _send(conn, ("err", type(exc).__name__, str(exc), traceback.format_exc()))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
    if failed:
        os._exit(1)  # peers may be blocked on us; do not run gloo's teardown
    try:  # leave together: a peer's teardown under a rank still in gloo aborted it once
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the result is already with the parent
        os._exit(0)


def _send(conn, message) -> None:
    # Plain pickle, not the pipe's ForkingPickler: that one shares tensors through file
    # descriptors served by the sending process, which is about to exit.
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
