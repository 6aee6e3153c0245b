"""The composite steps of a Plan, run chunk by chunk on this rank, on any Backend.

Chunk c of a rank's slice is elements [c*n/C, (c+1)*n/C) of it (n its element count), as in
`codegen.runtime.communicator` (`codegen.chunk_schedule.chunk_bounds`, the one schedule that
comm=symm's in-kernel chunk loop renders too); kernels run on exactly that element range of their loop, so a fused
stage computes chunk c as soon as chunk c has arrived. Written once over the runner's communicator
(`r.comm`, `r.world`: chunked transfers with per-chunk completion) and streams (`r.streams`:
kernels and matmuls on the compute stream; on the CPU there are none and every call blocks until
it is done), so the CPU and the GPU run the same composites in the same order of work.

- `fused_all_reduce(r, f, producer=None)`: `RS, kernels, AG..`: the reduce-scatter of every chunk
  is issued at once, the kernels run on each chunk as soon as it is reduced, each chunk's
  all-gathers start right after. A 0-d all_reduce inside (LAMB's norms) is a barrier: the kernels
  before it finish on every chunk first. With an overlapped `producer` (a MatMul whose output the
  reduce-scatter reads), chunk c's rows are computed (for every rank's block) just before chunk c
  is sent, while earlier chunks are in flight and being computed on.
- `gathered_matmul(r, o)`: `ol(AG,MM)`: the all-gather's chunks all sent at once; the matmul's
  rows of this rank's own block computed from its slice first, then those of chunk c of the
  other blocks as soon as chunk c has arrived (`wait_chunk`), while later chunks are in flight.
  (`ol(MM,RS)` alone runs as `fused_all_reduce` with a producer and no kernels.)
- `prefetched(r, f)`: `pf(AG,..)`: the all-gather started, the step behind it run, the gather
  waited for.
- `overlapped_send(r, o)`: `ol(RS, fuse(P2P-C-AG))`: stage `src` reduce-scatters in chunks and sends
  each reduced chunk to its peer on the next stage at once; the next stage runs the kernels on each
  chunk as it arrives and starts its all-gather.
- `peer_fused(r, f, ps)`: on comm=shm, `fused_all_reduce` with the reduction inside the kernels
  (`codegen.shm_fuse`): they read the peers' gradient chunks from shared memory and write the
  gathered outputs where the peers read them.
`codegen.chunked` (`fusable`, `overlappable`: the cost model's rule too) says which composites
run this way; others run their parts one after the other (same result, no overlap).
Each piece of work ends with `r.mark` (a no-op unless the runner keeps a timeline, `marks`):
`fused_all_reduce` marks the head's start, each chunk's wait, kernel and all-gather send, the
barrier, and the final waits; `overlapped_send` its kernel chunks, then (in `execute`) the rest
of the step as one segment; `peer_fused` the whole step as one.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from ..chunk_schedule import chunk_bounds
from ..plan import Collective, Compute, FusedCollective, MatMul, Overlap, Plan, Prefetch, walk
from ..shm_fuse import PeerStep, peer_step


def _phases(plan: Plan, steps) -> list:
    """Split the fused steps at 0-d all_reduces: [(kernels, barrier or None, all_gathers)]."""
    phases, kernels, ags = [], [], []
    for s in steps:
        if isinstance(s, Compute):
            kernels.append(s)
        elif isinstance(s, Collective) and s.kind == "all_gather":
            ags.append(s)
        else:
            phases.append((kernels, s, ags))
            kernels, ags = [], []
    phases.append((kernels, None, ags))
    return phases


def chunk_order(C: int, overlapped: bool) -> list[tuple[str, int]]:
    """The order of a fused step's work on its C chunks, as ("produce" | "finish", chunk): with
    an overlapped producer chunk c is produced (and its reduce-scatter started) before chunk c-1
    is finished, so neighbouring chunks' computation and communication overlap; otherwise the
    chunks are finished in order."""
    if not overlapped:
        return [("finish", c) for c in range(C)]
    order = []
    for c in range(C):
        order.append(("produce", c))
        if c:
            order.append(("finish", c - 1))
    return order + [("finish", C - 1)]


def _chunk(r, kernels, c: int, C: int, n: int = 0) -> None:
    """Chunk c of every kernel, on the compute stream (after the chunk's inputs have arrived);
    with `n` (the slice's elements), a kernel of another loop (per-segment values, which any
    chunk's elements may read through `take`) runs whole with chunk 0."""
    with r.streams.use(r.streams.compute):
        for s in kernels:
            if n and s.kernel.numel != n:
                if c == 0:
                    r.compute(s, 0, s.kernel.numel)
                continue
            lo, hi = chunk_bounds(s.kernel.numel, C)[c]
            r.compute(s, lo, hi, zero=(c == 0))
            r.mark(s, chunk=c)


def _produce_rows(r, mm: MatMul, c: int, C: int) -> None:
    """Rows of chunk c of every rank's block of the matmul's output, on the compute stream: one
    matmul a block (the same row blocks as the whole matmul's, so the same sums bit for bit)."""
    a, out = r.bufs[mm.a], r.bufs[mm.out]
    a2, out2 = a.reshape(mm.m, mm.k), out.view(mm.m, mm.n)
    rows = mm.m // r.plan.P  # rows of one rank's block
    k = rows // C
    with r.streams.use(r.streams.compute):
        for j in range(r.plan.P):
            lo = j * rows + c * k
            r.timed(partial(torch.matmul, a2[lo : lo + k], r.bufs[mm.b], out=out2[lo : lo + k]))


def peer_steps(r) -> dict[int, PeerStep]:
    """{fused step id: its PeerStep} where the runner's communicator lets kernels read the peers'
    slots (comm=shm), their kernels built into `r.kernels`; {} elsewhere."""
    if not r.comm.reads_peers:
        return {}
    steps = {
        f.id: peer_step(r.plan, f)
        for f in walk(r.plan.steps)
        if isinstance(f, FusedCollective)
        and isinstance(f.steps[0], Collective)
        and r.mine(f.steps[0].stage)
    }
    steps = {i: ps for i, ps in steps.items() if ps is not None}
    missing = {
        s.kernel.name: s.kernel
        for ps in steps.values()
        for s in ps.kernels
        if s.kernel.name not in r.kernels
    }
    if missing:
        r.kernels.update(r.backend.build(list(missing.values())))
    return steps


def peer_fused(r, f: FusedCollective, ps: PeerStep) -> None:
    """CoCoNeT's fused all-reduce over shared memory: each member copies its gradient chunk by
    chunk into its slot; its kernel reads chunk c of its block from every member's slot, reduces
    it, updates its slice and writes the all-gathers' sources into its own slot, where the peers
    read them, and into its own block of their destinations (the all-gather is a read of the
    peers' blocks)."""
    C, rs = f.chunks, ps.head
    ring = r.comm.reduce_scatter_chunks(
        r.bufs[rs.src].view(-1), r.bufs[rs.dst].view(-1), rs.op, C, reduce=False
    ).start(send=False)
    gathers = [
        r.comm.all_gather_chunks(r.bufs[ag.src].view(-1), r.bufs[ag.dst].view(-1), C, in_slot=True)
        for ag in ps.gathers
    ]
    bufs = dict(zip(ps.peer_buffers, ring.peers()))
    bufs.update({ag.src: g.slot for ag, g in zip(ps.gathers, gathers)})
    bufs.update({o: g.own_block for o, g in zip(ps.own_blocks, gathers)})
    ring.send_chunk(0)
    for c in range(C):
        if c + 1 < C:
            ring.send_chunk(c + 1)
        ring.wait_chunk(c)
        for s in ps.kernels:  # the chunk schedule comm=symm's kernel renders (`chunk_bounds`)
            lo, hi = chunk_bounds(s.kernel.numel, C)[c]
            r.compute(s, lo, hi, zero=(c == 0), bufs=bufs)
        for g in gathers:
            g.start_chunk(c)
    ring.wait()
    for ag, g in zip(ps.gathers, gathers):
        if ag.src in ps.kept:  # this member's slice, where a later step or the caller reads it
            r.bufs[ag.src].view(-1).copy_(g.slot)
        g.wait(own=not ps.own_blocks)  # the kernel wrote this member's block itself


def fused_all_reduce(r, f: FusedCollective, producer: Optional[MatMul] = None) -> None:
    if producer is None and f.id in r.peer_steps:
        peer_fused(r, f, r.peer_steps[f.id])
        r.mark(f)
        return
    rs, C, streams = f.steps[0], f.chunks, r.streams
    if producer is not None:
        streams.after_other(streams.compute)  # the matmul's inputs are ready
    ring = r.comm.reduce_scatter_chunks(
        r.bufs[rs.src].view(-1), r.bufs[rs.dst].view(-1), rs.op, C
    ).start(send=producer is None)
    r.mark(rs, "start")
    gathers = []
    for k, (kernels, barrier, ags) in enumerate(_phases(r.plan, f.steps[1:])):
        mine = [
            (ag, r.comm.all_gather_chunks(r.bufs[ag.src].view(-1), r.bufs[ag.dst].view(-1), C))
            for ag in ags
        ]
        gathers += mine

        def finish(c: int) -> None:
            if k == 0:
                ring.wait_chunk(c)
                r.mark(rs, "wait", c)
            _chunk(r, kernels, c, C, r.bufs[rs.dst].numel())
            for ag, g in mine:
                g.start_chunk(c)
                r.mark(ag, "send", c)

        for what, c in chunk_order(C, overlapped=producer is not None and k == 0):
            if what == "produce":
                _produce_rows(r, producer, c, C)
                r.mark(producer, "rows", c)
                ring.send_chunk(c)
                r.mark(rs, "send", c)
            else:
                finish(c)
        if barrier is not None:  # a 0-d all_reduce: every chunk's kernels first
            with streams.on(streams.comm):
                r.collective(barrier)
            streams.after_other(streams.compute)
            r.mark(barrier)
    ring.wait()  # the reduce-scatter's sends
    r.mark(rs, "wait")
    for ag, g in gathers:
        g.wait()
        r.mark(ag, "wait")


def gathered_matmul(r, o: Overlap) -> None:
    """`ol(AG,MM)`: every chunk of this rank's slice is sent at once; the matmul computes the
    rows of this rank's own block from its slice (nothing to wait for), then, chunk by chunk,
    the rows of chunk c of every other rank's block as soon as chunk c has arrived, while the
    later chunks are in flight. The gathered tensor is written whole, as the all-gather alone
    writes it."""
    ag, mm, C, P, me = o.producer, o.consumer, o.chunks, r.plan.P, r.tp
    src, out = r.bufs[ag.src].view(-1), r.bufs[ag.dst].view(-1)
    streams = r.streams
    streams.after_other(streams.compute)  # the slice is ready
    g = r.comm.all_gather_chunks(src, out, C)
    for c in range(C):
        g.start_chunk(c)
        r.mark(ag, "send", c)
    rows, w = mm.m // P, r.bufs[mm.b]
    k = rows // C
    blocks = out.view(P, rows, mm.k)  # the gathered rows, by rank
    prod = r.bufs[mm.out].view(P, rows, mm.n)
    with streams.use(streams.compute):
        r.timed(lambda: torch.matmul(src.view(rows, mm.k), w, out=prod[me]))
    r.mark(mm, "own rows")
    for c in range(C):
        g.wait_chunk(c)
        r.mark(ag, "wait", c)
        with streams.use(streams.compute):  # chunk c of the blocks before and after this rank's
            for lo, hi in ((0, me), (me + 1, P)):
                if lo < hi:
                    r.timed(partial(_rows_of, blocks, prod, w, lo, hi, c * k, (c + 1) * k))
        r.mark(mm, "rows", c)
    g.wait()
    r.mark(ag, "wait")


def _rows_of(blocks, prod, w, lo: int, hi: int, a: int, b: int) -> None:
    """prod[j, a:b] = blocks[j, a:b] @ w for the ranks' blocks j in [lo, hi), one batched matmul
    (strided rows: computed apart, then copied into place)."""
    prod[lo:hi, a:b].copy_(torch.matmul(blocks[lo:hi, a:b], w))


def prefetched(r, f: Prefetch) -> None:
    """`pf(AG,..)`: the all-gather issued (on the comm stream, after the compute so far), the step
    behind it run meanwhile, then the gather waited for (on the ring, a P > 2 group's forwarding
    steps run in the wait, so only the first step overlaps)."""
    ag = f.gather
    g = r.comm.all_gather_chunks(r.bufs[ag.src].view(-1), r.bufs[ag.dst].view(-1), 1)
    g.start_chunk(0)
    r.mark(ag, "start")
    r.step(f.behind)
    g.wait_chunk(0)
    g.wait()
    r.mark(ag, "wait")


def overlapped_send(r, o: Overlap) -> None:
    rs, f = o.producer, o.consumer
    send, C = f.steps[0], o.chunks
    P = r.plan.P
    src, dst = send.src_stage * P + r.tp, send.dst_stage * P + r.tp
    if r.stage == send.src_stage:
        ring = r.comm.reduce_scatter_chunks(
            r.bufs[rs.src].view(-1), r.bufs[rs.dst].view(-1), rs.op, C
        ).start()
        p2p = r.world.p2p(r.bufs[send.src].view(-1), None, src, dst, C)
        for c in range(C):
            ring.wait_chunk(c)
            p2p.start_chunk(c)
        ring.wait()
        p2p.wait()
    elif r.stage == send.dst_stage:
        p2p = r.world.p2p(None, r.bufs[send.dst].view(-1), src, dst, C).start()
        kernels = [s for s in f.steps[1:] if isinstance(s, Compute)]
        gathers = [
            r.comm.all_gather_chunks(r.bufs[ag.src].view(-1), r.bufs[ag.dst].view(-1), C)
            for ag in f.steps[1:]
            if isinstance(ag, Collective)
        ]
        for c in range(C):
            p2p.wait_chunk(c)
            _chunk(r, kernels, c, C)
            for g in gathers:
                g.start_chunk(c)
        for g in gathers:
            g.wait()
