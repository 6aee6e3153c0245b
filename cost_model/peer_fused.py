"""comm=shm's fused all-reduce in the workload simulation: the reduction inside the kernels.

On a `peer_reads` topology (comm=shm) a fused all-reduce with no barrier (`peer_readable`: as
`codegen.shm_fuse` decides) runs as the runtime's `peer_fused` (`peer_fused(run, f, ready, C)`, a
rule of `cost_model.workload`'s simulation): per chunk every rank copies its peers' blocks of the
gradient chunk into shared memory, then (once every rank has) runs the kernels, which read the P-1
peers' chunks besides its own and write the gathered outputs twice (its slot, its own block); at
the end each rank copies its peers' blocks of every gathered output: all of it memory traffic on
the rank's compute stream, at the device's `stream_memory_gbps` (every rank streaming at once;
where 0, `Device.elementwise_us`, `kernel_us`). Bytes per rank (`closed_collectives.copy_bytes`,
`own_block_bytes`): a copy reads, writes and, on a `write_allocate` device, reads the destination's
line first (its destination is never read before); the kernel's second write likewise, unless the
kernel reads that buffer itself (in place).
Units: microseconds, bytes.
"""

from __future__ import annotations

from codegen.plan import Collective, Compute, FusedCollective, Plan, label

from .closed_collectives import copy_bytes
from .closed_form import _dtype as dtype_of
from .closed_form import kernel_bytes, step_us
from .network import join


def peer_readable(plan: Plan, f: FusedCollective) -> bool:
    """Whether comm=shm runs f with the reduction inside its kernel (as `codegen.shm_fuse`
    decides): RS first, then kernels and all-gathers only, no kernel after a gather, the RS's
    output read by exactly one kernel and written by none, every gather's source a kernel's."""
    head, rest = f.steps[0], f.steps[1:]
    if not (
        isinstance(head, Collective)
        and head.kind == "reduce_scatter"
        and head.dim == 0
        and plan.P > 1
    ):
        return False
    kernels = [s for s in rest if isinstance(s, Compute)]
    gathers = [
        i
        for i, s in enumerate(rest)
        if isinstance(s, Collective) and s.kind == "all_gather" and s.dim == 0
    ]
    if (
        not kernels
        or len(kernels) + len(gathers) != len(rest)
        or any(isinstance(s, Compute) for s in rest[min(gathers, default=len(rest)) :])
    ):
        return False
    written = {b for s in kernels for _, b in s.kernel.writes}
    readers = [s for s in kernels if any(a.buffer == head.dst for a in s.kernel.reads)]
    return (
        len(readers) == 1
        and head.dst not in written
        and all(rest[i].src in written for i in gathers)
    )


def own_block_bytes(plan: Plan, kernels, gathers, write_allocate: bool) -> float:
    """The traffic of a comm=shm fused kernel's second write of each gather's source (into this
    rank's own block of the gather's destination, `codegen.shm_fuse.own_blocks`), per rank:
    the block, and on a `write_allocate` device once more where no kernel of the step reads
    that destination (where one does, e.g. Adam's w, the write lands on lines just read)."""
    read = {a.buffer for k in kernels for a in k.kernel.reads}
    return sum(
        g.nbytes / plan.P * (2 if write_allocate and g.dst not in read else 1) for g in gathers
    )


def peer_fused(run, f: FusedCollective, ready, C_outer) -> dict:
    """comm=shm's fused all-reduce on a `workload` run (see the module): ready has C events per
    rank; returns {rank: C_outer events} of the step's ranks."""
    plan, dev, C, P = run.plan, run.topo.device, f.chunks, run.plan.P
    head, env = f.steps[0], run.sim.env
    kernels = [s for s in f.steps[1:] if isinstance(s, Compute)]
    gathers = [s for s in f.steps[1:] if isinstance(s, Collective)]
    mine = run.members(head.stage)

    rate = dev.stream_memory_gbps  # GB/s per rank, all ranks streaming at once; 0: its curve

    def memory_us(nbytes: float) -> float:  # traffic inside a kernel: no launch of its own
        if rate:
            return nbytes / (rate * 1e3)
        return dev.kernel_us(nbytes, 0.0, "f32") - dev.launch_us

    def copy_us(nbytes: float) -> float:  # a copy of nbytes into fresh lines (a launch)
        traffic = copy_bytes(nbytes, dev.write_allocate)
        return dev.launch_us + memory_us(traffic) if rate else dev.elementwise_us(traffic)

    def kernel_us(k) -> float:  # a chunk of a kernel: its own traffic at the shared rate
        if not rate:
            return step_us(plan, k, run.topo, C)
        flops_us = k.flops / C / (dev.peak(dtype_of(plan, k)) * 1e6)
        return dev.launch_us + max(flops_us, memory_us(kernel_bytes(plan, k, run.topo) / C))

    publish_us = copy_us(head.nbytes * (P - 1) / P / C)
    peers_us = memory_us((P - 1) * head.nbytes / P / C)  # the peers' chunks the kernel reads
    own_us = memory_us(own_block_bytes(plan, kernels, gathers, dev.write_allocate) / C)
    posted = {r: [] for r in mine}
    for c in range(C):
        for r in mine:
            after = [ready[r][c]] + posted[r][-1:]
            posted[r].append(run.sim.compute(r, publish_us, label(head), f"publish c{c}", after))
    done = {}
    for r in mine:
        ev = None
        for c in range(C):
            ev_c = join(env, [posted[q][c] for q in mine] + ([ev] if ev else []))
            for i, k in enumerate(kernels):
                us = (
                    kernel_us(k)
                    + (peers_us if i == 0 else 0.0)
                    + (own_us if i == len(kernels) - 1 else 0.0)
                )
                ev_c = run.sim.compute(r, us, label(k), f"peers c{c}", [ev_c])
            ev = ev_c
        done[r] = ev
    everyone = join(env, list(done.values()))
    out = {}
    for r in mine:
        ev = everyone
        for g in gathers:
            ev = run.sim.compute(
                r, copy_us(g.nbytes * (P - 1) / P), label(g), "read peers", [ev, done[r]]
            )
        out[r] = [ev] * C_outer
    return out
