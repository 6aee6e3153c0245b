"""The composite steps of a Plan, chunk by chunk on a GPU rank: the CUDA twin of
`codegen.runtime.pipelined` (same composites, same chunks, same order of work), with NCCL calls on
the comm stream, kernels and matmuls on the compute stream, and one CUDA event per chunk between.

Chunk c of a rank's slice is elements [c*n/C, (c+1)*n/C) of it (n its element count); in a
tensor of P blocks (a reduce-scatter's input, an all-gather's output), chunk c of block i is
elements [i*n + c*n/C, i*n + (c+1)*n/C). NCCL's reduce-scatter and all-gather take one contiguous
piece per rank, so chunk c of every block is packed (`blocks[:, c].contiguous()`) before its
reduce-scatter, and an all-gathered chunk is scattered into its blocks after.

- `fused_all_reduce(r, f, producer=None)`: every chunk's reduce-scatter is issued on the comm
  stream, each followed by an event; the compute stream waits for chunk c's event only and runs
  the kernels on chunk c; the comm stream waits for that and all-gathers chunk c. A 0-d all_reduce
  inside (LAMB's norms) is a barrier between phases. With an overlapped `producer` (a MatMul whose
  output the reduce-scatter reads), chunk c's rows of every block are computed on the compute stream,
  then reduced on the comm stream while the compute stream goes on with chunk c+1's rows and chunk
  c-1's kernels.
- `overlapped_send(r, o)`: `ol(RS, fuse(P2P-C-AG))`: the sending stage reduce-scatters chunk c and
  sends it at once (comm stream, in order); the receiving stage posts every chunk's receive, runs
  the kernels on chunk c when it has arrived and all-gathers it.
`fusable` and `overlappable` are the CPU runtime's: both runtimes run the same composites this way.
On the CPU stand-in (`CudaPlanRunner(device=None)`, tests) there are no streams: the same calls
run in the same order on gloo.
"""
from __future__ import annotations

from typing import Optional

import torch

from .pipelined import _phases, chunk_order, fusable, overlappable  # noqa: F401  (re-exported)
from ..plan import Collective, Compute, FusedCollective, MatMul, Overlap


def _runtime():
    from . import cuda_execute
    return cuda_execute


def _slice_chunks(n: int, C: int) -> int:
    if n % C:
        raise ValueError(f"{C} chunks do not divide this rank's slice of {n} elements")
    return n // C


def _reduce_chunk(r, rs: Collective, c: int, C: int) -> None:
    """Chunk c of rs, on the current (comm) stream."""
    rt = _runtime()
    dst = r.bufs[rs.dst].view(-1)
    size = _slice_chunks(dst.numel(), C)
    blocks = r.bufs[rs.src].view(r.plan.P, C, size)
    rt.reduce_scatter(dst[c * size:(c + 1) * size], blocks[:, c].contiguous().view(-1),
                      op=rt.OPS[rs.op], group=r.pg)


def _gather_chunk(r, ag: Collective, c: int, C: int) -> None:
    """Chunk c of every member's slice into chunk c of every block of ag's destination."""
    src, P = r.bufs[ag.src].view(-1), r.plan.P
    size = _slice_chunks(src.numel(), C)
    got = torch.empty(P * size, dtype=src.dtype, device=src.device)
    _runtime().all_gather(got, src[c * size:(c + 1) * size], group=r.pg)
    r.bufs[ag.dst].view(P, C, size)[:, c].copy_(got.view(P, size))


def _kernels(r, kernels: list[Compute], c: int, C: int) -> None:
    for s in kernels:
        n = s.kernel.numel
        r.compute(s, c * n // C, (c + 1) * n // C, zero=(c == 0))


def _produce_rows(r, mm: MatMul, c: int, C: int) -> None:
    """Rows of chunk c of every rank's block of the matmul's output (current stream)."""
    a2 = r.bufs[mm.a].reshape(mm.m, mm.k)
    out2 = r.bufs[mm.out].view(mm.m, mm.n)
    rows = mm.m // r.plan.P  # rows of one rank's block
    k = rows // C
    for j in range(r.plan.P):
        lo = j * rows + c * k
        torch.matmul(a2[lo:lo + k], r.bufs[mm.b], out=out2[lo:lo + k])


def _compute_then_gather(r, kernels, gathers, c: int, C: int, ready) -> None:
    """Chunk c: the kernels on the compute stream (after event `ready`, if any), then its
    all-gathers on the comm stream once they are done."""
    rt = _runtime()
    with rt.in_stream(r.compute_stream):
        if ready is not None:
            rt.wait_event(r.compute_stream, ready)
        _kernels(r, kernels, c, C)
        done = rt.record(r.compute_stream)
    if gathers:
        with rt.in_stream(r.comm_stream):
            rt.wait_event(r.comm_stream, done)
            for ag in gathers:
                _gather_chunk(r, ag, c, C)


def fused_all_reduce(r, f: FusedCollective, producer: Optional[MatMul] = None) -> None:
    rt = _runtime()
    rs, C = f.steps[0], f.chunks
    reduced: list = [None] * C

    def reduce(c: int) -> None:
        with rt.in_stream(r.comm_stream):
            _reduce_chunk(r, rs, c, C)
            reduced[c] = rt.record(r.comm_stream)

    if producer is None:
        r.after_other(r.comm_stream)  # the reduce-scatter's input is ready
        for c in range(C):
            reduce(c)
    else:
        r.after_other(r.compute_stream)  # the matmul's inputs are ready
    for k, (kernels, barrier, gathers) in enumerate(_phases(r.plan, f.steps[1:])):
        def finish(c: int) -> None:
            _compute_then_gather(r, kernels, gathers, c, C, reduced[c] if k == 0 else None)

        for what, c in chunk_order(C, overlapped=producer is not None and k == 0):
            if what == "produce":
                with rt.in_stream(r.compute_stream):
                    _produce_rows(r, producer, c, C)
                    produced = rt.record(r.compute_stream)
                rt.wait_event(r.comm_stream, produced)
                reduce(c)
            else:
                finish(c)
        if barrier is not None:
            with r.on(r.comm_stream):
                r.collective(barrier)
            rt.wait_event(r.compute_stream, rt.record(r.comm_stream))


def overlapped_send(r, o: Overlap) -> None:
    rt = _runtime()
    rs, f = o.producer, o.consumer
    send, C = f.steps[0], o.chunks
    if r.stage == send.src_stage:
        m = r.bufs[send.src].numel()
        with r.on(r.comm_stream):
            for c in range(C):
                _reduce_chunk(r, rs, c, C)
                r.p2p(send, c * m // C, (c + 1) * m // C)
    elif r.stage == send.dst_stage:
        m = r.bufs[send.dst].numel()
        arrived = []
        with r.on(r.comm_stream):
            for c in range(C):
                r.p2p(send, c * m // C, (c + 1) * m // C)
                arrived.append(rt.record(r.comm_stream))
        kernels = [s for s in f.steps[1:] if isinstance(s, Compute)]
        gathers = [s for s in f.steps[1:] if isinstance(s, Collective)]
        for c in range(C):
            _compute_then_gather(r, kernels, gathers, c, C, arrived[c])
