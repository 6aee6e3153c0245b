"""Execute a Plan on this rank's GPU: buffers as CUDA tensors, kernels from `codegen.build_cuda`,
collectives and P2P through NCCL (torch.distributed's nccl backend), on two streams.

Contract (that of `codegen.runtime.execute.PlanRunner`, which this mirrors):
`CudaPlanRunner(plan, rank, kernels, groups, device)` allocates this rank's buffers on `cuda:device`
(those of its pipeline stage and those on every stage), `load(inputs)` copies this rank's local
input arrays in (the per-rank inputs `dsl.interpret` takes), `run()` issues the steps, and
`outputs()` returns this rank's outputs as numpy arrays (bf16 as float32, as the interpreter stores
it). `groups` comes from `nccl_groups(plan)` (collective: every rank calls it, in the same order);
None runs plans without communication (benchmarks of kernels alone). `kernels[name]` is called as
`fn(begin, end, rank, tensors, stream=..., workspace=...)` (`build_cuda.CudaKernel`); kernels with
sums get a zeroed workspace of `fn.launch.workspace_bytes` bytes per Compute step.

Streams and events: kernels, matmuls and copies run on the rank's compute stream, collectives and
P2P on its comm stream (NCCL's own stream follows the stream current at the call). Steps are
ordered as on CPU: before a step, its stream waits for the other stream's work so far; inside the
chunked composites (`codegen.runtime.cuda_pipelined`) events order single chunks instead, so chunk
c's kernels overlap other chunks' communication. `run()` starts after the work already on the
caller's current stream and returns without waiting for the GPU; the caller's stream then waits
for both streams, so `outputs()` or a CUDA event recorded on it afterwards sees the whole step
(`time_cuda` times it that way).

`device=None` runs the same code on the CPU with gloo groups (`nccl_groups(plan, "gloo")`) and
no streams, for tests of the chunking logic on machines without a GPU (kernels then come from an
emulation, tests/cuda_emulation.py).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist

from . import cuda_pipelined
from .execute import TORCH
from .measure import Timing
from ..plan import Collective, Compute, Copy, FusedCollective, MatMul, Overlap, P2P, Plan, walk

OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "prod": dist.ReduceOp.PRODUCT}
# torch >= 2.13 names them *_single; older releases only have the *_tensor names
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class NcclGroups:
    """Process groups: every rank (P2P between stages) and each stage's tp group."""
    world: object
    stages: tuple[object, ...]
    ranks: tuple[tuple[int, ...], ...]  # the global ranks of each stage's group


_GROUPS: dict[tuple[int, int, str], NcclGroups] = {}


def nccl_groups(plan: Plan, backend: str = "nccl") -> NcclGroups:
    """The groups for plan's layout, made once per process and layout (a collective call)."""
    world = dist.get_world_size()
    key = (world, plan.stages, backend)
    if key not in _GROUPS:
        every = dist.new_group(list(range(world)), backend=backend)
        ranks = tuple(tuple(range(s * plan.P, (s + 1) * plan.P)) for s in range(plan.stages))
        stages = (every,) if plan.stages == 1 else tuple(
            dist.new_group(list(r), backend=backend) for r in ranks)
        _GROUPS[key] = NcclGroups(every, stages, ranks)
    return _GROUPS[key]


def local_device() -> int:
    """This rank's GPU: LOCAL_RANK (as torchrun and `launch` set it) modulo the GPUs here."""
    return int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()


# -- streams, or nothing on the CPU stand-in ---------------------------------------------------------
def in_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def record(stream):
    return stream.record_event() if stream is not None else None


def wait_event(stream, event) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)


class CudaPlanRunner:
    def __init__(self, plan: Plan, rank: int, kernels: Mapping[str, Callable],
                 groups: Optional[NcclGroups], device: Optional[int], fused: bool = True):
        self.plan, self.rank, self.kernels, self.fused = plan, rank, kernels, fused
        self.stage, self.tp = divmod(rank, plan.P)
        self.groups = groups
        self.pg = groups.stages[self.stage] if groups else None
        self.group_ranks = groups.ranks[self.stage] if groups else (rank,)
        self.device = torch.device("cuda", device) if device is not None else torch.device("cpu")
        cuda = device is not None
        self.compute_stream = torch.cuda.Stream(self.device) if cuda else None
        self.comm_stream = torch.cuda.Stream(self.device) if cuda else None
        self.bufs: dict[int, torch.Tensor] = {}
        for b in plan.buffers:
            if b.stage is None or b.stage == self.stage:
                self.bufs[b.id] = torch.zeros(b.shape, dtype=TORCH[b.dtype], device=self.device)
        ids = dict(plan.inputs)
        for name, value in plan.defaults:
            if ids[name] in self.bufs:
                self.bufs[ids[name]].fill_(value)
        self.workspaces: dict[int, torch.Tensor] = {}  # Compute step id -> its sums' workspace
        for s in walk(plan.steps):
            launch = getattr(kernels.get(s.kernel.name), "launch", None) \
                if isinstance(s, Compute) else None
            if launch is not None and launch.workspace_bytes:
                self.workspaces[s.id] = torch.zeros(launch.workspace_bytes, dtype=torch.uint8,
                                                    device=self.device)

    # -- data in and out ------------------------------------------------------------------------
    def load(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy this rank's local inputs in; hyper-parameters not given keep their values."""
        for name, bid in self.plan.inputs:
            if bid in self.bufs and name in inputs:
                buf = self.bufs[bid]
                arr = np.array(inputs[name], order="C")
                buf.copy_(torch.from_numpy(arr).reshape(buf.shape))

    def outputs(self) -> dict[str, np.ndarray]:
        out = {}
        for name, bid in self.plan.outputs:
            if bid in self.bufs:
                t = self.bufs[bid]
                out[name] = (t.float() if t.dtype is torch.bfloat16 else t).cpu().numpy().copy()
        return out

    def input(self, name: str) -> torch.Tensor:
        return self.bufs[dict(self.plan.inputs)[name]]

    # -- steps ----------------------------------------------------------------------------------
    def current(self):
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

    def run(self, steps=None) -> None:
        """Issue the plan's steps (or `steps`, some of them) after the caller's stream's work."""
        caller = self.current()
        for stream in (self.compute_stream, self.comm_stream):
            wait_event(stream, record(caller))
        for s in self.plan.steps if steps is None else steps:
            self.step(s)
        for stream in (self.compute_stream, self.comm_stream):
            wait_event(caller, record(stream))

    def after_other(self, stream) -> None:
        """Make `stream` wait for all the work issued so far on the other stream."""
        other = self.comm_stream if stream is self.compute_stream else self.compute_stream
        wait_event(stream, record(other))

    def on(self, stream):
        """Run the next work on `stream`, after all the work issued so far on the other one."""
        self.after_other(stream)
        return in_stream(stream)

    def mine(self, stage: Optional[int]) -> bool:
        return stage is None or stage == self.stage

    def step(self, s) -> None:
        if isinstance(s, Compute):
            if self.mine(s.stage):
                with self.on(self.compute_stream):
                    self.compute(s, 0, s.kernel.numel)
        elif isinstance(s, MatMul):
            if self.mine(s.stage):
                with self.on(self.compute_stream):
                    torch.matmul(self.bufs[s.a], self.bufs[s.b], out=self.bufs[s.out])
        elif isinstance(s, Collective):
            if self.mine(s.stage):
                with self.on(self.comm_stream):
                    self.collective(s)
        elif isinstance(s, P2P):
            if self.stage in (s.src_stage, s.dst_stage):
                with self.on(self.comm_stream):
                    self.p2p(s)
        elif isinstance(s, Copy):
            if self.mine(s.stage):
                with self.on(self.compute_stream):
                    self.bufs[s.dst].copy_(self.bufs[s.src])
        elif isinstance(s, FusedCollective) and self.fused and cuda_pipelined.fusable(self.plan, s):
            if self.mine(s.steps[0].stage):
                cuda_pipelined.fused_all_reduce(self, s)
        elif isinstance(s, Overlap) and self.fused and cuda_pipelined.overlappable(self.plan, s):
            if isinstance(s.producer, MatMul):
                if self.mine(s.producer.stage):
                    cuda_pipelined.fused_all_reduce(self, s.consumer, producer=s.producer)
            else:
                cuda_pipelined.overlapped_send(self, s)
        elif isinstance(s, FusedCollective):  # in order: same result, no overlap (as on CPU)
            for part in s.steps:
                self.step(part)
        elif isinstance(s, Overlap):
            self.step(s.producer)
            self.step(s.consumer)
        else:
            raise TypeError(f"unknown plan step {s!r}")

    def compute(self, s: Compute, begin: int, end: int, zero: bool = True) -> None:
        """Kernel s on elements [begin, end), on the current (compute) stream."""
        k = s.kernel
        if zero:
            for _, b in k.reduces:
                self.bufs[b].zero_()
        self.kernels[k.name](begin, end, self.tp, [self.bufs[b] for b in k.args()],
                             stream=self.current(), workspace=self.workspaces.get(s.id))

    def collective(self, s: Collective) -> None:
        """One collective of the tp group, on the current (comm) stream."""
        src, dst, pg = self.bufs[s.src], self.bufs[s.dst], self.pg
        if s.kind == "all_reduce":
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
            dist.all_reduce(dst, op=OPS[s.op], group=pg)
        elif s.kind == "reduce_scatter":
            flat = src.movedim(s.dim, 0).contiguous().view(-1)
            out = _moved(dst, s.dim) if s.dim else dst
            reduce_scatter(out.view(-1), flat, op=OPS[s.op], group=pg)
            if s.dim:
                dst.movedim(s.dim, 0).copy_(out)
        elif s.kind == "all_gather":
            d = src.dim() and self.plan.buffer(s.src).layout.dim
            flat = src.movedim(d, 0).contiguous().view(-1)
            out = _moved(dst, d) if d else dst
            all_gather(out.view(-1), flat, group=pg)
            if d:
                dst.movedim(d, 0).copy_(out)
        elif s.kind == "broadcast":
            dst.copy_(src)
            dist.broadcast(dst, src=self.group_ranks[s.root], group=pg)
        elif s.kind == "reduce":
            dst.copy_(src.reshape(dst.shape))
            dist.reduce(dst, dst=self.group_ranks[s.root], op=OPS[s.op], group=pg)
            if self.tp != s.root:
                dst.zero_()  # as on CPU: only the root's dst holds the reduction
        elif s.kind == "all_to_all":
            x = src.movedim(s.split_dim, 0).contiguous()
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x, group=pg)
            pieces = out.chunk(self.plan.P, dim=0)  # piece i came from member i
            dst.copy_(torch.cat([p.movedim(0, s.split_dim) for p in pieces], dim=s.concat_dim))
        else:
            raise ValueError(f"unknown collective {s.kind}")

    def p2p(self, s: P2P, begin: int = 0, end: Optional[int] = None) -> None:
        """Elements [begin, end) of s.src on this rank of stage src_stage to its peer's s.dst."""
        if self.stage == s.src_stage:
            x = self.bufs[s.src].view(-1)[begin:end]
            dist.send(x, dst=s.dst_stage * self.plan.P + self.tp, group=self.groups.world)
        else:
            x = self.bufs[s.dst].view(-1)[begin:end]
            dist.recv(x, src=s.src_stage * self.plan.P + self.tp, group=self.groups.world)


def _moved(like: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous buffer shaped like `like` with dimension `dim` moved to the front."""
    return torch.empty(like.movedim(dim, 0).shape, dtype=like.dtype, device=like.device)


def time_cuda(fn: Callable[[], None], warmup: int, repeats: int, group=None,
              before: Optional[Callable[[], None]] = None) -> Timing:
    """Time fn with CUDA events on the current stream; per repeat the maximum over the ranks of
    `group` (a group that takes CPU tensors, e.g. launch's gloo world; None: every rank, when a
    process group exists), in milliseconds."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    times, t = [], torch.zeros(1, dtype=torch.float64)
    for _ in range(repeats):
        if before:
            before()
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.barrier(group=group)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        t[0] = start.elapsed_time(end)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        times.append(float(t[0]))
    return Timing(tuple(times))
