"""Communicators: the collectives and point-to-point transfers a Plan uses, over one group.

A Communicator is made by a Backend for a `comm.Group` and the runner's `Streams`; tensors are
contiguous 1-D, reductions `op` in "sum", "max", "min", "prod", `root` a member index of the group,
`src`/`dst` global ranks. Whole operations (issued by the caller on the comm stream):
`all_reduce(x, op)` in place; `reduce_scatter(x, out, op)` (x: P blocks of out's size, out = block
`me` of the reduction); `all_gather(x, out)`; `broadcast(x, root)`; `reduce(x, out, root, op)` (out on
the root = the reduction, zeros elsewhere); `all_to_all(x, out)`.

Chunk by chunk, with per-chunk completion (chunk c of an n-element slice: elements
[c*n/C, (c+1)*n/C); of block i of a P-block tensor: the same range shifted by i*n):
- `reduce_scatter_chunks(x, out, op, C)`: `start(send=True)` issues every chunk (send=False: the
  caller produces x chunk by chunk and calls `send_chunk(c)` when chunk c of every block is ready);
  `wait_chunk(c)` returns chunk c's range in out once it is reduced, for the compute that follows;
  `wait()` finishes all.
- `all_gather_chunks(src, out, C)`: `start_chunk(c)` once chunk c of src has been computed;
  `wait_chunk(c)` once chunk c of every block has arrived in out (for the compute that reads it:
  `ol(AG,MM)`); `wait()` starts the rest and finishes all.
- `p2p(x, out, src, dst, C)` (this rank is src or dst): `start()` or `start_chunk(c)`,
  `wait_chunk(c)`, `wait()`.
"Once" means: for the work the caller issues next on the compute stream. On the CPU, where there
are no streams, the calls block until it is so; on a GPU they order the streams with events and
return at once.

- `RingComm`: the rings and library calls of `codegen.runtime.comm` (gloo: chunked rings over
  isend/irecv, since gloo's own reduce-scatter costs a whole all-reduce).
- `LibraryComm`: torch.distributed's own collectives, one call per chunk: NCCL on GPUs (chunks are
  ordered by events between the compute and the comm stream), gloo on the CPU (tests of the same
  path without a GPU). NCCL's reduce-scatter and all-gather take one contiguous piece per member,
  so chunk c of every block is packed before its reduce-scatter and scattered after its gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm

OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
# torch >= 2.13 names them *_single; older releases only have the *_tensor names
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class RingComm:
    """`codegen.runtime.comm` over gloo (no streams: every call has completed when it returns)."""

    reads_peers = False  # kernels cannot read the peers' data (see shm_comm.ShmComm)

    def __init__(self, group: comm.Group, streams=None):
        self.group = group

    def all_reduce(self, x, op: str) -> None:
        comm.all_reduce(x, op=op, group=self.group)

    def reduce_scatter(self, x, out, op: str) -> None:
        comm.reduce_scatter(x, out, op=op, group=self.group)

    def all_gather(self, x, out) -> None:
        comm.all_gather(x, out, group=self.group)

    def broadcast(self, x, root: int) -> None:
        comm.broadcast(x, src=self.group.ranks[root], group=self.group)

    def reduce(self, x, out, root: int, op: str) -> None:
        comm.reduce(x, out, root=self.group.ranks[root], op=op, group=self.group)

    def all_to_all(self, x, out) -> None:
        comm.all_to_all(x, out, group=self.group)

    def reduce_scatter_chunks(self, x, out, op: str, chunks: int) -> comm.RingReduceScatter:
        return comm.RingReduceScatter(x, out, op=op, chunks=chunks, group=self.group)

    def all_gather_chunks(self, src, out, chunks: int) -> comm.RingAllGather:
        return comm.RingAllGather(src, out, chunks=chunks, group=self.group)

    def p2p(self, x, out, src: int, dst: int, chunks: int) -> comm.P2P:
        return comm.P2P(x, out, src=src, dst=dst, chunks=chunks, group=self.group)


class LibraryComm:
    """torch.distributed's collectives (NCCL or gloo), chunks ordered by the runner's streams."""

    reads_peers = False

    def __init__(self, group: comm.Group, streams):
        self.group, self.streams, self.pg = group, streams, group.pg

    def all_reduce(self, x, op: str) -> None:
        dist.all_reduce(x, op=OPS[op], group=self.pg)

    def reduce_scatter(self, x, out, op: str) -> None:
        _reduce_scatter(out, x, op=OPS[op], group=self.pg)

    def all_gather(self, x, out) -> None:
        _all_gather(out, x, group=self.pg)

    def broadcast(self, x, root: int) -> None:
        dist.broadcast(x, src=self.group.ranks[root], group=self.pg)

    def reduce(self, x, out, root: int, op: str) -> None:
        if out.data_ptr() != x.data_ptr():
            out.copy_(x)
        dist.reduce(out, dst=self.group.ranks[root], op=OPS[op], group=self.pg)
        if self.group.me != root:
            out.zero_()  # as the ring backend: only the root's out holds the reduction

    def all_to_all(self, x, out) -> None:
        dist.all_to_all_single(out, x, group=self.pg)

    def reduce_scatter_chunks(self, x, out, op: str, chunks: int) -> "ChunkedReduceScatter":
        return ChunkedReduceScatter(self, x, out, op, chunks)

    def all_gather_chunks(self, src, out, chunks: int) -> "ChunkedAllGather":
        return ChunkedAllGather(self, src, out, chunks)

    def p2p(self, x, out, src: int, dst: int, chunks: int) -> "ChunkedP2P":
        return ChunkedP2P(self, x, out, src, dst, chunks)

    def issue(self, fn) -> object:
        """Run fn on the comm stream after the compute stream's work so far; its completion event."""
        s = self.streams
        with s.on(s.comm):
            fn()
            return s.record(s.comm)


class ChunkedReduceScatter:
    """One library reduce-scatter per chunk; chunk c of every block packed first."""

    def __init__(self, c: LibraryComm, x, out, op: str, chunks: int):
        self.c, self.out, self.op, self.chunks = c, out, op, chunks
        self.k = comm.chunk_size(out.numel(), chunks)
        self.blocks = x.view(c.group.size, chunks, self.k)
        self.done: list = [None] * chunks

    def start(self, send: bool = True) -> "ChunkedReduceScatter":
        if send:
            for c in range(self.chunks):
                self.send_chunk(c)
        return self

    def send_chunk(self, c: int) -> None:
        piece = self.out[c * self.k : (c + 1) * self.k]
        self.done[c] = self.c.issue(
            lambda: _reduce_scatter(
                piece, self.blocks[:, c].contiguous().view(-1), op=OPS[self.op], group=self.c.pg
            )
        )

    def wait_chunk(self, c: int) -> tuple[int, int]:
        self.c.streams.wait(self.c.streams.compute, self.done[c])
        return c * self.k, (c + 1) * self.k

    def wait(self) -> None:
        """Nothing left to do here: later work is ordered after each chunk's event."""


class ChunkedAllGather:
    """One library all-gather per chunk, scattered into chunk c of every block of out."""

    def __init__(self, c: LibraryComm, src, out, chunks: int):
        self.c, self.src, self.out, self.chunks = c, src, out, chunks
        self.k = comm.chunk_size(src.numel(), chunks)
        self.started = [False] * chunks
        self.done: list = [None] * chunks

    def start_chunk(self, c: int) -> None:
        self.started[c] = True
        P, k = self.c.group.size, self.k

        def gather() -> None:
            got = torch.empty(P * k, dtype=self.src.dtype, device=self.src.device)
            _all_gather(got, self.src[c * k : (c + 1) * k], group=self.c.pg)
            self.out.view(P, self.chunks, k)[:, c].copy_(got.view(P, k))

        self.done[c] = self.c.issue(gather)

    def wait_chunk(self, c: int) -> tuple[int, int]:
        """Later compute-stream work waits for chunk c of every block."""
        if not self.started[c]:
            self.start_chunk(c)
        self.c.streams.wait(self.c.streams.compute, self.done[c])
        return c * self.k, (c + 1) * self.k

    def wait(self) -> None:
        for c in range(self.chunks):
            if not self.started[c]:
                self.start_chunk(c)


class ChunkedP2P:
    """One library send or receive per chunk between global ranks src and dst."""

    def __init__(self, c: LibraryComm, x, out, src: int, dst: int, chunks: int):
        self.c, self.src, self.dst = c, src, dst
        self.sending = dist.get_rank() == src
        self.buf = x if self.sending else out
        self.k = comm.chunk_size(self.buf.numel(), chunks)
        self.chunks, self.done = chunks, [None] * chunks

    def start(self) -> "ChunkedP2P":
        for c in range(self.chunks):
            self.start_chunk(c)
        return self

    def start_chunk(self, c: int) -> None:
        piece = self.buf[c * self.k : (c + 1) * self.k]
        if self.sending:
            self.done[c] = self.c.issue(lambda: dist.send(piece, dst=self.dst, group=self.c.pg))
        else:
            self.done[c] = self.c.issue(lambda: dist.recv(piece, src=self.src, group=self.c.pg))

    def wait_chunk(self, c: int) -> tuple[int, int]:
        self.c.streams.wait(self.c.streams.compute, self.done[c])
        return c * self.k, (c + 1) * self.k

    def wait(self) -> None:
        """Nothing left to do here: later work is ordered after each chunk's event."""
