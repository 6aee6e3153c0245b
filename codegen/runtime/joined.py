"""Ranks that a scheduler started (a SLURM job's tasks), led by rank 0; never hang.

    group = join(rank, world_size, ranks_per_node, host, port, rendezvous_timeout_s=300.0)
    rank 0:  value = group.lead(main)   # main() runs here, once; every run_ranks(fn, ...) inside
                                        # it runs fn on every rank of the job
    others:  group.serve()              # run what rank 0 sends until it says stop

Rendezvous: rank 0 serves a TCPStore on host:port (that address alone: `rendezvous.serve_store`;
`host` is the address the user names for rank 0, MASTER_ADDR) and waits up to
`rendezvous_timeout_s` for the others, which keep trying to reach it at host:port as long. A rank
missing, or an address that cannot be served or reached, ends that rank with
`RankError('rendezvous: ...')`. Then the gloo process group (each collective's timeout:
`timeout_s`), torch / OpenMP threads = cores // ranks_per_node, and the environment torchrun would
give (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: `launch.placement`
reads nodes x ranks per node from it).

Protocol, over the store (keys under `coconet/`): rank 0's `run_ranks(fn, world_size, args, ...)`
(codegen.runtime.launch) publishes ('run', fn, args) (picklable, as for `launch`); every rank calls
fn(rank, world_size, *args); the values are gathered (all_gather_object) and rank 0's run_ranks
returns them in rank order (its own value with gather=False). `lead` ends with ('stop',) whatever
main did, and the ranks leave the process group together.

Failures: a rank whose fn raises stores its one-line error, leaves the process group (so that its
peers' collectives end at once, not at their timeout) and raises
`RankError('rank R failed: Type: message')`; a peer whose own fn then fails on the closed
connection (an echo, `failures.looks_like_echo`) raises that stored root cause instead (waiting
up to ECHO_GRACE_S for it). The group is then closed: rank 0's later run_ranks raise at once, the
others return from serve. A rank that dies without a word leaves its peers their connection error. A
world_size that is not the job's is refused: the job's ranks are the measurement's ranks.
"""

from __future__ import annotations

import datetime
import os
import pickle
import time
from typing import Callable, Optional

import torch.distributed as dist

from .failures import RankError, looks_like_echo
from .launch import default_threads, dispatching
from .rank import set_threads
from .rendezvous import serve_store

ECHO_GRACE_S = 2.0  # after an echo, how long to wait for the root cause to be stored
COMMAND_WAIT_S = 30 * 24 * 3600.0  # the others wait this long for rank 0's next command (the
# job's time limit ends them first; a rank 0 that is gone closes the store's connection at once)
_KEY = "coconet/"


def join(
    rank: int,
    world_size: int,
    ranks_per_node: int,
    host: str,
    port: int,
    rendezvous_timeout_s: float = 300.0,
    timeout_s: float = 1800.0,
) -> "Group":
    """This process as rank `rank` of `world_size`, rank 0 at host:port (see the module)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % ranks_per_node),
        LOCAL_WORLD_SIZE=str(ranks_per_node),
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
    )
    set_threads(default_threads(ranks_per_node))
    wait = datetime.timedelta(seconds=rendezvous_timeout_s)
    try:
        store = (
            serve_store(host, port, world_size, wait, wait_for_workers=True)
            if rank == 0
            else dist.TCPStore(host, port, world_size, False, timeout=wait)
        )
    except Exception as e:  # noqa: BLE001 - torch raises several types; each says what failed
        what = (
            f"rank 0 could not gather the {world_size - 1} other ranks on port {port}"
            if rank == 0
            else f"rank {rank} could not reach rank 0 at {host}:{port}"
        )
        raise RankError(
            f"rendezvous: {what} within {rendezvous_timeout_s:g} s ({_one_line(e)})",
            rank=rank,
            ranks=(rank,),
        ) from None
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    store.set_timeout(datetime.timedelta(seconds=COMMAND_WAIT_S))
    return Group(rank, world_size, store)


class Group:
    """A joined job's ranks: rank 0 leads (`lead`), the others serve (`serve`)."""

    def __init__(self, rank: int, world_size: int, store):
        self.rank, self.world_size, self.store = rank, world_size, store
        self.sent = 0  # commands rank 0 sent / the others received
        self.failure: Optional[str] = None  # the first failure's line; the group is closed then

    # -- rank 0 ---------------------------------------------------------------------------------
    def lead(self, main: Callable[[], object]):
        """main() on rank 0 with every run_ranks dispatched to the job's ranks; its value."""
        try:
            with dispatching(self._dispatch):
                return main()
        finally:
            self._send(("stop",))
            self._leave()

    def _dispatch(self, fn, world_size: Optional[int], args: tuple, gather: bool):
        if world_size is not None and world_size != self.world_size:
            raise RankError(
                f"run_ranks: this job has {self.world_size} ranks, the measurement "
                f"needs {world_size} (world_size = nodes x tasks per node)"
            )
        self._send(("run", fn, tuple(args)))
        values = self._gather(self._call(fn, args))
        return values if gather else values[self.rank]

    def _send(self, command: tuple) -> None:
        self.store.set(f"{_KEY}cmd/{self.sent}", pickle.dumps(command))
        self.sent += 1

    # -- the others -----------------------------------------------------------------------------
    def serve(self) -> None:
        """Run rank 0's commands until it says stop (RankError: a rank failed, rank 0 is gone)."""
        while True:
            try:
                command = pickle.loads(self.store.get(f"{_KEY}cmd/{self.sent}"))
            except Exception as e:  # noqa: BLE001 - the store's connection to rank 0
                self._close(f"rank {self.rank} lost rank 0 ({_one_line(e)})")
                raise RankError(self.failure, rank=0, ranks=(0,)) from None
            self.sent += 1
            if command[0] == "stop":
                self._leave()
                return
            _, fn, args = command
            self._gather(self._call(fn, args))

    # -- every rank -----------------------------------------------------------------------------
    def _call(self, fn, args: tuple):
        if self.failure:
            raise RankError(f"the job's ranks stopped after: {self.failure}")
        try:
            return fn(self.rank, self.world_size, *args)
        except BaseException as e:  # noqa: BLE001 - every failure ends the job's ranks
            raise self._failed(e) from None

    def _gather(self, value) -> list:
        values: list = [None] * self.world_size
        try:
            dist.all_gather_object(values, value)
        except BaseException as e:  # noqa: BLE001
            raise self._failed(e) from None
        return values

    def _failed(self, e: BaseException) -> RankError:
        """The RankError this failure ends the job with: this rank's own, or the root cause."""
        line = f"{type(e).__name__}: {_one_line(e)}"
        root = self._root_cause() if looks_like_echo(type(e).__name__, str(e)) else None
        if root is None:
            root = (self.rank, f"rank {self.rank} failed: {line}")
            self.store.set(f"{_KEY}err/{self.rank}", root[1])
        self._close(root[1])
        return RankError(
            root[1], rank=root[0], ranks=(root[0],), exc_type=type(e).__name__, exc_message=str(e)
        )

    def _root_cause(self) -> Optional[tuple[int, str]]:
        """(rank, line) of a peer's stored failure, waiting up to ECHO_GRACE_S for one."""
        keys = [f"{_KEY}err/{r}" for r in range(self.world_size) if r != self.rank]
        end = time.monotonic() + ECHO_GRACE_S
        while True:
            for k in keys:
                if self.store.check([k]):
                    return int(k.rsplit("/", 1)[1]), self.store.get(k).decode()
            if time.monotonic() > end:
                return None
            time.sleep(0.05)

    def _close(self, failure: str) -> None:
        """Record the first failure and leave the process group at once (peers stop waiting)."""
        self.failure = self.failure or failure
        if dist.is_initialized():
            dist.destroy_process_group()

    def _leave(self) -> None:
        """Leave the process group together (no rank tears down under a peer still in gloo)."""
        if dist.is_initialized() and not self.failure:
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."
