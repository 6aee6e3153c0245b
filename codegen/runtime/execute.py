"""Execute a Plan on this rank: buffers as torch tensors, kernels compiled from the Plan, the
communication of `codegen.runtime.comm` over gloo.

Contract: `PlanRunner(plan, rank, kernels, groups)` allocates this rank's buffers (those of its
pipeline stage and those on every stage), `load(inputs)` copies this rank's local input arrays in
(the same per-rank inputs `dsl.interpret` takes), `run()` executes the steps in order, and
`outputs()` returns this rank's outputs. The result equals `dsl.interpret` on the same inputs
(within floating-point reduction order; tested).

Fused collectives and overlaps run chunk by chunk (`codegen.runtime.pipelined`): the fused
all-reduce, the matmul overlapped with it, and the reduce-scatter overlapped with a fused send.
Other composites run their parts one after the other: the same result, without the overlap.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from dsl.types import DType

from . import comm, pipelined
from ..plan import (Collective, Compute, Copy, FusedCollective, MatMul, Overlap, P2P, Plan)

TORCH = {DType.f16: torch.float16, DType.bf16: torch.bfloat16, DType.f32: torch.float32,
         DType.f64: torch.float64, DType.i32: torch.int32, DType.i64: torch.int64,
         DType.bool: torch.bool}


def tp_groups(plan: Plan) -> list[comm.Group]:
    """One tensor-parallel group per pipeline stage (every rank must call this, in the same
    order); the whole world when there is one stage."""
    if plan.stages == 1:
        return [comm.Group.world()]
    return [comm.Group.new(range(s * plan.P, (s + 1) * plan.P)) for s in range(plan.stages)]


class PlanRunner:
    def __init__(self, plan: Plan, rank: int, kernels: Mapping[str, Callable], groups: list,
                 fused: bool = True):
        self.plan, self.rank, self.kernels, self.fused = plan, rank, kernels, fused
        self.stage, self.tp = divmod(rank, plan.P)
        self.group = groups[self.stage]
        self.bufs: dict[int, torch.Tensor] = {}
        for b in plan.buffers:
            if b.stage is None or b.stage == self.stage:
                self.bufs[b.id] = torch.zeros(b.shape, dtype=TORCH[b.dtype])
        self.compute_ms = 0.0  # time in kernels and matmuls since construction (see `timed`)
        ids = dict(plan.inputs)
        for name, value in plan.defaults:
            self.bufs[ids[name]].fill_(value)

    # -- data in and out ------------------------------------------------------------------------
    def load(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy this rank's local inputs in; hyper-parameters not given keep their values."""
        for name, bid in self.plan.inputs:
            if bid in self.bufs and name in inputs:
                buf = self.bufs[bid]
                arr = np.array(inputs[name], order="C")  # keeps 0-d arrays 0-d
                buf.copy_(torch.from_numpy(arr).reshape(buf.shape))

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: self.bufs[bid].numpy().copy() for name, bid in self.plan.outputs
                if bid in self.bufs}

    def input(self, name: str) -> torch.Tensor:
        """The buffer of input `name` on this rank (e.g. to set the step, or a new gradient)."""
        return self.bufs[dict(self.plan.inputs)[name]]

    # -- steps ----------------------------------------------------------------------------------
    def run(self) -> None:
        for s in self.plan.steps:
            self.step(s)

    def mine(self, stage: Optional[int]) -> bool:
        return stage is None or stage == self.stage

    def step(self, s) -> None:
        if isinstance(s, Compute):
            if self.mine(s.stage):
                self.compute(s, 0, s.kernel.numel)
        elif isinstance(s, MatMul):
            if self.mine(s.stage):
                self.timed(lambda: torch.matmul(self.bufs[s.a], self.bufs[s.b],
                                                out=self.bufs[s.out]))
        elif isinstance(s, Collective):
            if self.mine(s.stage):
                self.collective(s)
        elif isinstance(s, P2P):
            if self.stage in (s.src_stage, s.dst_stage):
                self.p2p(s)
        elif isinstance(s, Copy):
            if self.mine(s.stage):
                self.bufs[s.dst].copy_(self.bufs[s.src])
        elif isinstance(s, FusedCollective) and self.fused and pipelined.fusable(self.plan, s):
            if self.mine(s.steps[0].stage):
                pipelined.fused_all_reduce(self, s)
        elif isinstance(s, Overlap) and self.fused and pipelined.overlappable(self.plan, s):
            if isinstance(s.producer, MatMul):
                if self.mine(s.producer.stage):
                    pipelined.fused_all_reduce(self, s.consumer, producer=s.producer)
            else:
                pipelined.overlapped_send(self, s)
        elif isinstance(s, FusedCollective):  # sequential: same result, no overlap
            for part in s.steps:
                self.step(part)
        elif isinstance(s, Overlap):
            self.step(s.producer)
            self.step(s.consumer)
        else:
            raise TypeError(f"unknown plan step {s!r}")

    def compute(self, s: Compute, begin: int, end: int, zero: bool = True) -> None:
        k = s.kernel
        if zero:
            for _, b in k.reduces:
                self.bufs[b].zero_()
        args = [self.bufs[b] for b in k.args()]
        self.timed(lambda: self.kernels[k.name](begin, end, self.tp, args))

    def timed(self, fn: Callable[[], object]) -> None:
        """Run a computation, adding its wall time to `compute_ms` (the rest of a step's time
        is communication that the computation did not hide)."""
        t0 = time.perf_counter()
        fn()
        self.compute_ms += (time.perf_counter() - t0) * 1e3

    def collective(self, s: Collective) -> None:
        src, dst = self.bufs[s.src], self.bufs[s.dst]
        g = self.group
        if s.kind == "all_reduce":
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
            comm.all_reduce(dst.view(-1), op=s.op, group=g)
        elif s.kind == "reduce_scatter":
            flat = src.movedim(s.dim, 0).contiguous().view(-1)
            out = _moved_buffer(dst, s.dim) if s.dim else dst
            comm.reduce_scatter(flat, out.view(-1), op=s.op, group=g)
            if s.dim:
                dst.movedim(s.dim, 0).copy_(out)
        elif s.kind == "all_gather":
            d = src.dim() and _sliced_dim(self.plan, s.src)
            flat = src.movedim(d, 0).contiguous().view(-1)
            out = _moved_buffer(dst, d) if d else dst
            comm.all_gather(flat, out.view(-1), group=g)
            if d:
                dst.movedim(d, 0).copy_(out)
        elif s.kind == "broadcast":
            dst.copy_(src)
            comm.broadcast(dst.view(-1), src=g.ranks[s.root], group=g)
        elif s.kind == "reduce":
            comm.reduce(src.reshape(-1), dst.view(-1), root=g.ranks[s.root], op=s.op, group=g)
        elif s.kind == "all_to_all":
            x = src.movedim(s.split_dim, 0).contiguous()
            out = torch.empty_like(x)
            comm.all_to_all(x.view(-1), out.view(-1), group=g)
            pieces = out.chunk(self.plan.P, dim=0)  # piece i came from rank i
            moved = [p.movedim(0, s.split_dim) for p in pieces]
            dst.copy_(torch.cat(moved, dim=s.concat_dim))
        else:
            raise ValueError(f"unknown collective {s.kind}")

    def p2p(self, s: P2P) -> None:
        peer_src = s.src_stage * self.plan.P + self.tp
        peer_dst = s.dst_stage * self.plan.P + self.tp
        src = self.bufs.get(s.src)
        dst = self.bufs.get(s.dst)
        comm.p2p(src.view(-1) if src is not None else None, dst.view(-1) if dst is not None else None,
                 src=peer_src, dst=peer_dst)

def _moved_buffer(like: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous buffer shaped like `like` with dimension `dim` moved to the front."""
    return torch.empty(like.movedim(dim, 0).shape, dtype=like.dtype)


def _sliced_dim(plan: Plan, bid: int) -> int:
    return plan.buffer(bid).layout.dim
