"""The closed-form model of whole schedules, step by step (the collectives' own closed form:
`closed_collectives`, whose `collective_us` and `choose` it uses).

`plan_us(plan, topo)` is a schedule's time from `closed_rules`, one rule per Plan step kind:
sequential steps add up; a fused collective pipelines its chunks through (communication, kernels,
all-gathers); an overlap pipelines producer chunks into its consumer, with compute slowed by
1/(1-u) where it overlaps communication. Only where the runtime pipelines them
(`codegen.chunked.fusable`, `overlappable`: the runtime's own rule); other fused and overlapped
steps run their parts one after the other, whole. Units: microseconds.
"""

from __future__ import annotations

import dataclasses

from codegen.chunked import fusable, gathered_matmul, is_scalar_sync, overlappable, prefetchable
from codegen.plan import (
    ITEMSIZE,
    Attention,
    Collective,
    Compute,
    Copy,
    FusedCollective,
    MatMul,
    Overlap,
    Plan,
    Prefetch,
)

from . import kernel_fused, nccl
from .closed_collectives import choose, collective_us
from .collectives import CollSpec
from .microbench import CALIBRATION_KERNEL
from .network import hop_us
from .topology import Topology


def spec_of(plan: Plan, step: Collective, topo: Topology, chunks: int = 1) -> CollSpec:
    """The CollSpec of a Plan's collective: its stage's group, the runtime's library choice."""
    stage = step.stage or 0
    group = tuple(range(stage * plan.P, (stage + 1) * plan.P))
    dtype = plan.buffer(step.src).dtype.name
    return CollSpec(step.kind, step.nbytes, group, chunks, step.kind in topo.library_kinds, dtype)


def _dtype(plan: Plan, step) -> str:
    if isinstance(step, Compute):
        ids = [a.buffer for a in step.kernel.reads] + [b for _, b in step.kernel.writes]
        return plan.buffer(ids[0]).dtype.name if ids else "f32"
    if isinstance(step, Attention):
        return plan.buffer(step.q).dtype.name
    return plan.buffer(step.a if isinstance(step, MatMul) else step.src).dtype.name


def step_us(plan: Plan, step, topo: Topology, chunks: int = 1) -> float:
    """One step's closed-form time (one of `chunks` equal pieces of it when chunks > 1)."""
    return closed_rules[type(step).__name__](plan, step, topo, chunks)


def _compute(plan, s, topo, chunks):
    return topo.device.step_kernel_us(
        kernel_bytes(plan, s, topo) / chunks, s.flops / chunks, _dtype(plan, s)
    )


def kernel_bytes(plan: Plan, s: Compute, topo: Topology) -> float:
    """The bytes a kernel moves, as the device's memory rates count them: what it reads, what it
    writes into buffers it reads weighed by `Device.inplace_write_weight` (the line is in the
    cache already), what it writes elsewhere (on a `write_allocate` device twice: the line is
    read before it is written); in units of the calibration kernel's bytes (x 28 / (16 + 12 w):
    its reads and in-place writes per element, `cost_model.microbench.CALIBRATION_KERNEL`), whose
    rate the device's memory figures are, so that kernel counts its own nbytes. With w = 1:
    reads and writes once each, the fresh writes once more where the device allocates on write."""
    read = {a.buffer for a in s.kernel.reads}
    written = {b for _, b in s.kernel.writes}
    per_element = lambda ids: sum(ITEMSIZE[plan.buffer(b).dtype] for b in ids)  # noqa: E731
    w, allocate = topo.device.inplace_write_weight, topo.device.write_allocate
    counted = (
        per_element(read)
        + w * per_element(written & read)
        + per_element(written - read) * (2 if allocate else 1)
    )
    r, inplace = CALIBRATION_KERNEL
    return s.kernel.numel * counted * (r + inplace) / (r + w * inplace)


def _matmul(plan, s, topo, chunks):
    """One chunk of a matmul: whole, one call; in C row chunks (an overlap's producer), P calls
    (one per rank's block of the output, as the runtime computes a chunk's rows) of 1/(C P)."""
    calls = plan.P if chunks > 1 else 1
    return calls * topo.device.matmul_us(
        s.nbytes / chunks / calls, s.flops / chunks / calls, _dtype(plan, s)
    )


def _attention(plan, s, topo, chunks):
    """Attention, timed as a matmul of its flops and bytes (a fused attention kernel is a pair
    of tensor-core products with the softmax between them)."""
    return topo.device.matmul_us(s.nbytes / chunks, s.flops / chunks, _dtype(plan, s))


def gathered_pieces(plan, mm: MatMul, topo, C: int) -> tuple[float, float]:
    """`ol(AG,MM)`'s matmul as the runtime computes it: (its own block's rows, one call of 1/P
    of the work; chunk c of the other blocks, 1 call for P = 2, else 2: the blocks before and
    after the rank's own, (P-1)/(P C) of the work), in microseconds."""
    P, dt = plan.P, _dtype(plan, mm)
    calls = 1 if P == 2 else 2
    share = (P - 1) / (P * C) / calls
    own = topo.device.matmul_us(mm.nbytes / P, mm.flops / P, dt)
    return own, calls * topo.device.matmul_us(mm.nbytes * share, mm.flops * share, dt)


def _copy(plan, s, topo, chunks):
    return topo.device.elementwise_us(2 * s.nbytes / chunks)


def _collective(plan, s, topo, chunks):
    spec = spec_of(plan, s, topo)
    if chunks > 1:  # one of `chunks` pieces of the collective
        spec = dataclasses.replace(spec, nbytes=spec.nbytes // chunks, pieces=chunks)
    return staging_us(plan, s, topo, chunks) + collective_us(spec, choose(spec, topo), topo)


def staging_us(plan, s, topo: Topology, chunks: int = 1) -> float:
    """The CPU runtime's copy before an in-place library all-reduce or broadcast whose output is
    another buffer (`ring_work_on_compute` topologies; NCCL works out of place)."""
    if (
        topo.ring_work_on_compute
        and s.kind in ("all_reduce", "broadcast")
        and s.src != s.dst
        and plan.buffer(s.src).numel > 1
    ):
        return topo.device.elementwise_us(2 * s.nbytes / chunks)
    return 0.0


def _p2p(plan, s, topo, chunks):
    src, dst = s.src_stage * plan.P, s.dst_stage * plan.P
    if topo.nccl is not None:
        return nccl.p2p_us(topo, src, dst, s.nbytes / chunks)
    return hop_us(topo, src, dst, s.nbytes / chunks, whole=s.nbytes, p2p=True)


def _fused(plan, f: FusedCollective, topo, chunks):
    """Chunk by chunk where the runtime pipelines it (`codegen.chunked.fusable`), else its parts
    one after the other, whole (`fuse(RS-AG-C)`, a fused send outside its overlap)."""
    if not fusable(plan, f):
        return sum(step_us(plan, part, topo) for part in f.steps)
    if kernel_fused.kernel_fusable(plan, f, topo):  # a GPU's one fused kernel
        return kernel_fused.closed_us(plan, f, topo, chunk_work(plan, f, topo))
    return _pipelined(plan, f, topo)


def chunk_work(plan: Plan, f: FusedCollective, topo: Topology) -> dict:
    """{Compute step id: (bytes as `kernel_bytes` counts them, flops, dtype) of one of f's
    chunks}."""
    return {
        s.id: (kernel_bytes(plan, s, topo) / f.chunks, s.flops / f.chunks, _dtype(plan, s))
        for s in f.steps
        if isinstance(s, Compute)
    }


def _pipelined(plan, f: FusedCollective, topo):
    """Phases split at 0-d all-reduces; inside a phase the chunks pipeline through its parts."""
    C = f.chunks
    u = 1.0 / (1.0 - topo.compute_slowdown) if C > 1 else 1.0
    total, comm, comp, first = 0.0, 0.0, 0.0, 0.0
    for part in f.steps:
        if is_scalar_sync(plan, part):  # a barrier: the phase before drains first
            total += first + (C - 1) * max(comm, comp) + step_us(plan, part, topo)
            comm, comp, first = 0.0, 0.0, 0.0
            continue
        t = step_us(plan, part, topo, C)
        if isinstance(part, (Compute, MatMul, Attention, Copy)):
            comp += t * u
        else:
            comm += t
        first += t
    return total + first + (C - 1) * max(comm, comp)


def _slowed(p: float, q: float, u: float) -> float:
    """Time of compute work `p` started with communication `q` in flight, the compute running
    1/u as fast while it is: all of it slowed (p*u) if it ends first, else q then the rest."""
    return p * u if p * u <= q else q + p - q / u


def _overlap(plan, o: Overlap, topo, chunks):
    if not overlappable(plan, o):  # the runtime runs the producer, then the consumer
        return step_us(plan, o.producer, topo) + step_us(plan, o.consumer, topo)
    C = o.chunks
    u = 1.0 / (1.0 - topo.compute_slowdown) if C > 1 else 1.0
    if gathered_matmul(o):  # own block's rows at once, then each chunk's as it arrives
        gather = step_us(plan, o.producer, topo, C)
        own, piece = gathered_pieces(plan, o.consumer, topo, C)
        first = max(gather, _slowed(own, gather, u))
        return first + (C - 1) * max(gather, _slowed(piece, gather, u)) + piece
    produce = step_us(plan, o.producer, topo, C)
    consume = (
        _fused(plan, o.consumer, topo, C) / C
        if isinstance(o.consumer, FusedCollective)
        else step_us(plan, o.consumer, topo, C)
    )
    compute_bound = isinstance(o.producer, (MatMul, Attention, Compute))
    bottleneck = max(_slowed(produce, consume, u) if compute_bound else produce, consume)
    return produce + consume + (C - 1) * bottleneck


def _prefetch(plan, f: Prefetch, topo, chunks):
    """The gather and the step behind it at once (compute slowed while both run), or in turn."""
    gather, behind = step_us(plan, f.gather, topo), step_us(plan, f.behind, topo)
    if not prefetchable(f):
        return gather + behind
    u = 1.0 / (1.0 - topo.compute_slowdown)
    compute = isinstance(f.behind, (MatMul, Attention, Compute, Copy))
    return max(gather, _slowed(behind, gather, u) if compute else behind + gather)


closed_rules = {
    "Compute": _compute,
    "MatMul": _matmul,
    "Attention": _attention,
    "Copy": _copy,
    "Collective": _collective,
    "P2P": _p2p,
    "FusedCollective": _fused,
    "Overlap": _overlap,
    "Prefetch": _prefetch,
}


def plan_us(plan: Plan, topo: Topology) -> float:
    """The schedule's closed-form time on `topo`, in microseconds."""
    return sum(step_us(plan, s, topo) for s in plan.steps)
