"""Which composite steps of a Plan run chunk by chunk: one rule for the runtime and the cost model.

    fusable(plan, f)       # a FusedCollective the runtime pipelines (`runtime.pipelined`)
    overlappable(plan, o)  # an Overlap it pipelines (gathered_matmul, scattered_matmul: which)
    prefetchable(f)        # a Prefetch it runs at once with the step behind it

Others run their parts one after the other (same result, no overlap), and the cost model times
them that way. Pure predicates on the Plan's plain data (no torch), so the cost model imports
this module as it does `codegen.plan`.
"""

from __future__ import annotations

from .plan import P2P, Collective, Compute, FusedCollective, MatMul, Overlap, Plan, Prefetch


def is_scalar_sync(plan: Plan, s) -> bool:
    """A 0-d all_reduce (LAMB's norms), or one that combines partials (its per-segment norms):
    inside a fused collective, a barrier across chunks."""
    return (
        isinstance(s, Collective)
        and s.kind == "all_reduce"
        and (plan.buffer(s.src).numel == 1 or s.partial)
    )


def fusable(plan: Plan, f: FusedCollective) -> bool:
    """A fused all-reduce along dim 0: RS first, then kernels, 0-d all_reduces, all_gathers, with
    no kernel after an all_gather (`fuse(RS-AG-C)`: its kernels loop over the gathered tensor,
    whose chunk c is not what chunk c of the gather delivers; it runs step by step)."""
    head = f.steps[0]
    if not (isinstance(head, Collective) and head.kind == "reduce_scatter" and head.dim == 0):
        return False
    gathers = [
        i
        for i, s in enumerate(f.steps)
        if isinstance(s, Collective) and s.kind == "all_gather" and s.dim == 0
    ]
    after_gather = f.steps[min(gathers, default=len(f.steps)) :]
    return all(
        isinstance(s, Compute) or is_scalar_sync(plan, s) or i in gathers
        for i, s in enumerate(f.steps)
        if i
    ) and not any(isinstance(s, Compute) for s in after_gather)


def _fused_send(plan: Plan, f) -> bool:
    """`P2P, kernels, AG..` with no barrier."""
    return (
        isinstance(f, FusedCollective)
        and isinstance(f.steps[0], P2P)
        and all(
            isinstance(s, Compute) or (isinstance(s, Collective) and s.kind == "all_gather")
            for s in f.steps[1:]
        )
    )


def gathered_matmul(o: Overlap) -> bool:
    """`ol(AG,MM)`: a dim-0 all-gather whose output is the matmul's left operand."""
    ag, mm = o.producer, o.consumer
    return (
        isinstance(ag, Collective)
        and ag.kind == "all_gather"
        and ag.dim == 0
        and isinstance(mm, MatMul)
        and mm.a == ag.dst
    )


def scattered_matmul(o: Overlap) -> bool:
    """`ol(MM,RS)`: a matmul whose output a dim-0 reduce-scatter reads, alone (not fused)."""
    mm, rs = o.producer, o.consumer
    return (
        isinstance(mm, MatMul)
        and isinstance(rs, Collective)
        and rs.kind == "reduce_scatter"
        and rs.dim == 0
        and rs.src == mm.out
    )


def prefetchable(f: Prefetch) -> bool:
    """`pf(AG,..)`: a dim-0 all-gather (contiguous blocks: the chunked transfer's), run at once
    with the step it is prefetched behind."""
    return isinstance(f.gather, Collective) and f.gather.kind == "all_gather" and f.gather.dim == 0


def overlappable(plan: Plan, o: Overlap) -> bool:
    """A MatMul feeding a fusable fused collective without a barrier, or a dim-0 reduce-scatter
    alone (`ol(MM,RS)`); a dim-0 all-gather feeding a matmul (`ol(AG,MM)`); or a dim-0
    reduce-scatter feeding a fused send (`ol(RS, fuse(P2P-C-AG))`)."""
    if gathered_matmul(o) or scattered_matmul(o):
        return True
    if isinstance(o.producer, MatMul):
        return (
            isinstance(o.consumer, FusedCollective)
            and fusable(plan, o.consumer)
            and not any(is_scalar_sync(plan, s) for s in o.consumer.steps)
        )
    return (
        isinstance(o.producer, Collective)
        and o.producer.kind == "reduce_scatter"
        and o.producer.dim == 0
        and _fused_send(plan, o.consumer)
    )


__all__ = [
    "fusable",
    "gathered_matmul",
    "is_scalar_sync",
    "overlappable",
    "prefetchable",
    "scattered_matmul",
]
