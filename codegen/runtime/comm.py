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
- `RingReduceScatter` / `RingAllGather`: the same rings, chunk by chunk, for fused collectives.
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

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = {"sum": (dist.ReduceOp.SUM, torch.add), "max": (dist.ReduceOp.MAX, torch.maximum),
       "min": (dist.ReduceOp.MIN, torch.minimum), "prod": (dist.ReduceOp.PRODUCT, torch.mul)}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
_KIND_RS, _KIND_AG, _KIND_P2P = 1, 2, 3
_SEQ_BITS, _USER_TAGS = 20, 64


@dataclass(frozen=True)
class Group:
    """A process group (`pg`, None = default), its members' global ranks, and its timeout."""

    pg: object
    ranks: tuple[int, ...]
    timeout_s: float

    @classmethod
    def world(cls) -> Group:
        return cls(None, tuple(range(dist.get_world_size())), pg_timeout_s(None))

    @classmethod
    def of(cls, pg, ranks=None) -> Group:
        """Wrap an existing process group; `ranks` default to its members in group order."""
        ranks = tuple(ranks if ranks is not None else dist.get_process_group_ranks(pg))
        return cls(pg, ranks, pg_timeout_s(pg))

    @classmethod
    def new(cls, ranks, timeout_s: float | None = None) -> Group:
        """Create a subgroup; collective: every rank must call it, with the same ranks."""
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        pg = dist.new_group(list(ranks), timeout=timeout, backend="gloo")
        return cls(pg, tuple(ranks), timeout_s or pg_timeout_s(None))

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def me(self) -> int:
        rank = dist.get_rank()
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} is not a member of group {list(self.ranks)}")
        return self.ranks.index(rank)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def right(self, me: int) -> int:
        return self.ranks[(me + 1) % self.size]

    def left(self, me: int) -> int:
        return self.ranks[(me - 1) % self.size]


def pg_timeout_s(pg) -> float:
    """The timeout a process group was created with (torch's default if it cannot be read)."""
    try:
        group = pg if pg is not None else dist.group.WORLD
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return dist.default_pg_timeout.total_seconds()


def chunk_size(n: int, chunks: int) -> int:
    """Elements per chunk of an n-element slice; ValueError unless `chunks` divides n."""
    if chunks < 1 or n % chunks:
        raise ValueError(f"chunks={chunks} must be >= 1 and divide the slice of n={n} elements")
    return n // chunks


def _check(t: torch.Tensor, name: str, numel: int | None = None, dtype=None) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor (flatten it first)")
    if t.dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (one of {DTYPES})")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements, expected {numel}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}")


def _op(op: str):
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {sorted(OPS)}")
    return OPS[op]


def _tag(kind: int, user_tag: int, seq: int) -> int:
    if not 0 <= user_tag < _USER_TAGS or seq >= 1 << _SEQ_BITS:
        raise ValueError(f"tag={user_tag} must be in 0..{_USER_TAGS - 1} (and chunks*steps < 2^20)")
    return (kind << 26) | (user_tag << _SEQ_BITS) | seq


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _wait(work, group: Group) -> None:
    if work is not None:
        work.wait(group.timeout)


# ----------------------------------------------------------------------------- rings


class RingReduceScatter:
    """Chunked ring reduce-scatter. `start()`, then `wait_chunk(c)` for c in order (or any order),
    then `wait()`. `wait_chunk(c)` returns (begin, end): out[begin:end] is chunk c of this member's
    block, fully reduced, while later chunks may still be in flight; run a kernel on it at once.
    """

    def __init__(self, x, out, op: str = "sum", chunks: int = 1, group: Group | None = None,
                 tag: int = 0):
        self.g = group or Group.world()
        self.P, self.me = self.g.size, self.g.me
        _check(out, "out")
        _check(x, "x", out.numel() * self.P, out.dtype)
        if _overlaps(x, out):
            raise ValueError("reduce_scatter: out must not overlap x")
        self.x, self.out, self.n = x, out, out.numel()
        self.chunks, self.k = chunks, chunk_size(self.n, chunks)
        self.fn = _op(op)[1]
        self.tag = tag
        self._recvs: dict[tuple[int, int], tuple[torch.Tensor, object]] = {}
        self._sends: list = []
        self._done = 0  # chunks fully reduced
        self._started = False

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.k, (c + 1) * self.k

    def _xblock(self, block: int, c: int) -> torch.Tensor:
        begin = (block % self.P) * self.n + c * self.k
        return self.x[begin:begin + self.k]

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
                buf = self.out[lo:hi] if s == steps - 1 else scratch[s * self.n + lo:
                                                                     s * self.n + hi]
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
        return _tag(_KIND_RS, self.tag, s * self.chunks + c)

    def _send(self, buf: torch.Tensor, s: int, c: int) -> None:
        work = dist.isend(buf, dst=self.g.right(self.me), group=self.g.pg, tag=self._t(s, c))
        self._sends.append(work)

    def _step(self, c: int, s: int) -> None:
        buf, work = self._recvs.pop((c, s))
        _wait(work, self.g)
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
            _wait(work, self.g)
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
        _check(src, "src")
        _check(out, "out", src.numel() * self.P, src.dtype)
        self.src, self.out, self.n = src, out, src.numel()
        self.chunks, self.k = chunks, chunk_size(self.n, chunks)
        self.tag = tag
        self.own = out[self.me * self.n:(self.me + 1) * self.n]
        self.in_place = src.data_ptr() == self.own.data_ptr()
        if not self.in_place and _overlaps(src, out):
            raise ValueError("all_gather: src must be out's own block or not overlap out")
        self._started = [False] * chunks
        self._sends: list = []
        self._recvs = {}
        for s in range(self.P - 1):  # step s receives block me-s-1 from the left
            for c in range(chunks):
                buf = self._oblock(self.me - s - 1, c)
                work = dist.irecv(buf, src=self.g.left(self.me), group=self.g.pg,
                                  tag=self._t(s, c))
                self._recvs[(c, s)] = work

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.k, (c + 1) * self.k

    def _oblock(self, block: int, c: int) -> torch.Tensor:
        begin = (block % self.P) * self.n + c * self.k
        return self.out[begin:begin + self.k]

    def _t(self, s: int, c: int) -> int:
        return _tag(_KIND_AG, self.tag, s * self.chunks + c)

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

    def wait(self) -> torch.Tensor:
        for c in range(self.chunks):
            if not self._started[c]:
                self.start_chunk(c)
        # Forward what the right neighbour still needs (steps 1..P-2), in step-major order, the
        # same on every member. (gloo's send/recv Work reports completion only once waited, so
        # forwarding cannot be polled earlier.)
        for (c, s), work in self._recvs.items():
            _wait(work, self.g)
            if s < self.P - 2:
                self._send(self._oblock(self.me - s - 1, c), s + 1, c)
        self._recvs.clear()
        for work in self._sends:
            _wait(work, self.g)
        self._sends.clear()
        return self.out


def reduce_scatter(x, out, op: str = "sum", chunks: int = 1, group: Group | None = None,
                   tag: int = 0) -> torch.Tensor:
    """out = block `me` of the reduction over members of x (ring; see the module doc)."""
    return RingReduceScatter(x, out, op, chunks, group, tag).start().wait()


def all_gather(x, out, chunks: int = 1, group: Group | None = None, tag: int = 0) -> torch.Tensor:
    """Block i of out = member i's x (ring; x may be out's own block)."""
    return RingAllGather(x, out, chunks, group, tag).wait()


# ----------------------------------------------------------------------------- point to point


class P2P:
    """A chunked transfer of x on global rank src into out on global rank dst; the caller is
    src or dst. `start()` issues every chunk; `wait_chunk(c)` -> (begin, end) once chunk c has
    arrived (dst) or been sent (src); `wait()` finishes all."""

    def __init__(self, x, out, src: int, dst: int, chunks: int = 1,
                 group: Group | None = None, tag: int = 0):
        self.g, self.src, self.dst, self.rank = group, src, dst, dist.get_rank()
        if self.rank not in (src, dst):
            raise ValueError(f"p2p: rank {self.rank} is neither src={src} nor dst={dst}")
        buf = x if self.rank == src else out
        _check(buf, "x" if self.rank == src else "out")
        if src == dst:
            _check(out, "out", x.numel(), x.dtype)
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
        tag = _tag(_KIND_P2P, self.tag, c)
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


def p2p_async(x, out, src: int, dst: int, chunks: int = 1, group: Group | None = None,
              tag: int = 0) -> P2P:
    """Start a transfer x (on src) -> out (on dst); returns the started handle."""
    return P2P(x, out, src, dst, chunks, group, tag).start()


def p2p(x, out, src: int, dst: int, chunks: int = 1, group: Group | None = None,
        tag: int = 0) -> torch.Tensor | None:
    """Transfer x (on src) into out (on dst) and wait; returns out (None on src unless given)."""
    return p2p_async(x, out, src, dst, chunks, group, tag).wait()


# ----------------------------------------------------------------------------- library calls


def all_reduce(x, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """x = the reduction of every member's x (gloo, in place)."""
    g = group or Group.world()
    _check(x, "x")
    _wait(dist.all_reduce(x, op=_op(op)[0], group=g.pg, async_op=True), g)
    return x


def broadcast(x, src: int, group: Group | None = None) -> torch.Tensor:
    """x on every member = x on global rank src (in place)."""
    g = group or Group.world()
    _check(x, "x")
    _wait(dist.broadcast(x, src=src, group=g.pg, async_op=True), g)
    return x


def reduce(x, out, root: int, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """out on global rank root = the reduction of every member's x; out elsewhere = zeros."""
    g = group or Group.world()
    _check(x, "x")
    _check(out, "out", x.numel(), x.dtype)
    if out.data_ptr() != x.data_ptr():
        out.copy_(x)
    _wait(dist.reduce(out, dst=root, op=_op(op)[0], group=g.pg, async_op=True), g)
    if dist.get_rank() != root:
        out.zero_()
    return out


def all_to_all(x, out, group: Group | None = None) -> torch.Tensor:
    """Piece j (of P equal pieces) of x goes to member j; out = received pieces in member order."""
    g = group or Group.world()
    _check(x, "x")
    _check(out, "out", x.numel(), x.dtype)
    if x.numel() % g.size:
        raise ValueError(f"all_to_all: {x.numel()} elements do not split into {g.size} pieces")
    _wait(dist.all_to_all_single(out, x, group=g.pg, async_op=True), g)
    return out


def library_reduce_scatter(x, out, op: str = "sum", group: Group | None = None) -> torch.Tensor:
    """gloo's own reduce-scatter (an all-reduce inside): the baseline the ring is measured by."""
    g = group or Group.world()
    _check(out, "out")
    _check(x, "x", out.numel() * g.size, out.dtype)
    call = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    _wait(call(out, x, op=_op(op)[0], group=g.pg, async_op=True), g)
    return out


def library_all_gather(x, out, group: Group | None = None) -> torch.Tensor:
    """gloo's own all-gather into one flat tensor."""
    g = group or Group.world()
    _check(x, "x")
    _check(out, "out", x.numel() * g.size, x.dtype)
    call = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    _wait(call(out, x, group=g.pg, async_op=True), g)
    return out
