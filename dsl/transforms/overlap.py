"""`overlap(program, producer, consumer=None, chunks=4)`: pipeline a producer and its consumer.

The producer's output, flattened to [rows, last dimension], is computed in `chunks` chunks of rows and each chunk's communication starts as soon
as the chunk is ready: matmul -> reduce_scatter / all_reduce, and a collective -> p2p. When the
consumer is in a fused group, the whole group is pipelined with the producer.

Rule table `PAIRS`, keyed by the producer's kind: the consumer kinds it may overlap with.
Preconditions: producer and consumer of those kinds, the consumer reads the producer's output
directly, chunks >= 1, neither is already overlapped. Whether `chunks` divides the rows depends on
the sizes and is checked with the bindings (`check_chunks`).
"""

from __future__ import annotations

from typing import Mapping, Optional

from ..errors import ShapeError, TransformError
from ..ir import Overlap, Program, Ref
from ..printer import format_stmt
from ._rebuild import need_program, verified
from .naming import schedule_name

PAIRS = {
    "matmul": ("reduce_scatter", "all_reduce"),
    "reduce_scatter": ("p2p",),
    "all_reduce": ("p2p",),
    "all_gather": ("matmul",),
}


def overlap(p: Program, producer: Ref, consumer: Optional[Ref] = None, chunks: int = 4) -> Program:
    need_program(p, "overlap")
    try:
        prod = p.producer(p.value(getattr(producer, "value", producer)).id)
    except KeyError as e:
        raise TransformError(f"overlap: {e.args[0]}") from None
    if prod is None or prod.op not in PAIRS:
        raise TransformError(
            f"overlap: producer {producer!r} must be a statement of kind {'/'.join(PAIRS)}"
        )
    users = [s for s in p.users(prod.out.id) if s.op in PAIRS[prod.op]]
    if consumer is not None:
        try:
            cid = p.value(getattr(consumer, "value", consumer)).id
        except KeyError as e:
            raise TransformError(f"overlap: {e.args[0]}") from None
        users = [s for s in users if s.out.id == cid]
    if len(users) != 1:
        raise TransformError(
            f"overlap: {format_stmt(prod)}: needs exactly one consumer of kind "
            f"{'/'.join(PAIRS[prod.op])} reading it directly, found {len(users)}"
        )
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise TransformError(
            f"overlap: {format_stmt(prod)}: chunks must be an integer >= 1, got {chunks!r}"
        )
    cons = users[0]
    if prod.op == "all_gather":
        _gather_rows(prod, cons)
    taken = {i for o in p.overlaps for i in (o.producer, o.consumer)}
    if prod.out.id in taken or cons.out.id in taken:
        raise TransformError(f"overlap: {format_stmt(prod)}: already overlapped")
    q = p.with_(overlaps=p.overlaps + (Overlap(prod.out.id, cons.out.id, chunks),))
    return verified(q.with_(schedule=schedule_name(q)), "overlap")


def _gather_rows(ag, mm) -> None:
    """TransformError unless the all_gather's output is the matmul's left operand, gathered
    along dim 0 (whole rows of the product per rank's block)."""
    where = f"overlap: {format_stmt(ag)} -> {format_stmt(mm)}"
    if mm.values[0].id != ag.out.id or (len(mm.values) > 1 and mm.values[1].id == ag.out.id):
        raise TransformError(
            f"{where}: only the matmul's left operand can be gathered piece by piece (a gathered "
            "right operand's pieces are columns of the weight: gather it whole)"
        )
    dim, last = ag.args[0].type.layout.dim, ag.out.type.rank - 1
    if dim == last:
        raise TransformError(
            f"{where}: gathered along the contracted dimension, each piece gives partial sums of "
            "every output element, which changes the result; gather along dim 0"
        )
    if dim != 0:
        raise TransformError(
            f"{where}: gathered along dim {dim}, a rank's block is not contiguous rows of the "
            "product; gather along dim 0 (sequence parallelism's [S, B, H] layout)"
        )


def chunk_rows(p: Program, o: Overlap, bindings: Mapping[str, int]) -> int:
    """The rows each chunk count must divide: the producer's output flattened to [rows, last
    dimension] (S*B rows of an [S,B,H] matmul output), and, when the consumer scatters them over
    the P ranks (a reduce-scatter, or anything after one) or the producer gathers them from the
    P ranks (an all-gather), the rows of one rank's block."""
    shape = [s.evaluate(bindings) for s in p.producer(o.producer).out.type.shape]
    rows = 1
    for n in shape[:-1] or shape:
        rows *= n
    if p.producer(o.consumer).op == "reduce_scatter":  # (a reduce-scatter producer's output
        rows //= bindings["P"]  # is already one rank's slice)
    if p.producer(o.producer).op == "all_gather":  # chunks of each rank's block of rows
        rows //= bindings["P"]
    return rows


def check_chunks(p: Program, bindings: Mapping[str, int]) -> None:
    """ShapeError unless every overlap's chunk count divides its rows at these bindings."""
    for o in p.overlaps:
        rows = chunk_rows(p, o, bindings)
        if rows % o.chunks:
            raise ShapeError(
                f"overlap(%{o.producer} -> %{o.consumer}): {o.chunks} chunks do not "
                f"divide the {rows} rows of each rank's part; choose a chunk count "
                "that divides them"
            )
