"""ShmComm: the Communicator interface (`codegen.runtime.communicator`) over POSIX shared memory.

For the ranks of one host (`comm=shm` of the cpu backend). Every member has, per lane, a slot: a
segment it writes and its peers map and read (`codegen.runtime.shm`). An operation takes the first
free lane (the same on every member: they issue the same operations in the same order), waits
until its peers have finished reading that lane's previous operation, writes its input into its
slot, posts, and reads what it needs from its peers' slots:
- all_reduce: write the peers' slices of x; each member reduces its own slice in place in x
  (reading the peers' slots) and writes it into its slot; post; every member reads the P-1
  reduced slices of its peers (the all-gather is a read).
- reduce_scatter: write the peers' blocks of x; out = the reduction of block `me` (its own from
  x, the peers' from their slots).
- all_gather, broadcast, reduce, all_to_all: write, post, read what the kind says.
- chunked: `reduce_scatter_chunks` posts chunk c of every block with `send_chunk(c)` and reduces
  it in `wait_chunk(c)`; `all_gather_chunks` posts chunk c in `start_chunk(c)`, reads chunk c of
  every block in `wait_chunk(c)` and every chunk in `wait()`; `p2p` copies chunk c into the sender's pair segment and counts it sent, the
  receiver reads it and counts it acknowledged (the sender's next transfer waits for that).
Slots grow (collectively, to the next power of two) when an operation needs more; the segment is
unlinked as soon as every peer has mapped it. Every wait times out (the group's timeout, or
`timeout_s`) with `shm.ShmTimeout`. Reductions go in member order within each slice (in place: the member's own first).
"""

from __future__ import annotations

import itertools
import os
import socket

import torch
import torch.distributed as dist

from . import comm, shm

_ids = itertools.count()
REDUCE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul}
MIN_SLOT_BYTES = 1 << 20


def bounds(n: int, P: int, i: int) -> tuple[int, int]:
    """Member i's slice [lo, hi) of n elements split over P (the first n % P take one more)."""
    return i * n // P, (i + 1) * n // P


class Lane:
    """One operation in flight: the members' slots (grown collectively) and its counters."""

    def __init__(self, c: "ShmComm", index: int):
        self.c, self.index, self.busy = c, index, False
        self.posts = self.ops = self.gen = self.cap = 0
        self.slots: list[torch.Tensor] = []

    def begin(self, nbytes: int, what: str) -> "Lane":
        """Wait until peers are done with this lane's previous operation; grow the slots."""
        b = self.c.board
        b.wait(b.consumed(self.index), self.ops, self.c.peers, f"{what}: peers reading")
        if nbytes > self.cap:
            self.grow(max(MIN_SLOT_BYTES, 1 << (nbytes - 1).bit_length()), what)
        self.busy = True
        return self

    def grow(self, cap: int, what: str) -> None:
        c, me = self.c, self.c.group.me
        self.gen += 1
        name = lambda i: f"{c.base}l{self.index}-m{i}-g{self.gen}"  # noqa: E731
        mine = shm.Segment(name(me), cap, create=True)
        self.post(f"{what}: slot created")
        segs = [
            mine if i == me else shm.Segment(name(i), cap, create=False)
            for i in range(c.group.size)
        ]
        self.post(f"{what}: slots mapped")
        mine.unlink()
        self.slots, self.cap = [s.tensor() for s in segs], cap

    def view(self, member: int, like: torch.Tensor, numel: int | None = None) -> torch.Tensor:
        n = like.numel() if numel is None else numel
        return self.slots[member][: n * like.element_size()].view(like.dtype)

    def post(self, what: str, wait: bool = True) -> None:
        """Count a post; with `wait`, until every peer has posted as often (a barrier)."""
        self.posts += 1
        b = self.c.board
        b.set(b.posted(self.index), self.posts)
        if wait:
            b.wait(b.posted(self.index), self.posts, self.c.peers, what)

    def wait_posts(self, target: int, what: str) -> None:
        b = self.c.board
        b.wait(b.posted(self.index), target, self.c.peers, what)

    def end(self) -> None:
        self.ops += 1
        b = self.c.board
        b.set(b.consumed(self.index), self.ops)
        self.busy = False


class ShmComm:
    """Collectives and point-to-point over shared memory among the members of `group`."""

    reads_peers = True  # a fused step's kernels may read the peers' slots themselves

    def __init__(self, group: comm.Group, streams=None, timeout_s: float | None = None):
        self.group, P, me = group, group.size, group.me
        hosts = [None] * P
        dist.all_gather_object(hosts, socket.gethostname(), group=group.pg)
        if len(set(hosts)) > 1:
            raise ValueError(
                f"comm=shm needs every rank of the group on one host; hosts: {sorted(set(hosts))}"
            )
        self.timeout_s = timeout_s or group.timeout_s
        if "MASTER_PORT" not in os.environ:
            raise ValueError(
                "comm=shm names its segments by the rendezvous port: MASTER_PORT "
                "must be set (the launcher and torchrun set it)"
            )
        self.base = shm.prefix(os.environ["MASTER_PORT"]) + f"g{group.ranks[0]}x{P}-c{next(_ids)}-"
        nbytes = shm.Board.nbytes(P)
        if me == 0:
            seg = shm.Segment(self.base + "board", nbytes, create=True)
        dist.barrier(group=group.pg)
        if me != 0:
            seg = shm.Segment(self.base + "board", nbytes, create=False)
        dist.barrier(group=group.pg)
        if me == 0:
            seg.unlink()
        self.board = shm.Board(seg, P, me, self.timeout_s)
        self.peers = [i for i in range(P) if i != me]
        self.lanes: list[Lane] = []
        self.pairs: dict[tuple[int, int], dict] = {}

    def lane(self, nbytes: int, what: str) -> Lane:
        free = next((ln for ln in self.lanes if not ln.busy), None)
        if free is None:
            if len(self.lanes) == shm.LANES:
                raise RuntimeError(f"shm: more than {shm.LANES} operations in flight ({what})")
            free = Lane(self, len(self.lanes))
            self.lanes.append(free)
        return free.begin(nbytes, what)

    def _reduce(self, out, parts, op: str) -> None:
        """out = the reduction of parts, in member order; where out is one of them (in place),
        that one first, so that it is read before it is overwritten."""
        fn = REDUCE[op]
        same = [i for i, p in enumerate(parts) if p.data_ptr() == out.data_ptr()]
        if same:
            parts = [parts[same[0]]] + parts[: same[0]] + parts[same[0] + 1 :]
        fn(parts[0], parts[1], out=out) if len(parts) > 1 else out.copy_(parts[0])
        for p in parts[2:]:
            fn(out, p, out=out)

    # -- whole operations --------------------------------------------------------------------
    def all_reduce(self, x, op: str) -> None:
        P, me, n = self.group.size, self.group.me, x.numel()
        ln = self.lane(n * x.element_size(), "all_reduce")
        mine = ln.view(me, x)
        for i in self.peers:  # only what the peers read: their slices of x
            lo, hi = bounds(n, P, i)
            mine[lo:hi].copy_(x[lo:hi])
        ln.post("all_reduce: inputs")
        lo, hi = bounds(n, P, me)
        self._reduce(
            x[lo:hi], [x[lo:hi] if i == me else ln.view(i, x)[lo:hi] for i in range(P)], op
        )
        mine[lo:hi].copy_(x[lo:hi])
        ln.post("all_reduce: reduced slices")
        for i in self.peers:
            lo, hi = bounds(n, P, i)
            x[lo:hi].copy_(ln.view(i, x)[lo:hi])
        ln.end()

    def reduce_scatter(self, x, out, op: str) -> None:
        self.reduce_scatter_chunks(x, out, op, 1).start().wait()

    def all_gather(self, x, out) -> None:
        self.all_gather_chunks(x, out, 1).wait()

    def broadcast(self, x, root: int) -> None:
        me = self.group.me
        ln = self.lane(x.numel() * x.element_size(), "broadcast")
        if me == root:
            ln.view(me, x).copy_(x)
        ln.post("broadcast")
        if me != root:
            x.copy_(ln.view(root, x))
        ln.end()

    def reduce(self, x, out, root: int, op: str) -> None:
        P, me = self.group.size, self.group.me
        ln = self.lane(x.numel() * x.element_size(), "reduce")
        ln.view(me, x).copy_(x)
        ln.post("reduce")
        if me == root:
            self._reduce(out, [ln.view(i, x) for i in range(P)], op)
        else:
            out.zero_()  # as the other transports: only the root's out holds the reduction
        ln.end()

    def all_to_all(self, x, out) -> None:
        P, me = self.group.size, self.group.me
        k = x.numel() // P
        ln = self.lane(x.numel() * x.element_size(), "all_to_all")
        ln.view(me, x).copy_(x)
        ln.post("all_to_all")
        for i in range(P):
            out[i * k : (i + 1) * k].copy_(ln.view(i, x)[me * k : (me + 1) * k])
        ln.end()

    # -- chunk by chunk ------------------------------------------------------------------------
    def reduce_scatter_chunks(
        self, x, out, op: str, chunks: int, reduce: bool = True
    ) -> "ShmReduceScatter":
        """With `reduce=False` `wait_chunk(c)` only waits for chunk c of every member; the
        caller's kernel reduces it, reading `peers()` (out is left alone)."""
        return ShmReduceScatter(self, x, out, op, chunks, reduce)

    def all_gather_chunks(self, src, out, chunks: int, in_slot: bool = False) -> "ShmAllGather":
        """With `in_slot=True` the caller writes its source into `slot` (a kernel's output) and
        `start_chunk(c)` only posts it; src is then a buffer of the source's shape."""
        return ShmAllGather(self, src, out, chunks, in_slot)

    def p2p(self, x, out, src: int, dst: int, chunks: int) -> "ShmP2P":
        return ShmP2P(self, x, out, src, dst, chunks)


class ShmReduceScatter:
    """x: P blocks of out's size; chunk c of every block posted, then reduced into out."""

    def __init__(self, c: ShmComm, x, out, op: str, chunks: int, reduce: bool = True):
        self.c, self.x, self.out, self.op, self.C, self.reduce = c, x, out, op, chunks, reduce
        self.k = comm.chunk_size(out.numel(), chunks)
        self.ln = c.lane(x.numel() * x.element_size(), "reduce_scatter")
        self.base, self.sent, self.reduced = self.ln.posts, 0, [False] * chunks

    def blocks(self, member: int) -> torch.Tensor:
        return self.ln.view(member, self.x).view(self.c.group.size, self.C, self.k)

    def peers(self) -> list[torch.Tensor]:
        """Every member's block `me` as it wrote it (n elements each, in member order): the
        peers' in their slots, this member's own in x (never copied to its slot)."""
        me = self.c.group.me
        return [
            self.own() if i == me else self.blocks(i)[me].view(-1) for i in range(self.c.group.size)
        ]

    def own(self) -> torch.Tensor:
        me, n = self.c.group.me, self.out.numel()
        return self.x.view(-1)[me * n : (me + 1) * n]

    def start(self, send: bool = True) -> "ShmReduceScatter":
        if send:
            for c in range(self.C):
                self.send_chunk(c)
        return self

    def send_chunk(self, c: int) -> None:
        """Chunk c of the blocks the peers reduce (this member's own block stays in x)."""
        if c != self.sent:
            raise ValueError(f"shm reduce_scatter: chunk {c} sent before chunk {self.sent}")
        me, P, k = self.c.group.me, self.c.group.size, self.k
        mine, xs = self.blocks(me), self.x.view(P, self.C, k)
        if me > 0:
            mine[:me, c].copy_(xs[:me, c])
        if me + 1 < P:
            mine[me + 1 :, c].copy_(xs[me + 1 :, c])
        self.sent += 1
        self.ln.post(f"reduce_scatter chunk {c}", wait=False)

    def wait_chunk(self, c: int) -> tuple[int, int]:
        while self.sent <= c:
            self.send_chunk(self.sent)
        k = self.k
        if not self.reduced[c]:
            self.ln.wait_posts(self.base + c + 1, f"reduce_scatter chunk {c}")
            if not self.reduce:
                self.reduced[c] = True
                return c * k, (c + 1) * k
            parts = [p.view(self.C, k)[c] for p in self.peers()]
            self.c._reduce(self.out[c * k : (c + 1) * k], parts, self.op)
            self.reduced[c] = True
        return c * k, (c + 1) * k

    def wait(self) -> None:
        for c in range(self.C):
            self.wait_chunk(c)
        self.ln.end()


class ShmAllGather:
    """Chunk c of src posted by `start_chunk(c)`; `wait()` reads every member's chunks."""

    def __init__(self, c: ShmComm, src, out, chunks: int, in_slot: bool = False):
        self.c, self.src, self.out, self.C, self.in_slot = c, src, out, chunks, in_slot
        self.k = comm.chunk_size(src.numel(), chunks)
        self.ln = c.lane(src.numel() * src.element_size(), "all_gather")
        self.base, self.started = self.ln.posts, 0

    @property
    def slot(self) -> torch.Tensor:
        """This member's slot, where its peers read its source (src's dtype and element count)."""
        return self.ln.view(self.c.group.me, self.src)

    @property
    def own_block(self) -> torch.Tensor:
        """This member's block of out (where `wait(own=False)` leaves what the caller wrote)."""
        me, n = self.c.group.me, self.src.numel()
        return self.out[me * n : (me + 1) * n]

    def start_chunk(self, c: int) -> None:
        if c != self.started:
            raise ValueError(f"shm all_gather: chunk {c} started before chunk {self.started}")
        k = self.k
        if not self.in_slot:
            self.slot[c * k : (c + 1) * k].copy_(self.src[c * k : (c + 1) * k])
        self.started += 1
        self.ln.post(f"all_gather chunk {c}", wait=False)

    def wait_chunk(self, c: int) -> None:
        """Chunk c of every member's block read into out, once every member has posted it (this
        member's chunks up to c are posted first). `wait()` then reads the whole blocks again."""
        while self.started <= c:
            self.start_chunk(self.started)
        self.ln.wait_posts(self.base + c + 1, "all_gather")
        n, k = self.src.numel(), self.k
        for i in range(self.c.group.size):
            self.out[i * n + c * k : i * n + (c + 1) * k].copy_(
                self.ln.view(i, self.src)[c * k : (c + 1) * k]
            )

    def wait(self, own: bool = True) -> None:
        """Every member's chunks read into out (with own=False the peers' only: the caller
        wrote its own block)."""
        while self.started < self.C:
            self.start_chunk(self.started)
        self.ln.wait_posts(self.base + self.C, "all_gather")
        n, me = self.src.numel(), self.c.group.me
        for i in range(self.c.group.size):
            if own or i != me:
                self.out[i * n : (i + 1) * n].copy_(self.ln.view(i, self.src))
        self.ln.end()


class ShmP2P:
    """Chunks from global rank src to dst through src's segment for the pair."""

    def __init__(self, c: ShmComm, x, out, src: int, dst: int, chunks: int):
        g = c.group
        self.c, self.C = c, chunks
        self.i, self.j = g.ranks.index(src), g.ranks.index(dst)
        self.sending = g.me == self.i
        self.buf = x if self.sending else out
        self.k = comm.chunk_size(self.buf.numel(), chunks)
        st = c.pairs.setdefault(
            (self.i, self.j), {"total": 0, "gen": 0, "cap": 0, "seg": None, "opened": 0}
        )
        self.st, self.base, self.done = st, st["total"], 0
        nbytes = self.buf.numel() * self.buf.element_size()
        b = c.board
        if self.sending:  # the previous transfer's chunks all read before this one overwrites
            b.wait(b.acked(self.i), self.base, [self.j], f"p2p to {dst}: previous read")
        if nbytes > st["cap"]:
            st["gen"] += 1
            st["cap"] = max(MIN_SLOT_BYTES, 1 << (nbytes - 1).bit_length())
            if self.sending:
                st["seg"] = shm.Segment(self.name(), st["cap"], create=True).tensor()
        st["total"] += chunks

    def name(self) -> str:
        return f"{self.c.base}p{self.i}to{self.j}-g{self.st['gen']}"

    def piece(self, c: int) -> torch.Tensor:
        k = self.k
        return self.st["seg"][: self.buf.numel() * self.buf.element_size()].view(self.buf.dtype)[
            c * k : (c + 1) * k
        ]

    def start(self) -> "ShmP2P":
        if self.sending:
            for c in range(self.C):
                self.start_chunk(c)
        return self

    def start_chunk(self, c: int) -> None:
        if not self.sending:
            return
        if c != self.done:
            raise ValueError(f"shm p2p: chunk {c} sent before chunk {self.done}")
        self.piece(c).copy_(self.buf[c * self.k : (c + 1) * self.k])
        self.done += 1
        self.c.board.set(self.c.board.sent(self.j), self.base + self.done)

    def wait_chunk(self, c: int) -> tuple[int, int]:
        if self.sending:
            while self.done <= c:
                self.start_chunk(self.done)
            return c * self.k, (c + 1) * self.k
        b = self.c.board
        while self.done <= c:
            d = self.done
            b.wait(b.sent(self.j), self.base + d + 1, [self.i], f"p2p from {self.i} chunk {d}")
            if self.st["opened"] != self.st["gen"]:  # the sender's segment, mapped then unlinked
                seg = shm.Segment(self.name(), self.st["cap"], create=False)
                seg.unlink()
                self.st["seg"], self.st["opened"] = seg.tensor(), self.st["gen"]
            self.buf[d * self.k : (d + 1) * self.k].copy_(self.piece(d))
            self.done += 1
            b.set(b.acked(self.i), self.base + self.done)
        return c * self.k, (c + 1) * self.k

    def wait(self) -> None:
        self.wait_chunk(self.C - 1)
