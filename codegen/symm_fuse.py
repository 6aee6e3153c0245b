"""A fused all-reduce as ONE kernel over symmetric memory (`backend.comm=symm`): the Plan side.

    step = symm_step(plan, f)      # SymmStep, or SymmError naming why the kernel cannot run f

The twin of `codegen.shm_fuse` (comm=shm on the CPU), built on its rewrite: `peer_step` turns
`k(reduce_scatter(g))` into `k'(g@0, .., g@P-1)` (the reduction of every member's block `me` of g,
in member order, inside the kernel). Here one more rewrite makes the all-gathers pushes:
`all_gather(k'.out) -> k''` where `k''` writes each gather's source value straight into block
`me` of that gather's destination in EVERY member's memory (`dst@0 .. dst@P-1`, member order),
instead of into a slot the peers read. The source itself is written locally only where something
reads it after the step (`PeerStep.kept`); the own-block write of `shm_fuse` is `dst@me`.
Rule: `all_gather(k'(g@..).src) -> k''(g@..) writing src@j` for every member j.

A `SymmStep` is what `codegen.render_symm` renders into one CUDA kernel (its chunk loop inside,
the chunk schedule of `codegen.chunk_schedule`) and what a launcher fills a pointer table for:
- `slots`: the plan buffer ids the kernel addresses, in table order; the launcher passes, for slot
  s and member j, the address of buffer `slots[s]` in member j's memory at `table[s*P + j]`
  (only `symmetric` slots are read or written at j != me: the gradient and the gathers'
  destinations; the others only at j == me), then the signal pad of member j at
  `table[len(slots)*P + j]`.
- `kernel`: the per-chunk work as a `plan.Kernel` (rendered by `CudaRenderer` as a device
  function), whose args are plan buffers (this member's), `peers` (member i's block `me` of the
  gradient) and `pushes` (per gather, member j's block `me` of its destination).

What one kernel cannot express is a `SymmError` (the step then runs on NCCL, the eager chunked
path): a fused step that is not `RS, kernels, AG..` (a 0-d all_reduce inside, LAMB's norms: its
kernels' sums would need a cross-rank barrier in the kernel), one `peer_step` cannot rewrite,
more than one kernel (a grid-wide barrier between them), or a kernel with sums.
Units: elements.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .chunk_schedule import chunk_bounds
from .chunked import fusable, is_scalar_sync
from .plan import Collective, FusedCollective, Kernel, Plan
from .shm_fuse import PeerStep, peer_step


class SymmError(Exception):
    """A fused step the symmetric-memory kernel cannot run (names the step and why)."""


@dataclass(frozen=True)
class Push:
    """An all-gather as writes: `src` (a plan buffer of `numel` elements) lands in block `me` of
    `dst` in every member; `targets[j]`: the kernel's buffer id for member j's block."""

    src: int
    dst: int
    numel: int
    targets: tuple[int, ...]


@dataclass(frozen=True)
class SymmStep:
    name: str  # the __global__ kernel's name
    P: int
    chunks: tuple[tuple[int, int], ...]  # the chunk schedule of the slice (chunk_bounds)
    kernel: Kernel  # the per-chunk work (see the module doc)
    src: int  # the reduce-scatter's source (the gradient; symmetric)
    peers: tuple[int, ...]  # kernel buffer ids: member i's block `me` of src, in member order
    pushes: tuple[Push, ...]
    slots: tuple[int, ...]  # plan buffer ids, in pointer-table order

    @property
    def n(self) -> int:
        """Elements of this member's slice (the kernel's loop)."""
        return self.kernel.numel

    @property
    def symmetric(self) -> tuple[int, ...]:
        """The slots other members address: the gradient and every gather's destination."""
        return tuple(dict.fromkeys((self.src, *(p.dst for p in self.pushes))))


def symm_step(plan: Plan, f: FusedCollective) -> SymmStep:
    """The one-kernel form of the fused all-reduce f (SymmError naming why not)."""
    what = f"fused step {f.id} of {plan.name} [{plan.schedule}]"
    if plan.P < 2:
        raise SymmError(f"{what}: one member, nothing to exchange")
    if not fusable(plan, f):
        raise SymmError(f"{what}: not a fused all-reduce RS, kernels, AG.. along dim 0")
    if any(is_scalar_sync(plan, s) for s in f.steps):
        raise SymmError(
            f"{what}: a 0-d all_reduce inside (a barrier across chunks, LAMB's norms)"
            " needs a cross-rank sum inside the kernel, which it does not do yet"
        )
    ps = peer_step(plan, f)
    if ps is None:
        raise SymmError(
            f"{what}: codegen.shm_fuse.peer_step cannot move its reduction into the "
            "kernel (the reduced slice is read more than once, non-contiguously, or "
            "after the step)"
        )
    if len(ps.kernels) != 1:
        raise SymmError(
            f"{what}: {len(ps.kernels)} kernels need a grid-wide barrier between "
            "them inside one kernel"
        )
    k = ps.kernels[0].kernel
    if k.reduces:
        raise SymmError(
            f"{what}: kernel {k.name} sums over the slice (a grid-wide sum per "
            "chunk inside the kernel)"
        )
    return _build(plan, f, ps, k)


def _build(plan: Plan, f: FusedCollective, ps: PeerStep, k: Kernel) -> SymmStep:
    first = max(ps.peer_buffers + ps.own_blocks) + 1
    pushes = tuple(
        Push(
            g.src,
            g.dst,
            plan.buffer(g.src).numel,
            tuple(range(first + i * plan.P, first + (i + 1) * plan.P)),
        )
        for i, g in enumerate(ps.gathers)
    )
    k = push_kernel(k, ps, pushes)
    mine = set(k.args()) - set(ps.peer_buffers) - {t for p in pushes for t in p.targets}
    slots = tuple(sorted(mine | {ps.head.src} | {p.dst for p in pushes}))
    return SymmStep(
        f"symm_{k.name}",
        plan.P,
        chunk_bounds(k.numel, f.chunks),
        k,
        ps.head.src,
        ps.peer_buffers,
        pushes,
        slots,
    )


def push_kernel(k: Kernel, ps: PeerStep, pushes: tuple[Push, ...]) -> Kernel:
    """`k` (shm_fuse's, writing each gather's source and its own block) writing each source into
    every member's block instead; locally only where it is `kept`."""
    # all_gather(k'.out) -> k'' writing out@0 .. out@P-1 (member j's block `me` of dst)
    target = {p.src: p.targets for p in pushes}
    writes = tuple(
        (v, b) for v, b in k.writes if b not in ps.own_blocks and (b not in target or b in ps.kept)
    )
    writes += tuple((v, t) for v, b in k.writes if b in target for t in target[b])
    return dataclasses.replace(k, name=f"{k.name}_push", writes=writes)


def symm_steps(plan: Plan) -> tuple[dict[int, SymmStep], dict[int, str]]:
    """({fused step id: SymmStep}, {fused step id: why it runs on NCCL}) over the plan's fused
    all-reduces (steps whose head is a reduce-scatter)."""
    steps, refused = {}, {}
    for f in plan.steps:
        if (
            isinstance(f, FusedCollective)
            and isinstance(f.steps[0], Collective)
            and f.steps[0].kind == "reduce_scatter"
        ):
            try:
                steps[f.id] = symm_step(plan, f)
            except SymmError as e:
                refused[f.id] = str(e)
    return steps, refused


__all__ = ["Push", "SymmError", "SymmStep", "push_kernel", "symm_step", "symm_steps"]
