"""A fused collective on GPUs as CoCoNeT built it: one kernel, its chunk pipeline inside.

On a GPU topology (`Topology.nccl`) whose runtime runs fused collectives as one kernel
(`Topology.fused_collective == "kernel"`, the default; `"eager"` is the runtime's per-chunk path:
one NCCL call per chunk and piece, a launch and NCCL's latency each, `cost_model.workload`), a
fused all-reduce `RS, kernels [, 0-d all_reduce, kernels], AG..` (`kernel_fusable`) is charged as
the one kernel the paper generated: NCCL's all-reduce with the computation inside it.

- The algorithm and protocol are those NCCL's tuner picks for the all-reduce the step replaces
  (the reduce-scatter's whole message, in its dtype; the topology's forced `algo` / `proto` win):
  `ring` / `nvls` (`SLICE_ALGOS`): each rank reduces its slice, updates it and sends it on, as in
  the paper: the reduce-scatter's and the all-gathers' wire time at that (algorithm, protocol)
  (the ring: NCCL's `reduce_scatter` / `all_gather` calls of their whole messages, latency taken
  out; NVLS: the all-reduce's two halves, the switch's reduction on the way up (multimem loads)
  and its multicast of each updated slice on the way down (multimem stores), each half of the
  all-reduce's wire time, up on the gradient's bytes, down on the gathered bytes: NCCL's own
  NVLS reduce-scatter and all-gather each move the whole buffer through every port);
  `tree`, `nvls_tree`, `collnet_*` (root algorithms): a chunk is updated where it is fully reduced,
  at the roots of NCCL's two trees (`TREE_ROOTS`), then sent down: the all-reduce's halves as
  for NVLS.
- One launch (`Device.launch_us`) and the replaced all-reduce's latency, once per step, not once
  per chunk: the kernel's chunk loop (`FusedCollective.chunks` pieces, the runtime kernel's own)
  holds the group's ports for each piece's wire time, runs each chunk's computation as soon as
  its piece is reduced, and sends the chunk's gathered pieces right after.
- The computation runs on the kernel's thread blocks: NCCL's channels (`nccl.comm_channels`, one
  CTA each), so on a device with `sms` it streams memory at min(1, CTAs / (sms x
  `SATURATING_SM_SHARE`)) of the device's rate, at the efficiency of its whole traffic (one
  launch streams every chunk; no launch of its own); at the roots of a tree its work is the
  whole chunk's, P / TREE_ROOTS times a slice's.
- A 0-d all_reduce inside (LAMB's norms) is a grid-wide barrier: every chunk of the phase before
  finishes, then NCCL's all-reduce of those bytes, inside the kernel (no launch); adjacent ones
  are one exchange of their scalars together.

`kernel_fused(run, f, ready, C_outer, chunk_work)` is the DES rule (`cost_model.workload` calls
it); `closed_us(plan, f, topo, chunk_work)` the same pipeline in closed form (the DES's oracle,
from `closed_form`); `kernel_call(plan, f, topo)` names what the kernel follows (`KernelCall`:
the breakdown's algorithm and protocol). `chunk_work` {Compute step id: (bytes, flops, dtype)}
is each kernel's work on one chunk of a slice (`closed_form.chunk_work`), which the caller gives.
Units: microseconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.chunked import is_scalar_sync
from codegen.plan import Collective, Compute, FusedCollective, Plan, label

from . import nccl
from .collectives import _ports
from .network import join
from .topology import Topology, interpolate

SLICE_ALGOS = ("ring", "nvls")  # each rank updates the slice it finished reducing
TREE_ROOTS = 2  # NCCL's double binary tree: each chunk fully reduced at one of two roots
SATURATING_SM_SHARE = 0.5  # assumed: a streaming kernel reaches the memory's rate on half the SMs


@dataclass(frozen=True)
class KernelCall:
    """What one fused kernel costs apart from its computation."""

    algo: str
    proto: str
    latency_us: float  # the replaced all-reduce's latency, paid once
    launch_us: float
    up_us: float  # wire time of the gradient's reduction (reduce-scatter, or a tree's way up)
    down_us: float  # wire time of the gathered outputs (all-gathers, or a tree's way down)
    barrier_us: float  # each in-kernel exchange of a phase's 0-d all_reduces
    work_scale: float  # the computation's work on a computing rank over a slice's (1; a root's)
    sm_share: float  # the memory rate the kernel's CTAs reach, as a share of the device's

    @property
    def label(self) -> str:
        return f"{self.algo}/{self.proto}"


def kernel_fusable(plan: Plan, f: FusedCollective, topo: Topology) -> bool:
    """Whether a GPU runtime runs f as one fused kernel on `topo`: a GPU topology set to
    `fused_collective: kernel`, more than one rank, a reduce-scatter (dim 0) head, then kernels
    and 0-d all_reduces, then all-gathers (dim 0) only."""
    head, rest = f.steps[0], f.steps[1:]
    if topo.nccl is None or topo.fused_collective != "kernel" or plan.P < 2:
        return False
    if not (isinstance(head, Collective) and head.kind == "reduce_scatter" and head.dim == 0):
        return False
    gathers = [i for i, s in enumerate(rest) if _is_gather(s)]
    if not gathers or gathers != list(range(gathers[0], len(rest))):
        return False
    return all(isinstance(s, Compute) or _is_barrier(plan, s) for s in rest[: gathers[0]])


def _is_gather(s) -> bool:
    return isinstance(s, Collective) and s.kind == "all_gather" and s.dim == 0


def _is_barrier(plan: Plan, s) -> bool:
    return is_scalar_sync(plan, s)


def group_of(plan: Plan, f: FusedCollective) -> tuple[int, ...]:
    """The ranks of the step's tensor-parallel group (its stage's)."""
    stage = f.steps[0].stage or 0
    return tuple(range(stage * plan.P, (stage + 1) * plan.P))


def kernel_call(plan: Plan, f: FusedCollective, topo: Topology) -> KernelCall:
    """The replaced all-reduce's pick and the kernel's fixed and wire times (see the module)."""
    nc, head, group = topo.nccl, f.steps[0], group_of(plan, f)
    ranks, nodes = nccl.communicator(topo, group)
    replaced = nccl.call("all_reduce", head.nbytes, group, topo)
    algo, proto = replaced.algo, replaced.proto
    gathered = float(sum(s.nbytes for s in f.steps if _is_gather(s)))
    barrier_us = max(
        (
            nccl.call("all_reduce", sum(s.nbytes for s in run), group, topo).time_us
            for _, run in _phases(plan, f)
            if run
        ),
        default=0.0,
    )
    if algo == "ring":
        up = nccl.pick("reduce_scatter", float(head.nbytes), ranks, nodes, nc, algo, proto)
        down = nccl.pick("all_gather", gathered, ranks, nodes, nc, algo, proto)
        up_us, down_us = up.time_us - up.latency_us, down.time_us - down.latency_us
    else:  # the all-reduce's two halves: its way up on the gradient, down on the gathered bytes
        both = nccl.time_us("all_reduce", float(head.nbytes), algo, proto, ranks, nodes, nc)
        back = nccl.time_us("all_reduce", gathered, algo, proto, ranks, nodes, nc)
        up_us, down_us = (both.time_us - both.latency_us) / 2, (back.time_us - back.latency_us) / 2
    scale = 1.0 if algo in SLICE_ALGOS else plan.P / TREE_ROOTS
    sms = topo.device.sms
    share = min(1.0, nccl.comm_channels(nc) / (sms * SATURATING_SM_SHARE)) if sms else 1.0
    return KernelCall(
        algo,
        proto,
        replaced.latency_us,
        topo.device.launch_us,
        up_us,
        down_us,
        barrier_us,
        scale,
        share,
    )


def in_kernel_us(call: KernelCall, topo: Topology, work: tuple, C: int) -> float:
    """One chunk of a kernel of the step inside the fused kernel, from its work on one chunk of
    a slice (`work`: bytes as the device's memory rates count them, flops, dtype): no launch of
    its own; the work times `work_scale`, at the device's memory rate x its efficiency at the
    kernel's whole traffic (C chunks: one launch streams them all) x the CTAs' `sm_share`."""
    nbytes, flops, dtype = work
    dev, scale = topo.device, call.work_scale
    rate = (
        dev.memory_bandwidth_gbps
        * 1e3
        * call.sm_share
        * interpolate(dev.memory_efficiency, nbytes * scale * C)
    )
    return max(flops * scale / (dev.peak(dtype) * 1e6), nbytes * scale / rate)


def _phases(plan: Plan, f: FusedCollective):
    """[(kernels, barriers)] of the computation between the head and the gathers: each phase's
    kernels, then the 0-d all_reduces that end it (adjacent ones, e.g. LAMB's two norms, are
    one exchange of their scalars together; () after the last phase)."""
    phases, kernels, barriers = [], [], []
    for s in f.steps[1:]:
        if isinstance(s, Compute):
            if barriers:
                phases.append((kernels, tuple(barriers)))
                kernels, barriers = [], []
            kernels.append(s)
        elif _is_barrier(plan, s):
            barriers.append(s)
    phases.append((kernels, tuple(barriers)))
    return phases + ([([], ())] if barriers else [])


def kernel_fused(run, f: FusedCollective, ready, C_outer, chunk_work: dict) -> dict:
    """The DES rule: `ready[r]` has C events per rank (the chunks' inputs); returns {rank:
    C_outer events}, each the kernel's end on that rank."""
    plan, topo, sim, C = run.plan, run.topo, run.sim, f.chunks
    call = kernel_call(plan, f, topo)
    group = group_of(plan, f)
    mine = [r for r in sim.ranks if r in set(group)]
    keys = sim.keys_of(_ports(topo.devices_per_node, tuple(group)))
    step = f"{label(f)} kernel {call.label}"
    prio = topo.pipelined_chunks

    def wire(us, task, deps, c):  # a task is named by the pick first, as NCCL's calls are
        return sim.hold(keys, mine, us, step, f"{call.label} {task}", deps, c if prio else 0)

    def computed(parts, c, deps):
        for part in parts:
            us = in_kernel_us(call, topo, chunk_work[part.id], C)
            deps = {r: sim.compute(r, us, label(part), f"c{c} in kernel", [deps[r]]) for r in mine}
        return deps

    launched = {
        r: sim.delay(r, call.launch_us, step, f"{call.label} launch", list(ready[r][:1]))
        for r in mine
    }
    cur = {r: [None] * C for r in mine}
    for c in range(C):
        got = wire(
            call.up_us / C, f"up c{c}", [launched[r] for r in mine] + [ready[r][c] for r in mine], c
        )
        cur_c = {r: got for r in mine}
        for r in mine:
            cur[r][c] = cur_c[r]
    sent = []
    for k, (parts, barrier) in enumerate(_phases(plan, f)):
        for c in range(C):
            cur_c = computed(parts, c, {r: cur[r][c] for r in mine})
            for r in mine:
                cur[r][c] = cur_c[r]
            if not barrier:
                sent.append(wire(call.down_us / C, f"down c{c}", list(cur_c.values()), c))
        if barrier:
            every = join(sim.env, [e for r in mine for e in cur[r]])
            done = wire(call.barrier_us, "barrier (in kernel)", [every], 0)
            cur = {r: [done] * C for r in mine}
    end = {
        r: sim.delay(r, call.latency_us, step, f"{call.label} latency", sent + cur[r]) for r in mine
    }
    return {r: [end[r]] * C_outer for r in mine}


def closed_us(plan: Plan, f: FusedCollective, topo: Topology, chunk_work: dict) -> float:
    """The kernel in closed form: launch and latency once; per phase a two-stage pipeline of C
    chunks: on the ports each chunk's way up `h` (the first phase) and down `t` (the last), on
    the compute stream its computation `k` (slowed by 1 / (1 - compute_slowdown), as the DES
    slows computation beside communication): max(C (h + t) + max(0, k - t), h + C k + t), the
    ports' or the computation's bound (C t + k where nothing goes up first); a barrier between
    phases."""
    C, call = f.chunks, kernel_call(plan, f, topo)
    slowed = 1.0 / (1.0 - topo.compute_slowdown) if C > 1 else 1.0
    phases = _phases(plan, f)
    total = call.launch_us + call.latency_us
    for i, (parts, barrier) in enumerate(phases):
        k = slowed * sum(in_kernel_us(call, topo, chunk_work[p.id], C) for p in parts)
        h = call.up_us / C if i == 0 else 0.0
        t = call.down_us / C if not barrier else 0.0
        ports = C * (h + t) + (max(0.0, k - t) if h else k)  # the first chunk's wait for k
        total += max(ports, h + C * k + t)
        if barrier:
            total += call.barrier_us
    return total
