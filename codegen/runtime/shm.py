"""POSIX shared memory between the ranks of one host: segments, flags, waits that time out.

A `Segment` is a file in /dev/shm mapped into this process (`tensor(dtype)`: a torch view of it).
Names start with `prefix(port)` = "coconet-shm-<MASTER_PORT>-": the rendezvous port is unique among
the runs on a host while they run, so the launcher (`codegen.runtime.launch`) removes whatever a run
left behind by that prefix on every exit path (`remove(prefix)`), a rank killed by SIGKILL included.
A launcher killed outright runs no exit path; the next launch sweeps what such runs left
(`sweep()`: every segment whose rendezvous port no socket of this host listens on or is connected
to any more), and a launch first removes any segment named by its own store's port (a dead run's).
Ranks also unlink each segment as soon as every peer has mapped it (the memory lives on while
mapped and goes when the last process holding it exits), so a name exists only while it is set up.

A `Board` is one flags segment per communicator: a row of int64 counters per member, each written
only by its owner (aligned 8-byte stores: atomic and, on x86, seen in program order after the data
written before them). Counters only grow; `wait(col, target, members)` spins, then yields, until
every listed member's counter has reached `target`, and raises `ShmTimeout` (naming the members it
waited for, what for, and for how long) after `timeout_s`: a dead or hung peer is an error, never
a hang. Columns: per lane (one operation in flight) `posted(lane)` (data written) and `consumed(lane)`
(done reading peers' data), then per peer j `sent(j)` (chunks sent to member j) and `acked(j)`
(chunks received from j and read).
"""

from __future__ import annotations

import glob
import mmap
import os
import time

import numpy as np
import torch

ROOT = "/dev/shm"
LANES = 8  # operations of one communicator in flight at once (a fused step's gathers)


class ShmTimeout(RuntimeError):
    """A wait on shared-memory flags ran out of time (a peer died, hung or diverged)."""


NAMES = "coconet-shm-"  # every segment's name starts so


def prefix(port) -> str:
    """The name prefix of every segment of the run whose rendezvous is on `port`."""
    return f"{NAMES}{port}-"


def remove(name_prefix: str) -> list[str]:
    """Unlink every segment whose name starts with `name_prefix`; the names removed."""
    gone = []
    for path in glob.glob(os.path.join(ROOT, glob.escape(name_prefix) + "*")):
        try:
            os.unlink(path)
            gone.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return gone


def ports_in_use() -> set[int]:
    """The TCP ports runs may hold on this host (IPv4 and IPv6, /proc/net/tcp*): every port a
    socket listens on (a run's store), and every port a socket is connected to (its ranks'
    connections to the store, here or on the store's host). A connection's own local port is
    not one (an ephemeral port a client was given, which a dead run's port can become), nor is
    any port of a socket no process holds any more (inode 0, e.g. in TIME_WAIT)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl, local ip:port, remote ip:port, state, ..., inode
            if len(fields) < 10 or fields[9] == "0":
                continue
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
            ports.add(local if fields[3] == "0A" else remote)  # 0A: TCP_LISTEN
    return ports


def sweep() -> list[str]:
    """Unlink the segments of runs that are over: no socket of this host listens on the port in
    the segment's name or is connected to it (`ports_in_use`: a live run's store listens on it,
    its ranks are connected to it), so the segment was left by a launcher killed before its
    cleanup. The names removed; none where the sockets cannot be read."""
    if not os.path.exists("/proc/net/tcp"):
        return []
    used, gone = ports_in_use(), []
    for path in glob.glob(os.path.join(ROOT, NAMES + "*")):
        port = port_of(path)
        if port is not None and port not in used:
            gone += remove(prefix(port))
    return gone


def port_of(path: str) -> int | None:
    """The rendezvous port in a segment's name (`prefix`), None if it has none."""
    port = os.path.basename(path)[len(NAMES) :].split("-", 1)[0]
    return int(port) if port.isdigit() else None


class Segment:
    """A named shared-memory file of `nbytes`, created (`create=True`) or opened, and mapped."""

    def __init__(self, name: str, nbytes: int, create: bool):
        self.name, self.nbytes = name, nbytes
        self.path = os.path.join(ROOT, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            self.mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)

    def tensor(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """The whole segment as a 1-D tensor of `dtype` (shares the memory)."""
        return torch.frombuffer(self.mm, dtype=torch.uint8).view(dtype)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Board:
    """The flags of one communicator: a row of counters per member (see the module doc)."""

    def __init__(self, segment: Segment, members: int, me: int, timeout_s: float):
        self.P, self.me, self.timeout_s = members, me, timeout_s
        self.flags = np.frombuffer(segment.mm, dtype=np.int64).reshape(members, -1)
        self.segment = segment

    @staticmethod
    def nbytes(members: int) -> int:
        return members * Board.width(members) * 8

    @staticmethod
    def width(members: int) -> int:
        """Counters a row holds, rounded up to whole 64-byte lines (no false sharing)."""
        return -(-(2 * LANES + 2 * members) // 8) * 8

    @staticmethod
    def posted(lane: int) -> int:
        """The column counting a member's posts on `lane` (data written, or a barrier)."""
        return 2 * lane

    @staticmethod
    def consumed(lane: int) -> int:
        """The column counting a member's operations on `lane` done reading its peers' data."""
        return 2 * lane + 1

    def sent(self, peer: int) -> int:
        """The column counting the chunks a member has sent to `peer` (point to point)."""
        return 2 * LANES + peer

    def acked(self, peer: int) -> int:
        """The column counting the chunks a member has received from `peer` and read."""
        return 2 * LANES + self.P + peer

    def set(self, col: int, value: int) -> None:
        self.flags[self.me, col] = value

    def get(self, member: int, col: int) -> int:
        return int(self.flags[member, col])

    def wait(self, col: int, target: int, members, what: str) -> None:
        """Until every one of `members` has counter `col` >= target; ShmTimeout after timeout_s."""
        members = list(members)
        flags, spins, start = self.flags, 0, None
        while True:
            if all(flags[m, col] >= target for m in members):
                return
            spins += 1
            if spins < 64:
                continue
            if start is None:
                start = time.monotonic()
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                late = [m for m in members if flags[m, col] < target]
                raise ShmTimeout(
                    f"shm: member {self.me} waited {waited:.1f} s for member(s) "
                    f"{late} ({what}); a peer died, hung or called a different "
                    f"collective"
                )
            time.sleep(0 if waited < 1e-3 else 2e-5)
