"""Start ranks on this machine, or join ranks that torchrun/SLURM started; never hang.

Contract
--------
`launch(fn, world_size, args=(), timeout_s=120.0, *, threads_per_rank=None) -> list`
    Starts `world_size` processes (multiprocessing's 'forkserver' context: the server, started
    by the first launch of a process, imports torch and the suite once (`codegen.runtime.rank`),
    and each rank is a fork of it: 0.06 s to start two ranks here, where 'spawn' took 1.5 s).
    Rank r initialises
    `torch.distributed` with the gloo backend (a TCPStore hosted by the calling process, listening
    on 127.0.0.1 alone (`rendezvous.serve_store`), on a free port chosen by the OS, so there is
    no port race; the process group's timeout is
    `timeout_s`), calls `fn(rank, world_size, *args)` and sends its return value back. `fn`, `args`
    and the return values must be picklable (`fn` a module-level function). Returns the values in
    rank order.
    - A rank that raises ends the run at once: the other ranks are killed and `RankError` is raised
      with the one-line message `rank R failed: <ExceptionType>: <message>`; the remote traceback
      is `err.remote_traceback`. When a rank's failure makes its peers fail too (a closed
      connection in a collective), the root cause is reported, not the echo.
    - A rank that exits without reporting (segfault, `os._exit`, killed) gives
      `rank R failed: died with exit code C` (or `killed by signal SIGNAME`).
    - After `timeout_s` of wall-clock time the run is ended and `RankError` names the ranks that
      had not finished (`err.ranks`); `err.remote_traceback` holds their Python stacks at that
      moment (dumped by faulthandler on SIGUSR1).
    - `collective_timeout_s` (default `timeout_s`): each collective's own timeout in the ranks
      (the gloo process group's), so a rank that stops answering ends its peers' waits then, not
      at the run's end. A rank whose process is suspended (SIGSTOP: state T in /proc) is named:
      `rank R is stopped (suspended, e.g. by SIGSTOP)`, with what its peers said.
    - How a report or an exit becomes that line, and RankError itself: `codegen.runtime.failures`.
    - A parent killed outright (Ctrl-C twice, SIGTERM, SIGKILL) leaves no ranks behind: each
      rank holds the read end of a pipe only the launching process writes to, and exits at its
      end-of-file (the fork server then ends with its last rank).
    - Shared-memory segments of the run (`codegen.runtime.shm`, named by the store's port) are
      removed when it ends, however it ends; a launch first removes those named by its own
      store's port and those whose port no socket on this host listens on or is connected to any
      more (`shm.sweep`: a launcher killed outright left them).
    - The ranks' stack files live in a temporary folder named after the launching process
      (`coconet-ranks-<pid>-*`), removed when the run ends; a launch first removes the folders of
      launching processes that are gone (killed outright, their cleanup never ran).
    Children get the caller's `sys.path` and current folder (multiprocessing sends them), so
    project modules and test modules import in the ranks whether the project is installed or run
    from the repository root, and the caller's environment as it is at the launch (sent with the
    rank's arguments: the server's own is the first launch's). Each child's environment carries
    MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE as torchrun would set
    them, and OMP_NUM_THREADS = threads per rank.

`init_from_env(timeout_s=120.0, *, threads_per_rank=None) -> (rank, world_size)`
    For processes started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): initialises
    the gloo process group from env:// (no-op if already initialised) and returns its coordinates.

`run_ranks(fn, world_size=None, args=(), timeout_s=120.0, *, gather=True, threads_per_rank=None)`
    Under torchrun: `init_from_env`, then `fn(rank, world_size, *args)` in this process; with
    `gather=True` every rank returns the list of all ranks' values in rank order (gathered with
    `all_gather_object`), with `gather=False` only its own value. Exceptions propagate unchanged
    (torchrun's agent then stops the other ranks). Otherwise: `launch(...)`, which returns the list.
    `world_size=None` means "what torchrun says" and is an error outside torchrun. Within
    `dispatching(to)` (rank 0 of a job's ranks: codegen.runtime.joined), `to(fn, world_size,
    args, gather)` runs it on the job's ranks instead.

Threads: each rank uses `threads_per_rank` threads, by default max(1, cores // ranks on this
machine), both for torch (`torch.set_num_threads`) and for OpenMP code compiled later
(OMP_NUM_THREADS), so that ranks sharing the cores do not oversubscribe them.

Memory: the ranks run with glibc malloc keeping what is freed (`MALLOC_SETTINGS`, in the fork
server's environment from the first launch on, which its forks inherit: no mmap'd
blocks, no trimming), so a library that allocates temporaries every step (torch's LAMB: six
N-element tensors) reuses warm pages instead of page-faulting fresh ones each call, as a caching
allocator does on GPUs. Measured here: that LAMB step at 2^22 elements, 66 ms -> 20 ms, and its
time no longer depends on what the process allocated before. A value the caller set wins; under
torchrun set them in the launching shell.
"""

from __future__ import annotations

import datetime
import glob
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
from contextlib import contextmanager
from multiprocessing.connection import wait as _wait_ready

from . import shm
from .failures import RankError, failure, raise_failure, raise_timeout  # noqa: F401 (RankError)
from .rank import HOST, Fd, context, rank_main, set_threads
from .rendezvous import serve_store

MALLOC_SETTINGS = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
_ECHO_GRACE_S = 1.0  # after a failure that looks like an echo, wait this long for its cause
_STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
_EXIT_GRACE_S = 10.0  # after all results arrived, ranks may take this long to exit
_DUMP_WAIT_S = 0.3  # on a timeout, time given to the hung ranks to dump their stacks
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(ranks_on_host: int) -> int:
    """Threads per rank so that `ranks_on_host` ranks share the cores without oversubscribing."""
    return max(1, cpu_cores() // max(1, ranks_on_host))


def started_by_torchrun() -> bool:
    """True when the torchrun/SLURM-style rendezvous variables are all set."""
    return all(k in os.environ for k in _TORCHRUN_VARS)


# ----------------------------------------------------------------------------- launch


def launch(
    fn,
    world_size: int,
    args: tuple = (),
    timeout_s: float = 120.0,
    *,
    threads_per_rank: int | None = None,
    collective_timeout_s: float | None = None,
) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` local gloo ranks; see the module doc."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    threads = threads_per_rank or default_threads(world_size)
    deadline = time.monotonic() + timeout_s
    store = serve_store(HOST, 0, None, datetime.timedelta(seconds=timeout_s))
    ctx = context()
    procs, conns = [], []
    alive_r, alive_w = ctx.Pipe(duplex=False)  # the ranks' sign of this process: EOF when it dies
    stacks_dir = _stacks_dir()
    shm.remove(shm.prefix(store.port))  # a dead run's, on the port this store was given
    shm.sweep()  # what launchers killed outright left (no socket listens on their port)
    try:
        malloc = {k: v for k, v in MALLOC_SETTINGS.items() if k not in os.environ}
        with _env(OMP_NUM_THREADS=str(threads), **malloc):
            for rank in range(world_size):
                recv_end, send_end = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=rank_main,
                    name=f"rank{rank}",
                    args=(
                        rank,
                        world_size,
                        store.port,
                        fn,
                        tuple(args),
                        collective_timeout_s or timeout_s,
                        threads,
                        send_end,
                        _stacks_path(stacks_dir.name, rank),
                        dict(os.environ),
                        alive_r,
                        (Fd(1), Fd(2)),
                    ),
                )
                proc.start()
                send_end.close()
                procs.append(proc)
                conns.append(recv_end)
        results = _collect(procs, conns, deadline, timeout_s, stacks_dir.name)
        _stop(procs, grace_s=_EXIT_GRACE_S)
        return results
    finally:
        _stop(procs, grace_s=0.0)
        for conn in conns:
            conn.close()
        alive_r.close()
        alive_w.close()
        stacks_dir.cleanup()
        shm.remove(shm.prefix(store.port))  # what comm=shm ranks left, even killed ones
        del store


STACKS_PREFIX = "coconet-ranks-"


def _stacks_dir() -> tempfile.TemporaryDirectory:
    """A temporary folder for the ranks' stack files, named after this process, once the
    folders of launching processes that no longer exist are removed."""
    for old in glob.glob(os.path.join(tempfile.gettempdir(), STACKS_PREFIX + "*-*")):
        pid = os.path.basename(old)[len(STACKS_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{STACKS_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _stacks_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.stacks")


def _collect(procs, conns, deadline: float, timeout_s: float, stacks_dir: str) -> list:
    """Wait for every rank's report; raise RankError on the first failure or at the deadline."""
    results: dict[int, object] = {}
    failures: list[dict] = []
    pending = set(range(len(procs)))
    decide_at = None
    while pending:
        now = time.monotonic()
        if decide_at is not None and now >= decide_at:
            break
        if decide_at is None and now >= deadline:
            _raise_if_stopped(
                procs, pending, f" and the run did not finish within timeout_s={timeout_s:g}"
            )
            raise_timeout(sorted(pending), timeout_s, _dump_stacks(procs, pending, stacks_dir))
        waiting = {conns[r]: ("msg", r) for r in pending}
        waiting.update({procs[r].sentinel: ("exit", r) for r in pending})
        ready = _wait_ready(list(waiting), timeout=(decide_at or deadline) - now)
        for kind, rank in sorted((waiting[obj] for obj in ready), key=lambda kr: kr[0] != "msg"):
            if rank not in pending or (kind == "exit" and conns[rank].poll()):
                continue
            outcome = _read(conns[rank], procs[rank]) if kind == "msg" else None
            if outcome is not None and outcome[0] == "ok":
                results[rank] = outcome[1]
            else:
                failures.append(failure(rank, outcome, procs[rank], _STOP_GRACE_S))
            pending.discard(rank)
        if failures and decide_at is None:
            echo_only = all(f["echo"] for f in failures)
            decide_at = time.monotonic() + (_ECHO_GRACE_S if echo_only and pending else 0.0)
    # a suspended rank: its peers' collectives timed out waiting for it
    _raise_if_stopped(procs, pending, f" (its peers: {failures[0]['line']})" if failures else "")
    if failures:
        raise_failure(failures)
    return [results[r] for r in range(len(procs))]


def _raise_if_stopped(procs, pending, why: str) -> None:
    """RankError naming the first of the `pending` ranks whose process is suspended, if any."""
    stopped = [r for r in sorted(pending) if _stopped(procs[r].pid)]
    if stopped:
        raise RankError(
            f"rank {stopped[0]} is stopped (suspended, e.g. by SIGSTOP){why}"[:600],
            rank=stopped[0],
            ranks=tuple(stopped),
        )


def _stopped(pid: int) -> bool:
    """Whether the process is suspended (state T or t in /proc: SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _read(conn, proc):
    try:
        data = conn.recv_bytes()
    except (EOFError, OSError):
        proc.join(_STOP_GRACE_S)
        return None
    try:
        return pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - e.g. a class the caller cannot import
        return (
            "err",
            type(exc).__name__,
            f"cannot unpickle the rank's report: {exc}",
            traceback.format_exc(),
        )


def _dump_stacks(procs, ranks, stacks_dir: str) -> str:
    """Ask the hung ranks for their Python stacks (SIGUSR1, faulthandler); return the text."""
    for rank in ranks:
        if procs[rank].is_alive():
            os.kill(procs[rank].pid, signal.SIGUSR1)
    time.sleep(_DUMP_WAIT_S)
    texts = []
    for rank in sorted(ranks):
        try:
            with open(_stacks_path(stacks_dir, rank)) as f:
                texts.append(f"rank {rank}:\n{f.read()}")
        except OSError:
            pass
    return "\n".join(texts)


def _stop(procs, grace_s: float) -> None:
    """Let ranks exit for `grace_s`, then SIGTERM, then SIGKILL; reap them all."""
    end = time.monotonic() + grace_s
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(0.0, end - time.monotonic()))
    alive = [p for p in procs if p.pid is not None and p.is_alive()]
    for proc in alive:
        proc.terminate()
    end = time.monotonic() + _STOP_GRACE_S
    for proc in alive:
        proc.join(max(0.0, end - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextmanager
def _env(**values: str):
    """Set environment variables in this process for the duration (children inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# ----------------------------------------------------------------------------- torchrun


def placement() -> tuple[int, int]:
    """(nodes, ranks per node) of this rank's job: torchrun's (or the local launcher's)
    LOCAL_WORLD_SIZE ranks on each of WORLD_SIZE / LOCAL_WORLD_SIZE nodes; (1, 1) alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) or world
    return max(1, world // local), local


def init_from_env(
    timeout_s: float = 120.0, *, threads_per_rank: int | None = None
) -> tuple[int, int]:
    """Join the gloo process group described by torchrun's variables; return (rank, world_size)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [k for k in _TORCHRUN_VARS if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_from_env: {', '.join(missing)} not set; start the ranks with "
            "torchrun, or use launch()"
        )
    world_size = int(os.environ["WORLD_SIZE"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    set_threads(threads_per_rank or default_threads(local_size))
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout_s)
    )
    return dist.get_rank(), dist.get_world_size()


_DISPATCH: list = []  # the innermost `dispatching` target: a joined job's rank 0


@contextmanager
def dispatching(to):
    """Within: run_ranks(fn, world_size, args, ..., gather=g) is to(fn, world_size, args, g)."""
    _DISPATCH.append(to)
    try:
        yield
    finally:
        _DISPATCH.pop()


def run_ranks(
    fn,
    world_size: int | None = None,
    args: tuple = (),
    timeout_s: float = 120.0,
    *,
    gather: bool = True,
    threads_per_rank: int | None = None,
    collective_timeout_s: float | None = None,
):
    """Run fn on every rank: join torchrun's ranks, or launch local ones; see the module doc."""
    if _DISPATCH:
        return _DISPATCH[-1](fn, world_size, tuple(args), gather)
    if not started_by_torchrun():
        if world_size is None:
            raise ValueError("run_ranks: world_size is required outside torchrun")
        return launch(
            fn,
            world_size,
            args,
            timeout_s,
            threads_per_rank=threads_per_rank,
            collective_timeout_s=collective_timeout_s,
        )
    import torch.distributed as dist

    rank, size = init_from_env(timeout_s, threads_per_rank=threads_per_rank)
    if world_size is not None and world_size != size:
        raise ValueError(f"run_ranks: world_size={world_size} but torchrun started {size} ranks")
    value = fn(rank, size, *args)
    if not gather:
        return value
    values: list = [None] * size
    dist.all_gather_object(values, value)
    return values
