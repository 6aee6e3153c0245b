"""Execute a Plan on this rank, on any Backend: one runner, a rule per Plan step type.

Contract: `PlanRunner(plan, rank, kernels, groups, backend=CPU, tensors=None)` allocates this
rank's buffers (those of its pipeline stage and those on every stage) with `backend.buffer`, except
the inputs named in `tensors`: those buffers ARE the caller's tensors (aliased, not copied; an
update of the input writes the caller's tensor in place). `bind(name, tensor)` does the same later
(a tensor of the buffer's shape, dtype and device, contiguous; ValueError otherwise).
`load(inputs)` copies this rank's local input arrays in (the same per-rank inputs `dsl.interpret`
takes), `run()` issues the
steps in order, and `outputs()` returns this rank's outputs as numpy arrays (bf16 as float32, as
the interpreter stores it). `kernels` comes from `backend.build(plan.kernels())`, `groups` from
`backend.groups(plan.stages)` (a collective call). The result equals `dsl.interpret` on the same inputs
(within floating-point reduction order; tested on every schedule of every experiment).

`RULES` maps each Plan step type to its rule; a step without one raises "rule for X not
implemented". Compute, MatMul, Attention (torch's scaled_dot_product_attention on [B, heads, S, d]
views of the [S, B, E] buffers) and Copy run on the backend's compute stream, Collective and P2P on
its comm stream, each after the work issued so far on the other stream (on the CPU there are no
streams and every step has completed when it returns). `run()` starts after the work already on
the caller's current stream and leaves that stream waiting for all of the step's work, so
`outputs()` or a clock stopped afterwards sees the whole step.

Fused collectives and overlaps run chunk by chunk (`codegen.runtime.pipelined`) where the
composite allows it; other composites run their parts one after the other: the same result,
without the overlap. On a transport whose kernels may read the peers' data (comm=shm), a fused
all-reduce runs `codegen.shm_fuse`'s kernels, built here (`peer_steps`). `compute_ms` is the host time spent in kernel and matmul calls since
construction (on a backend with streams: the time to issue them).

Timeline (`marks`, None by default): set it to a list and every `run()` appends ("", t) as it
begins, then (segment, t) as each piece of work ends (`time.perf_counter()` seconds; `segment`:
the step's `codegen.plan.label`, what was done, the chunk): a plain step once, a fused or
overlapped one per piece (`pipelined`). On the CPU it is the rank's thread's time, waits
included; on a backend with streams, the time to issue the work.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from dsl.types import Sliced

from ..chunked import fusable, gathered_matmul, overlappable, prefetchable, scattered_matmul
from ..plan import (
    P2P,
    Attention,
    Collective,
    Compute,
    Copy,
    FusedCollective,
    MatMul,
    Overlap,
    Plan,
    Prefetch,
    label,
    walk,
)
from . import pipelined
from .backend import TORCH, Backend, CpuBackend, Groups

CPU = CpuBackend()


class PlanRunner:
    def __init__(
        self,
        plan: Plan,
        rank: int,
        kernels: Mapping[str, Callable],
        groups: Groups,
        backend: Backend = CPU,
        fused: bool = True,
        tensors: Optional[Mapping[str, torch.Tensor]] = None,
    ):
        self.plan, self.rank, self.kernels, self.fused = plan, rank, dict(kernels), fused
        self.backend = backend
        self.stage, self.tp = divmod(rank, plan.P)
        self.streams = backend.streams()
        self.comm = backend.communicator(groups.stages[self.stage], self.streams)
        self.world = backend.communicator(groups.world, self.streams)
        ids = dict(plan.inputs)
        bound = {ids[name] for name in tensors or {} if name in ids}
        self.bufs: dict[int, torch.Tensor] = {
            b.id: backend.buffer(b.shape, TORCH[b.dtype])
            for b in plan.buffers
            if (b.stage is None or b.stage == self.stage) and b.id not in bound
        }
        for name, t in (tensors or {}).items():
            self.bind(name, t)
        for name, value in plan.defaults:
            if ids[name] in self.bufs and name not in (tensors or {}):
                self.bufs[ids[name]].fill_(value)
        self.workspaces: dict[int, torch.Tensor] = {  # Compute step id -> its sums' scratch
            s.id: backend.buffer((kernels[s.kernel.name].workspace_bytes,), torch.uint8)
            for s in walk(plan.steps)
            if isinstance(s, Compute)
            and s.kernel.name in kernels
            and kernels[s.kernel.name].workspace_bytes
        }
        self.compute_ms = 0.0
        self.peer_steps = pipelined.peer_steps(self)  # fused steps whose kernels read the peers
        self.marks: Optional[list[tuple[str, float]]] = None  # a list: the timeline of run()s

    # -- data in and out ------------------------------------------------------------------------
    def load(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy this rank's local inputs in, each as its buffer holds it here (an input held as
        slices, `Sliced` or as_slice'd, takes this rank's slice); hyper-parameters not given keep
        their values. ValueError for a name the plan has no input of (naming the inputs it has),
        or an array whose size is not its buffer's (naming the input and the shape it takes)."""
        ids = dict(self.plan.inputs)
        unknown = [name for name in inputs if name not in ids]
        if unknown:
            raise ValueError(f"{self.plan.name}: no input {unknown[0]!r}; inputs: {', '.join(ids)}")
        for name, bid in self.plan.inputs:
            if bid in self.bufs and name in inputs:
                buf = self.bufs[bid]
                arr = np.array(inputs[name], order="C")  # keeps 0-d arrays 0-d
                if arr.size != buf.numel():
                    raise ValueError(self._size_error(name, self.plan.buffer(bid), arr.shape))
                buf.copy_(torch.from_numpy(arr).reshape(buf.shape))

    def _size_error(self, name: str, b, got: tuple) -> str:
        shape = f"{self.plan.name}: input {name!r} takes an array of shape {list(b.shape)}"
        if not isinstance(b.layout, Sliced):
            return f"{shape}, got {list(got)}"
        whole = int(np.prod(got)) == b.numel * self.plan.P
        return (
            f"{shape} (rank {self.rank}'s slice along dim {b.layout.dim}: the input is held "
            f"as slices), got {list(got)}" + (" (the whole array?)" if whole else "")
        )

    def bind(self, name: str, tensor: torch.Tensor) -> None:
        """Make the caller's `tensor` the buffer of input `name` (aliased: no copy, written in place
        where the plan updates the input); ValueError unless it matches the buffer exactly."""
        ids = dict(self.plan.inputs)
        if name not in ids:
            raise ValueError(f"{self.plan.name}: no input {name!r}; inputs: {', '.join(ids)}")
        b = self.plan.buffer(ids[name])
        want = (tuple(b.shape), TORCH[b.dtype], self.backend.device.type)
        got = (tuple(tensor.shape), tensor.dtype, tensor.device.type)
        if got != want or not tensor.is_contiguous():
            raise ValueError(
                f"{self.plan.name}: input {name!r} must be a contiguous {want[1]} "
                f"tensor of shape {list(want[0])} on {want[2]}, got "
                f"{got[1]} {list(got[0])} on {got[2]}"
                + ("" if tensor.is_contiguous() else " (not contiguous)")
            )
        self.bufs[b.id] = tensor

    def outputs(self) -> dict[str, np.ndarray]:
        out = {}
        for name, bid in self.plan.outputs:
            if bid in self.bufs:
                t = self.bufs[bid]
                t = t.float() if t.dtype is torch.bfloat16 else t  # numpy has no bf16
                out[name] = t.cpu().numpy().copy()
        return out

    def input(self, name: str) -> torch.Tensor:
        """The buffer of input `name` on this rank (e.g. to set the step, or a new gradient)."""
        return self.bufs[dict(self.plan.inputs)[name]]

    # -- steps ----------------------------------------------------------------------------------
    def run(self, steps=None) -> None:
        """Issue the plan's steps (or `steps`, some of them) after the caller's stream's work."""
        if self.marks is not None:
            self.marks.append(("", time.perf_counter()))  # the call begins
        self.streams.fork()
        for s in self.plan.steps if steps is None else steps:
            self.step(s)
        self.streams.join()

    def mine(self, stage: Optional[int]) -> bool:
        return stage is None or stage == self.stage

    def step(self, s) -> None:
        rule = RULES.get(type(s))
        if rule is None:
            raise NotImplementedError(f"rule for {type(s).__name__} not implemented")
        rule(self, s)
        if not isinstance(
            s, (FusedCollective, Overlap, Prefetch)
        ):  # composites mark their own parts
            self.mark(s)

    def mark(self, step, what: str = "", chunk: Optional[int] = None) -> None:
        """Where `marks` is a list, end a segment of the timeline: the time since the previous
        mark went to `step` (`what` the thread did there, on chunk `chunk`; `segment`)."""
        if self.marks is not None:
            self.marks.append((segment(step, what, chunk), time.perf_counter()))

    def compute(
        self,
        s: Compute,
        begin: int,
        end: int,
        zero: bool = True,
        bufs: Optional[Mapping[int, torch.Tensor]] = None,
    ) -> None:
        """Kernel s on elements [begin, end) of its loop, on the current stream (`bufs`: tensors
        in place of the runner's buffers, by id: shared memory for `pipelined.peer_fused`)."""
        k = s.kernel
        if zero:
            for _, b in k.reduces:
                self.bufs[b].zero_()
        args = [(bufs or {}).get(b, self.bufs.get(b)) for b in k.args()]
        ws = self.workspaces.get(s.id)
        self.timed(lambda: self.kernels[k.name](begin, end, self.tp, args, ws))

    def timed(self, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        self.compute_ms += (time.perf_counter() - t0) * 1e3

    def collective(self, s: Collective) -> None:
        """One collective of this rank's tensor-parallel group (on the current stream)."""
        COLLECTIVES[s.kind](self, s, self.bufs[s.src], self.bufs[s.dst])

    def p2p(self, s: P2P) -> None:
        P = self.plan.P
        src, dst = self.bufs.get(s.src), self.bufs.get(s.dst)
        self.world.p2p(
            src.view(-1) if src is not None else None,
            dst.view(-1) if dst is not None else None,
            src=s.src_stage * P + self.tp,
            dst=s.dst_stage * P + self.tp,
            chunks=1,
        ).start().wait()


def segment(step, what: str = "", chunk: Optional[int] = None) -> str:
    """A timeline segment's name: the step's `label`, what was done in it, the chunk."""
    return " ".join(
        [label(step)] + ([what] if what else []) + ([f"c{chunk}"] if chunk is not None else [])
    )


# -- the rules --------------------------------------------------------------------------------------
def _on_compute(r: PlanRunner, stage, fn) -> None:
    if r.mine(stage):
        with r.streams.on(r.streams.compute):
            fn()


def _on_comm(r: PlanRunner, stage, fn) -> None:
    if r.mine(stage):
        with r.streams.on(r.streams.comm):
            fn()


def _matmul(r: PlanRunner, s: MatMul) -> None:
    _on_compute(
        r,
        s.stage,
        lambda: r.timed(lambda: torch.matmul(r.bufs[s.a], r.bufs[s.b], out=r.bufs[s.out])),
    )


def heads(x: torch.Tensor, d: int) -> torch.Tensor:
    """[S, B, E] -> [B, E / d, S, d], a view (`dsl.attention.heads`)."""
    S, B, E = x.shape
    return x.view(S, B, E // d, d).permute(1, 2, 0, 3)


def _attention(r: PlanRunner, s: Attention) -> None:
    def run():
        q, k, v = (heads(r.bufs[b], s.head_dim) for b in (s.q, s.k, s.v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s.causal)
        heads(r.bufs[s.out], s.head_dim).copy_(o)

    _on_compute(r, s.stage, lambda: r.timed(run))


def _p2p(r: PlanRunner, s: P2P) -> None:
    if r.stage in (s.src_stage, s.dst_stage):
        with r.streams.on(r.streams.comm):
            r.p2p(s)


def _fused(r: PlanRunner, s: FusedCollective) -> None:
    if r.fused and fusable(r.plan, s):
        if r.mine(s.steps[0].stage):
            pipelined.fused_all_reduce(r, s)
        return
    for part in s.steps:  # in order: the same result, no overlap
        r.step(part)


def _overlap(r: PlanRunner, s: Overlap) -> None:
    if not (r.fused and overlappable(r.plan, s)):
        r.step(s.producer)
        r.step(s.consumer)
    elif gathered_matmul(s):
        if r.mine(s.producer.stage):
            pipelined.gathered_matmul(r, s)
    elif isinstance(s.producer, MatMul):
        if r.mine(s.producer.stage):
            consumer = s.consumer  # a lone reduce-scatter pipelines as a fused one of no kernels
            if scattered_matmul(s):
                consumer = FusedCollective(consumer.id, (consumer,), s.chunks)
            pipelined.fused_all_reduce(r, consumer, producer=s.producer)
    else:
        pipelined.overlapped_send(r, s)
        r.mark(s)


def _prefetch(r: PlanRunner, s: Prefetch) -> None:
    if r.fused and prefetchable(s) and r.mine(s.gather.stage):
        pipelined.prefetched(r, s)
    else:  # in the program's order: the same result, no overlap
        r.step(s.behind)
        r.step(s.gather)


RULES = {
    Compute: lambda r, s: _on_compute(r, s.stage, lambda: r.compute(s, 0, s.kernel.numel)),
    MatMul: _matmul,
    Attention: _attention,
    Copy: lambda r, s: _on_compute(r, s.stage, lambda: r.bufs[s.dst].copy_(r.bufs[s.src])),
    Collective: lambda r, s: _on_comm(r, s.stage, lambda: r.collective(s)),
    P2P: _p2p,
    FusedCollective: _fused,
    Overlap: _overlap,
    Prefetch: _prefetch,
}


# -- collectives, by kind ---------------------------------------------------------------------------
def _all_reduce(r, s, src, dst) -> None:
    if dst.data_ptr() != src.data_ptr():
        dst.copy_(src)
    r.comm.all_reduce(dst.view(-1), s.op)


def _reduce_scatter(r, s, src, dst) -> None:
    flat = src.movedim(s.dim, 0).contiguous().view(-1)
    out = _moved_buffer(dst, s.dim) if s.dim else dst
    r.comm.reduce_scatter(flat, out.view(-1), s.op)
    if s.dim:
        dst.movedim(s.dim, 0).copy_(out)


def _all_gather(r, s, src, dst) -> None:
    d = src.dim() and r.plan.buffer(s.src).layout.dim
    flat = src.movedim(d, 0).contiguous().view(-1)
    out = _moved_buffer(dst, d) if d else dst
    r.comm.all_gather(flat, out.view(-1))
    if d:
        dst.movedim(d, 0).copy_(out)


def _broadcast(r, s, src, dst) -> None:
    dst.copy_(src)
    r.comm.broadcast(dst.view(-1), s.root)


def _reduce(r, s, src, dst) -> None:
    r.comm.reduce(src.reshape(-1), dst.view(-1), s.root, s.op)


def _all_to_all(r, s, src, dst) -> None:
    x = src.movedim(s.split_dim, 0).contiguous()
    out = torch.empty_like(x)
    r.comm.all_to_all(x.view(-1), out.view(-1))
    pieces = out.chunk(r.plan.P, dim=0)  # piece i came from member i
    dst.copy_(torch.cat([p.movedim(0, s.split_dim) for p in pieces], dim=s.concat_dim))


COLLECTIVES = {
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_to_all": _all_to_all,
}


def _moved_buffer(like: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous buffer shaped like `like` with dimension `dim` moved to the front."""
    return torch.empty(like.movedim(dim, 0).shape, dtype=like.dtype, device=like.device)
