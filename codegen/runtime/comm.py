"""Collectives and point-to-point transfers of the runtime, over torch.distributed (gloo on CPU).

Contract
--------
Tensors are contiguous 1-D tensors (callers flatten); dtypes float32, float64, float16, bfloat16,
int32, int64; reductions `op` in "sum", "max", "min", "prod". `group` is a `Group` (the process
group, its members' global ranks in group order, its timeout); None means every rank. A group of
P members; this rank is member `me`; "block i" of a tensor of n*P elements is elements
[i*n, (i+1)*n). Every wait passes the group's timeout, so a lost peer raises, never hangs.

- `all_reduce(x, op)`: gloo's all-reduce, in place.
- `reduce_scatter(x, out, op, chunks)`: x holds n*P elements, out n; out = block `me` of the
  elementwise reduction of every member's x. A ring over isend/irecv (gloo's own reduce-scatter
  costs a whole all-reduce): P-1 steps; at step s this rank sends its partial of block
  (me-s-1) mod P to its right neighbour and receives block (me-s-2) mod P from its left one,
  combining it in place with its own block; after the last step it holds block `me` fully reduced.
  Ring order for sums: ((x[me+1] + x[me+2]) + ...) + x[me].
- `all_gather(x, out, chunks)`: x holds n elements, out n*P; block i of out = member i's x. A ring
  (one exchange for P == 2). x may be a view of out's own block (in place).
- `RingReduceScatter` / `RingAllGather`: the same rings, chunk by chunk, for fused collectives
  (the rings live in `codegen.runtime.rings`, the groups and checks in `codegen.runtime.group`).
- `p2p(x, out, src, dst, chunks)` / `p2p_async`: send x from global rank src into out on dst.
- `broadcast(x, src)`, `reduce(x, out, root, op)` (root's out = reduction, others' out = zeros),
  `all_to_all(x, out)` (x split into P equal pieces, piece j to member j; out = the received
  pieces in member order): gloo's library calls. `library_reduce_scatter` / `library_all_gather`:
  gloo's own versions, for baselines and benchmarks.

Chunks: `chunks` must divide n (the per-member slice), else ValueError. Chunk c of a slice is its
elements [c*n/chunks, (c+1)*n/chunks); in a tensor of P blocks, chunk c of block i is elements
[i*n + c*n/chunks, i*n + (c+1)*n/chunks). Chunks travel as separate messages and are pipelined:
every receive is posted up front, and every first-step send as soon as its data exists.

Tags: each kind of transfer (reduce-scatter, all-gather, P2P) has its own tag range, in which
`tag` (0..63) selects a sub-range, so transfers of different kinds may be in flight together
between the same ranks. Transfers of one kind and one `tag` in flight together are matched in
issue order (gloo matches the messages of one tag first in, first out): every rank must create
them, and issue their chunks, in the same order; give them distinct `tag`s to decouple them.
Buffers given to an operation (x and out) must not be touched until it has completed (`wait()`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .group import (  # noqa: F401
    DTYPES,
    KIND_P2P,
    OPS,
    Group,
    check,
    chunk_size,
    make_tag,
    op_of,
    pg_timeout_s,
    wait_work,
)
from .rings import RingAllGather, RingReduceScatter, all_gather, reduce_scatter  # noqa: F401

# ----------------------------------------------------------------------------- point to point


class P2P:
    """A chunked transfer of x on global rank src into out on global rank dst; the caller is
    src or dst. `start()` issues every chunk; `wait_chunk(c)` -> (begin, end) once chunk c has
    arrived (dst) or been sent (src); `wait()` finishes all."""

    def __init__(
        self, x, out, src: int, dst: int, chunks: int = 1, group: Group | None = None, tag: int = 0
    ):
        self.g, self.src, self.dst, self.rank = group, src, dst, dist.get_rank()
        if self.rank not in (src, dst):
            raise ValueError(f"p2p: rank {self.rank} is neither src={src} nor dst={dst}")
        buf = x if self.rank == src else out
        check(buf, "x" if self.rank == src else "out")
        if src == dst:
            check(out, "out", x.numel(), x.dtype)
        self.x, self.out, self.buf = x, out, buf
        self.chunks, self.k = chunks, chunk_size(buf.numel(), chunks)
        self.tag, self.timeout = tag, (group or Group.world()).timeout
        self._works: list = []

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.k, (c + 1) * self.k

    def start(self) -> P2P:
        if self.src == self.dst:
            self.out.copy_(self.x)
            return self
        for c in range(self.chunks):
            self.start_chunk(c)
        return self

    def start_chunk(self, c: int) -> None:
        """Issue chunk c alone (in chunk order): the sender calls it once chunk c of x is ready."""
        if not self._works:
            self._works = [None] * self.chunks
        lo, hi = self.chunk_range(c)
        pg = self.g.pg if self.g else None
        tag = make_tag(KIND_P2P, self.tag, c)
        if self.rank == self.src:
            work = dist.isend(self.buf[lo:hi], dst=self.dst, group=pg, tag=tag)
        else:
            work = dist.irecv(self.buf[lo:hi], src=self.src, group=pg, tag=tag)
        self._works[c] = work

    def wait_chunk(self, c: int) -> tuple[int, int]:
        if self._works and self._works[c] is not None:  # a gloo Work must be waited only once
            self._works[c].wait(self.timeout)
            self._works[c] = None
        return self.chunk_range(c)

    def wait(self) -> torch.Tensor | None:
        for c in range(len(self._works)):
            self.wait_chunk(c)
        return self.out


def p2p_async(
    x, out, src: int, dst: int, chunks: int = 1, group: Group | None = None, tag: int = 0
) -> P2P:
    """Start a transfer x (on src) -> out (on dst); returns the started handle."""
    return P2P(x, out, src, dst, chunks, group, tag).start()


def p2p(
    x, out, src: int, dst: int, chunks: int = 1, group: Group | None = None, tag: int = 0
) -> torch.Tensor | None:
    """Transfer x (on src) into out (on dst) and wait; returns out (None on src unless given)."""
    return p2p_async(x, out, src, dst, chunks, group, tag).wait()


# ----------------------------------------------------------------------------- library calls


def all_reduce(x, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """x = the reduction of every member's x (gloo, in place)."""
    g = group or Group.world()
    check(x, "x")
    wait_work(dist.all_reduce(x, op=op_of(op)[0], group=g.pg, async_op=True), g)
    return x


def broadcast(x, src: int, group: Group | None = None) -> torch.Tensor:
    """x on every member = x on global rank src (in place)."""
    g = group or Group.world()
    check(x, "x")
    wait_work(dist.broadcast(x, src=src, group=g.pg, async_op=True), g)
    return x


def reduce(x, out, root: int, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """out on global rank root = the reduction of every member's x; out elsewhere = zeros."""
    g = group or Group.world()
    check(x, "x")
    check(out, "out", x.numel(), x.dtype)
    if out.data_ptr() != x.data_ptr():
        out.copy_(x)
    wait_work(dist.reduce(out, dst=root, op=op_of(op)[0], group=g.pg, async_op=True), g)
    if dist.get_rank() != root:
        out.zero_()
    return out


def all_to_all(x, out, group: Group | None = None) -> torch.Tensor:
    """Piece j (of P equal pieces) of x goes to member j; out = received pieces in member order."""
    g = group or Group.world()
    check(x, "x")
    check(out, "out", x.numel(), x.dtype)
    if x.numel() % g.size:
        raise ValueError(f"all_to_all: {x.numel()} elements do not split into {g.size} pieces")
    wait_work(dist.all_to_all_single(out, x, group=g.pg, async_op=True), g)
    return out


def library_reduce_scatter(x, out, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """gloo's own reduce-scatter (an all-reduce inside): the baseline the ring is measured by."""
    g = group or Group.world()
    check(out, "out")
    check(x, "x", out.numel() * g.size, out.dtype)
    call = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    wait_work(call(out, x, op=op_of(op)[0], group=g.pg, async_op=True), g)
    return out


def library_all_gather(x, out, group: Group | None = None) -> torch.Tensor:
    """gloo's own all-gather into one flat tensor."""
    g = group or Group.world()
    check(x, "x")
    check(out, "out", x.numel() * g.size, x.dtype)
    call = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    wait_work(call(out, x, group=g.pg, async_op=True), g)
    return out
