"""The runtime's ring reduce-scatter and all-gather over isend/irecv, whole or chunk by chunk
(`codegen.runtime.comm`'s contract: its `reduce_scatter`, `all_gather`, `RingReduceScatter` and
`RingAllGather` are these).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .group import KIND_AG, KIND_RS, Group, check, chunk_size, make_tag, op_of, overlaps, wait_work


class RingReduceScatter:
    """Chunked ring reduce-scatter. `start()`, then `wait_chunk(c)` for c in order (or any order),
    then `wait()`. `wait_chunk(c)` returns (begin, end): out[begin:end] is chunk c of this member's
    block, fully reduced, while later chunks may still be in flight; run a kernel on it at once.
    """

    def __init__(
        self, x, out, op: str = "sum", chunks: int = 1, group: Group | None = None, tag: int = 0
    ):
        self.g = group or Group.world()
        self.P, self.me = self.g.size, self.g.me
        check(out, "out")
        check(x, "x", out.numel() * self.P, out.dtype)
        if overlaps(x, out):
            raise ValueError("reduce_scatter: out must not overlap x")
        self.x, self.out, self.n = x, out, out.numel()
        self.chunks, self.k = chunks, chunk_size(self.n, chunks)
        self.fn = op_of(op)[1]
        self.tag = tag
        self._recvs: dict[tuple[int, int], tuple[torch.Tensor, object]] = {}
        self._sends: list = []
        self._done = 0  # chunks fully reduced
        self._started = False

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.k, (c + 1) * self.k

    def _xblock(self, block: int, c: int) -> torch.Tensor:
        begin = (block % self.P) * self.n + c * self.k
        return self.x[begin : begin + self.k]

    def start(self, send: bool = True) -> RingReduceScatter:
        """Post every receive and, with `send`, every chunk's first send. With send=False the
        caller produces the input chunk by chunk and calls `send_chunk(c)` when chunk c of every
        block of x is ready (an overlapped producer)."""
        if self._started:
            raise RuntimeError("RingReduceScatter.start() called twice")
        self._started = True
        P, me, steps = self.P, self.me, self.P - 1
        if P == 1:
            self.out.copy_(self.x)
            return self
        scratch = self.x.new_empty((steps - 1) * self.n) if steps > 1 else None
        for s in range(steps):  # recv step s into scratch row s, the last step straight into out
            for c in range(self.chunks):
                lo, hi = self.chunk_range(c)
                buf = (
                    self.out[lo:hi]
                    if s == steps - 1
                    else scratch[s * self.n + lo : s * self.n + hi]
                )
                work = dist.irecv(buf, src=self.g.left(me), group=self.g.pg, tag=self._t(s, c))
                self._recvs[(c, s)] = (buf, work)
        if send:
            for c in range(self.chunks):  # step 0 sends come straight from x
                self._send(self._xblock(me - 1, c), 0, c)
        return self

    def send_chunk(self, c: int) -> None:
        """The first send of chunk c (after `start(send=False)`); every member in the same order."""
        if self.P > 1:
            self._send(self._xblock(self.me - 1, c), 0, c)

    def _t(self, s: int, c: int) -> int:
        return make_tag(KIND_RS, self.tag, s * self.chunks + c)

    def _send(self, buf: torch.Tensor, s: int, c: int) -> None:
        work = dist.isend(buf, dst=self.g.right(self.me), group=self.g.pg, tag=self._t(s, c))
        self._sends.append(work)

    def _step(self, c: int, s: int) -> None:
        buf, work = self._recvs.pop((c, s))
        wait_work(work, self.g)
        self.fn(buf, self._xblock(self.me - s - 2, c), out=buf)  # partial of block me-s-2
        if s < self.P - 2:
            self._send(buf, s + 1, c)

    def wait_chunk(self, c: int) -> tuple[int, int]:
        if not self._started:
            raise RuntimeError("RingReduceScatter.wait_chunk() before start()")
        if not 0 <= c < self.chunks:
            raise ValueError(f"chunk {c} out of range 0..{self.chunks - 1}")
        while self._done <= c and self.P > 1:  # chunk-major order, the same on every member
            for s in range(self.P - 1):
                self._step(self._done, s)
            self._done += 1
        return self.chunk_range(c)

    def wait(self) -> torch.Tensor:
        if not self._started:
            self.start()
        self.wait_chunk(self.chunks - 1)
        for work in self._sends:
            wait_work(work, self.g)
        self._sends.clear()
        return self.out


class RingAllGather:
    """Chunked ring all-gather. Receives are posted at construction; `start_chunk(c)` (alias
    `send_chunk`) sends chunk c of this member's slice once the caller has computed it (src[lo:hi]
    with (lo, hi) = chunk_range(c)); `wait()` starts any chunk not yet started and finishes all.
    When src is not out's own block, start_chunk(c) copies src's chunk c into it first. For
    P == 2 the whole transfer is issued by start_chunk; for P > 2 the forwarding steps run in
    wait().
    """

    def __init__(self, src, out, chunks: int = 1, group: Group | None = None, tag: int = 0):
        self.g = group or Group.world()
        self.P, self.me = self.g.size, self.g.me
        check(src, "src")
        check(out, "out", src.numel() * self.P, src.dtype)
        self.src, self.out, self.n = src, out, src.numel()
        self.chunks, self.k = chunks, chunk_size(self.n, chunks)
        self.tag = tag
        self.own = out[self.me * self.n : (self.me + 1) * self.n]
        self.in_place = src.data_ptr() == self.own.data_ptr()
        if not self.in_place and overlaps(src, out):
            raise ValueError("all_gather: src must be out's own block or not overlap out")
        self._started = [False] * chunks
        self._sends: list = []
        self._recvs = {}
        for s in range(self.P - 1):  # step s receives block me-s-1 from the left
            for c in range(chunks):
                buf = self._oblock(self.me - s - 1, c)
                work = dist.irecv(buf, src=self.g.left(self.me), group=self.g.pg, tag=self._t(s, c))
                self._recvs[(c, s)] = work

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.k, (c + 1) * self.k

    def _oblock(self, block: int, c: int) -> torch.Tensor:
        begin = (block % self.P) * self.n + c * self.k
        return self.out[begin : begin + self.k]

    def _t(self, s: int, c: int) -> int:
        return make_tag(KIND_AG, self.tag, s * self.chunks + c)

    def _send(self, buf, s: int, c: int) -> None:
        work = dist.isend(buf, dst=self.g.right(self.me), group=self.g.pg, tag=self._t(s, c))
        self._sends.append(work)

    def start_chunk(self, c: int) -> None:
        if not 0 <= c < self.chunks or self._started[c]:
            raise ValueError(f"chunk {c} out of range 0..{self.chunks - 1} or already started")
        self._started[c] = True
        lo, hi = self.chunk_range(c)
        if not self.in_place:
            self.own[lo:hi].copy_(self.src[lo:hi])
        if self.P > 1:
            self._send(self.own[lo:hi], 0, c)

    send_chunk = start_chunk

    def wait_chunk(self, c: int) -> tuple[int, int]:
        """Chunk c of every member's block in out (forwarding it on as it passes); the chunk's
        element range of a block. Every member waits its chunks in the same order (chunk-major
        here, step-major in `wait`), so the forwarding never waits on itself."""
        if not self._started[c]:
            self.start_chunk(c)
        for s in range(self.P - 1):
            work = self._recvs.pop((c, s), None)
            if work is None:
                continue
            wait_work(work, self.g)
            if s < self.P - 2:
                self._send(self._oblock(self.me - s - 1, c), s + 1, c)
        return self.chunk_range(c)

    def wait(self) -> torch.Tensor:
        for c in range(self.chunks):
            if not self._started[c]:
                self.start_chunk(c)
        # Forward what the right neighbour still needs (steps 1..P-2), in step-major order, the
        # same on every member. (gloo's send/recv Work reports completion only once waited, so
        # forwarding cannot be polled earlier.)
        for (c, s), work in self._recvs.items():
            wait_work(work, self.g)
            if s < self.P - 2:
                self._send(self._oblock(self.me - s - 1, c), s + 1, c)
        self._recvs.clear()
        for work in self._sends:
            wait_work(work, self.g)
        self._sends.clear()
        return self.out


def reduce_scatter(
    x, out, op: str = "sum", chunks: int = 1, group: Group | None = None, tag: int = 0
) -> torch.Tensor:
    """out = block `me` of the reduction over members of x (ring; see the module doc)."""
    return RingReduceScatter(x, out, op, chunks, group, tag).start().wait()


def all_gather(x, out, chunks: int = 1, group: Group | None = None, tag: int = 0) -> torch.Tensor:
    """Block i of out = member i's x (ring; x may be out's own block)."""
    return RingAllGather(x, out, chunks, group, tag).wait()
