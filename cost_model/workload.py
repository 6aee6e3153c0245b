"""The workload layer: a Plan becomes a task DAG per rank, simulated on a Topology.

`simulate(plan, topo, fold=None) -> Result` runs the Plan's steps in order on every rank (a step
starts on a rank when its previous step has finished there, as the runtime runs them), each rank
with a compute stream (tasks in issue order, one at a time) and a communication stream (transfers,
which contend for the network's ports and links). `cost_rules` has one rule per Plan step kind,
`rule(run, step, ready, C) -> done`: `ready[r]` / `done[r]` are per-chunk events of rank r.
- Compute / MatMul / Attention / Copy: a task per chunk on the compute stream (roofline, `closed_form`).
- Collective: the collectives layer's algorithm (the tuner's pick; on a GPU topology NCCL's calls,
  `cost_model.nccl`; comm=shm's library all-reduce, `closed_collectives.shm_all_reduce_us`: memory
  traffic on every member at the device's `stream_memory_gbps`, as `peer_fused` charges); P2P:
  rank i of the source stage sends to rank i of the destination stage, chunk by chunk (on a GPU
  topology each message holds its ports for `nccl.p2p_us`).
- FusedCollective: as the runtime runs it, chunk by chunk: chunk c's piece of the head (reduce-
  scatter, or P2P), then the kernels on chunk c as soon as it is there, then chunk c's all-gathers;
  a 0-d all_reduce inside is a barrier (every chunk's kernels before it finish first). The
  runtime posts the receives of its all-gathers (and of a P2P head) when the step begins, so
  on CPU ranks their chunks' sends are `sync` (`network.Sim.transfer`: the posting thread
  writes each, and computes the next chunk only then).
  On a `peer_reads` topology (comm=shm) a fused all-reduce with no barrier runs as the runtime's
  `peer_fused` does (`cost_model.peer_fused`: memory traffic on each rank's compute stream).
  On a GPU topology a fused all-reduce is one kernel (`cost_model.kernel_fused`: one launch, the
  replaced all-reduce's algorithm, the chunk pipeline inside), also as an overlap's consumer;
  with `fused_collective: eager` it runs chunk by chunk as above, one NCCL call per piece.
- Overlap: the producer in `chunks` pieces, each handed to the consumer as soon as it is ready.
Fused and overlapped steps the runtime does not pipeline (`codegen.chunked.fusable`,
`overlappable`: the runtime's own rule; e.g. `fuse(RS-AG-C)`) run their parts one after the other.

Folding (`fold=None`: automatic): a one-stage plan on whole nodes simulates node 0's ranks only
(`network.Sim`), exact because every node does the same; a collective whose algorithm is not the
same on every node (the CPU runtime's tree, chain) then takes its closed-form time (marked in the trace's task).
`compute_us` {step id: us} replaces a step's time on the compute stream by a given one (a
Compute step's roofline: a library routine that does its work, e.g. the baseline's torch
optimizer, split evenly over its chunks; a Collective's staging copy: 0 where a library reduces
in place). Every rank ends with the topology's step overhead (`step_overhead_for` the plan's
`largest_transfer` and ranks: a task `overhead` of the step `step`, on the comm stream), where
it is not 0 and the plan has more than one rank. What calibration's `sequence` measures is a
rank woken by a collective, then running a kernel; a pipeline of one rank per stage (sends and
kernels only) wakes its ranks by sends as well, and pays it at its largest send.
`Result.trace` is the DataFrame of every task: rank, stream, step, task, start, end (us).
`choices(plan, topo)` names the algorithm and protocol of each of the Plan's collectives, in
step order (those inside fused and overlapped steps too, chosen per call as the DES runs them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from codegen.chunked import fusable, gathered_matmul, is_scalar_sync, overlappable, prefetchable
from codegen.plan import P2P, Collective, FusedCollective, Overlap, Plan, label, walk

from . import collectives, nccl
from .closed_collectives import choose, collective_us, shm_all_reduce_us
from .closed_form import chunk_work, gathered_pieces, spec_of, staging_us, step_us
from .collectives import CollSpec
from .kernel_fused import kernel_call, kernel_fusable, kernel_fused
from .network import Sim, join
from .peer_fused import peer_fused, peer_readable
from .topology import Topology

FOLDABLE = ("ring", "hierarchical", "direct")


@dataclass(frozen=True)
class Result:
    time_us: float  # the slowest rank's end
    finish_us: dict  # simulated rank -> its end
    trace: object  # pandas DataFrame: rank, stream, step, task, start, end (us)
    folded: bool

    @property
    def time_ms(self) -> float:
        return self.time_us / 1e3


class Run:
    def __init__(self, plan: Plan, topo: Topology, fold: bool, compute_us: Optional[dict] = None):
        self.plan, self.topo = plan, topo
        self.compute_us = dict(compute_us or {})
        self.sim = Sim(topo, plan.world_size, fold)
        self.pending: dict[int, list] = {}

    def members(self, stage: Optional[int]) -> list[int]:
        P = self.plan.P
        return [r for r in self.sim.ranks if stage is None or r // P == stage]

    def rule(self, step, ready, C):
        return cost_rules[type(step).__name__](self, step, ready, C)


def _pass(run: Run, ready, members, done):
    """Ranks outside the step keep their readiness."""
    out = dict(ready)
    out.update(done)
    return out


def _tasks(run: Run, s, ready, C, stage):
    us = run.compute_us[s.id] / C if s.id in run.compute_us else step_us(run.plan, s, run.topo, C)
    done = {
        r: [run.sim.compute(r, us, label(s), f"c{c}", [ready[r][c]]) for c in range(C)]
        for r in run.members(stage)
    }
    return _pass(run, ready, None, done)


def _compute(run, s, ready, C):
    return _tasks(run, s, ready, C, s.stage)


def _collective(run: Run, s: Collective, ready, C):
    spec = spec_of(run.plan, s, run.topo, C)
    stage = run.compute_us.get(s.id, staging_us(run.plan, s, run.topo, C))
    if stage:  # the runtime copies src into dst, then reduces dst in place
        ready = dict(ready)
        for r in run.members(s.stage):
            ready[r] = [
                run.sim.compute(r, stage, label(s), f"copy c{c}", [ready[r][c]]) for c in range(C)
            ]
    return _coll(run, spec, s, ready)


def _coll(run: Run, spec: CollSpec, s, ready, algo: Optional[str] = None, first: int = 0):
    group = set(spec.group)
    mine = [r for r in run.sim.ranks if r in group]
    sub = {r: ready[r] for r in mine}
    shm_us = shm_all_reduce_us(spec, run.topo)
    if shm_us is not None:  # comm=shm's all-reduce: memory traffic on every member, then all done
        ev = [
            run.sim.delay(r, shm_us, label(s), "shm all_reduce (memory)", list(sub[r]))
            for r in mine
        ]
        every = join(run.sim.env, ev)
        return _pass(run, ready, mine, {r: [every] * spec.chunks for r in mine})
    algo = algo or choose(spec, run.topo)
    if run.sim.fold and algo not in FOLDABLE and not collectives.uses_nccl(spec, run.topo):
        # closed form inside a folded run
        us = collective_us(spec, algo, run.topo)
        ev = {
            r: run.sim.delay(r, us, label(s), f"{algo} (closed form)", list(sub[r])) for r in mine
        }
        done = {r: [ev[r]] * spec.chunks for r in mine}
    else:
        done, finished = collectives.simulate(run.sim, spec, algo, sub, label(s), first)
        for r in mine:
            run.pending.setdefault(r, []).append(finished[r])
    return _pass(run, ready, mine, done)


def _send(
    run: Run,
    src: int,
    dst: int,
    nbytes: float,
    step: str,
    c: int,
    deps,
    whole: float,
    sync: bool = False,
):
    """One P2P message (chunk c of a transfer of `whole` bytes; `sync`: its receive was posted
    first, `network.Sim.transfer`)."""
    if run.topo.nccl is None:
        return run.sim.transfer(
            src, dst, nbytes, step, f"p2p c{c}", deps, chunk=c, whole=whole, sync=sync, p2p=True
        )
    prio = c if run.topo.pipelined_chunks else 0
    return run.sim.hold(
        nccl.p2p_ports(run.topo, src, dst),
        (src, dst),
        nccl.p2p_us(run.topo, src, dst, nbytes),
        step,
        f"p2p/Simple c{c}",
        deps,
        prio,
    )


def _p2p(run: Run, s: P2P, ready, C):
    P, out = run.plan.P, dict(ready)
    for i in range(P):
        src, dst = s.src_stage * P + i, s.dst_stage * P + i
        evs = [
            _send(run, src, dst, s.nbytes / C, label(s), c, [ready[src][c]], s.nbytes)
            for c in range(C)
        ]
        out[src] = evs
        out[dst] = [join(run.sim.env, (ev, ready[dst][c])) for c, ev in enumerate(evs)]
    return out


def _phases(plan: Plan, steps):
    """The fused steps after the head, split at 0-d all_reduces: [(parts, barrier or None)]."""
    phases, parts = [], []
    for s in steps:
        if is_scalar_sync(plan, s):
            phases.append((parts, s))
            parts = []
        else:
            parts.append(s)
    phases.append((parts, None))
    return phases


def _piece(run: Run, part, c: int, C: int, ready_c: dict, algo: Optional[str]):
    """Chunk c of one part of a fused step (a kernel chunk, or a collective's chunk)."""
    one = {r: [e] for r, e in ready_c.items()}
    if isinstance(part, Collective):
        spec = spec_of(run.plan, part, run.topo, C)
        piece = dataclasses.replace(
            spec, nbytes=spec.nbytes // C, chunks=1, pieces=C, sync=part.kind == "all_gather"
        )
        done = _coll(run, piece, part, one, algo, c)
    elif isinstance(part, P2P):
        done = _p2p_piece(run, part, C, c, one)
    else:
        us = step_us(run.plan, part, run.topo, C)
        done = dict(one)
        for r in run.members(part.stage):
            done[r] = [run.sim.compute(r, us, label(part), f"c{c}", [one[r][0]])]
    return {r: evs[0] for r, evs in done.items()}


def _p2p_piece(run: Run, s: P2P, C: int, c: int, ready):
    P, out = run.plan.P, dict(ready)
    for i in range(P):
        src, dst = s.src_stage * P + i, s.dst_stage * P + i
        ev = _send(run, src, dst, s.nbytes / C, label(s), c, [ready[src][0]], s.nbytes, sync=True)
        out[src] = [ev]
        out[dst] = [join(run.sim.env, (ev, ready[dst][0]))]
    return out


def _algos(run: Run, f: FusedCollective) -> dict:
    """The tuner's pick for each collective of a fused step, made on the whole collective."""
    out = {}
    for part in f.steps:
        if isinstance(part, Collective):
            out[part.id] = choose(spec_of(run.plan, part, run.topo, f.chunks), run.topo)
    return out


def _staged_head(run: Run, f: FusedCollective, head, algo, cur):
    """A CPU runtime's fused all-reduce starts its ring reduce-scatter whole (every chunk's first
    send at once, `RingReduceScatter.start`) and reduces chunk c just before its kernels: the
    ring's (builder, state), or None where the head runs as per-chunk pieces."""
    if not (
        run.topo.ring_work_on_compute
        and isinstance(head, Collective)
        and head.kind == "reduce_scatter"
        and algo == "ring"
    ):
        return None
    spec = spec_of(run.plan, head, run.topo, f.chunks)
    build = collectives._Build(run.sim, spec, label(head))
    mine = list(build.sims)
    P, C = spec.P, f.chunks
    state = build.ring_start(spec.group, spec.nbytes / P / C, C, {r: cur[r] for r in mine}, "rs")
    return build, state


def _fused(run: Run, f: FusedCollective, ready, C_outer, peers: bool = True):
    """A fused collective, chunk by chunk (ready: one event per rank, or C per rank); on a
    `peer_reads` topology with `peers`, as comm=shm runs it (`peer_fused`); step by step where
    the runtime does not pipeline it (peers=False: an overlap's consumer, which it does)."""
    C = f.chunks
    if peers and not fusable(run.plan, f):  # the runtime runs it step by step (codegen.chunked)
        return _in_order(run, f.steps, ready, C_outer)
    ready = {
        r: (evs if len(evs) == C else [join(run.sim.env, evs)] * C) for r, evs in ready.items()
    }
    if kernel_fusable(run.plan, f, run.topo):  # a GPU's fused kernel (`kernel_fused`)
        return {**ready, **kernel_fused(run, f, ready, C_outer, chunk_work(run.plan, f, run.topo))}
    if peers and run.topo.peer_reads and peer_readable(run.plan, f):
        return {**ready, **peer_fused(run, f, ready, C_outer)}
    algos = _algos(run, f)
    head, phases = f.steps[0], _phases(run.plan, f.steps[1:])
    cur = {r: list(evs) for r, evs in ready.items()}
    outs = {r: [] for r in ready}
    staged = _staged_head(run, f, head, algos.get(head.id), cur)
    for k, (parts, barrier) in enumerate(phases):
        for c in range(C):
            now = {r: cur[r][c] for r in cur}
            if k == 0 and staged is not None:  # chunk c reduced (its sends went at the start)
                build, state = staged
                now = dict(now)
                now.update(build.ring_chunk(state, c))
            elif k == 0:
                now = _piece(run, head, c, C, now, algos.get(head.id))
            for part in parts:
                got = _piece(run, part, c, C, now, algos.get(part.id))
                if isinstance(part, Collective) and part.kind == "all_gather":
                    for r in got:
                        outs[r].append(got[r])
                else:
                    now = got
            for r in cur:
                cur[r][c] = now[r]
        if barrier is not None:
            all_chunks = {r: [join(run.sim.env, cur[r])] for r in cur}
            done = _coll(run, spec_of(run.plan, barrier, run.topo, 1), barrier, all_chunks)
            cur = {r: [done[r][0]] * C for r in cur}
    sent = staged[0].sent if staged is not None else {}
    return {r: [join(run.sim.env, cur[r] + outs[r] + sent.get(r, []))] * C_outer for r in cur}


def _in_order(run: Run, steps, ready, C_outer):
    """Steps one after the other on every rank, each whole (as `simulate` runs a Plan's)."""
    cur = {r: [join(run.sim.env, evs)] for r, evs in ready.items()}
    for s in steps:
        done = run.rule(s, cur, 1)
        cur = {
            r: [join(run.sim.env, [e for e in done[r] + run.pending.pop(r, []) if e is not None])]
            for r in done
        }
    return {r: evs * C_outer for r, evs in cur.items()}


def _overlap(run: Run, o, ready, C_outer):
    if not overlappable(run.plan, o):  # the runtime runs the producer, then the consumer
        return _in_order(run, (o.producer, o.consumer), ready, C_outer)
    C = o.chunks
    start = {r: [join(run.sim.env, evs)] * C for r, evs in ready.items()}
    produced = run.rule(o.producer, start, C)
    if gathered_matmul(o):
        return _gathered_matmul(run, o, start, produced, C_outer)
    if isinstance(o.consumer, FusedCollective):  # the runtime's chunked path, also on shm
        return _fused(run, o.consumer, produced, C_outer, peers=False)
    done = run.rule(o.consumer, produced, C)
    return {r: [join(run.sim.env, evs)] * C_outer for r, evs in done.items()}


def _gathered_matmul(run: Run, o, start, gathered, C_outer):
    """`ol(AG,MM)` as `codegen.runtime.pipelined.gathered_matmul` runs it: the rows of the rank's
    own block at once, then chunk c of the other blocks once chunk c has arrived."""
    mm, C = o.consumer, o.chunks
    own_us, piece_us = gathered_pieces(run.plan, mm, run.topo, C)
    done = {}
    for r in run.members(mm.stage):
        evs = [run.sim.compute(r, own_us, label(mm), "own rows", [start[r][0]])]
        for c in range(C):
            evs.append(run.sim.compute(r, piece_us, label(mm), f"c{c}", [gathered[r][c]]))
        done[r] = [join(run.sim.env, evs)] * C_outer
    return _pass(run, gathered, None, done)


def _prefetch(run: Run, f, ready, C_outer):
    """The gather and the step behind it from the same start, each as its own rule runs it."""
    if not prefetchable(f):  # the runtime runs them in turn
        return _in_order(run, (f.behind, f.gather), ready, C_outer)
    start = {r: [join(run.sim.env, evs)] for r, evs in ready.items()}
    got, done = run.rule(f.gather, start, 1), run.rule(f.behind, start, 1)
    return {
        r: [join(run.sim.env, [e for e in got[r] + done[r] if e is not None])] * C_outer
        for r in start
    }


cost_rules = {
    "Compute": _compute,
    "MatMul": _compute,
    "Attention": _compute,
    "Copy": _compute,
    "Collective": _collective,
    "P2P": _p2p,
    "FusedCollective": _fused,
    "Overlap": _overlap,
    "Prefetch": _prefetch,
}


def can_fold(plan: Plan, topo: Topology) -> bool:
    n = topo.devices_per_node
    return plan.stages == 1 and plan.world_size > n and plan.world_size % n == 0


def simulate(
    plan: Plan, topo: Topology, fold: Optional[bool] = None, compute_us: Optional[dict] = None
) -> Result:
    """Simulate one run of the plan on `topo` (world = plan.world_size ranks, from rank 0 on)."""
    fold = can_fold(plan, topo) if fold is None else fold and can_fold(plan, topo)
    run = Run(plan, topo, fold, compute_us)
    cursor = {r: [None] for r in run.sim.ranks}
    for step in plan.steps:
        done = run.rule(step, cursor, 1)
        cursor = {}
        for r in run.sim.ranks:
            evs = [e for e in done[r] + run.pending.pop(r, []) if e is not None]
            cursor[r] = [join(run.sim.env, evs)]
    extra = (
        topo.step_overhead_for(largest_transfer(plan, topo), plan.world_size)
        if plan.world_size > 1
        else 0.0
    )
    if extra > 0:
        cursor = {
            r: [run.sim.delay(r, extra, "step", "overhead", cursor[r])] for r in run.sim.ranks
        }
    ends = {}
    for r in run.sim.ranks:
        ev = cursor[r][0]
        if ev is not None:
            ev.callbacks.append(lambda _e, r=r: ends.__setitem__(r, run.sim.env.now))
    total = run.sim.run()
    finish = {r: ends.get(r, 0.0) for r in run.sim.ranks}
    return Result(max(finish.values(), default=total), finish, run.sim.frame(), fold)


def largest_transfer(plan: Plan, topo: Topology) -> float:
    """Bytes of the plan's largest collective (as `spec_of` sizes it) or P2P transfer; 0 if none."""
    sizes = [
        spec_of(plan, s, topo, 1).nbytes if isinstance(s, Collective) else s.nbytes
        for s in walk(plan.steps)
        if isinstance(s, (Collective, P2P))
    ]
    return float(max(sizes, default=0))


def simulate_collective(
    spec: CollSpec, topo: Topology, algorithm: Optional[str] = None, fold: Optional[bool] = None
) -> Result:
    """One collective alone on `topo` (its group: the first ranks), as nccl-tests times it."""
    algo = algorithm or choose(spec, topo)
    world = max(spec.group) + 1
    n = topo.devices_per_node
    foldable = algo in FOLDABLE or collectives.uses_nccl(spec, topo)
    fold = (world > n and world % n == 0 and foldable) if fold is None else fold
    sim = Sim(topo, world, fold)
    ready = {r: [None] * spec.chunks for r in sim.ranks if r in set(spec.group)}
    _, finished = collectives.simulate(sim, spec, algo, ready, f"{spec.kind} ({algo})")
    ends = {}
    for r, ev in finished.items():
        if ev is not None:
            ev.callbacks.append(lambda _e, r=r: ends.__setitem__(r, sim.env.now))
    total = sim.run()
    return Result(max(ends.values(), default=total), ends, sim.frame(), fold)


def choices(plan: Plan, topo: Topology) -> list[tuple[str, str, str]]:
    """(kind, algorithm, protocol) of every collective of the plan, in step order; the protocol
    is "" where NCCL does not run the collective (the CPU runtime)."""
    out: list[tuple[str, str, str]] = []

    def visit(step, chunks: int) -> None:
        if isinstance(step, Collective):
            spec = spec_of(plan, step, topo, chunks)
            algo = choose(spec, topo)
            nccl_runs = collectives.uses_nccl(spec, topo) and spec.P > 1
            out.append(
                (
                    step.kind,
                    algo,
                    collectives.nccl_call(spec, topo, algo).proto if nccl_runs else "",
                )
            )
        elif isinstance(step, FusedCollective) and kernel_fusable(plan, step, topo):
            call = kernel_call(plan, step, topo)  # every collective inside follows its pick
            out.extend(
                (p.kind, call.algo, call.proto) for p in step.steps if isinstance(p, Collective)
            )
        elif isinstance(step, FusedCollective):
            for part in step.steps:
                visit(part, step.chunks if fusable(plan, step) else 1)
        elif isinstance(step, Overlap):
            visit(step.producer, step.chunks)
            visit(step.consumer, step.chunks)

    for s in plan.steps:
        visit(s, 1)
    return out
