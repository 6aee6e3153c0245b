"""The Plan: what one scheduled program does on one machine, for the runtime and the cost model.

A Plan is the one structure both the runtime (`codegen.runtime`) and the cost model consume, so
"measured" and "predicted" are always about the same thing. It is made by `codegen.lower` from a
scheduled `dsl.Program` at concrete sizes and holds only plain data (no torch, no compiler), so
the cost model can import this module alone.

Units: shapes and counts in elements, `nbytes` in bytes, `flops` in floating-point operations.

Buffers are per-rank storage, one per DSL value that needs memory, with the value's local shape.
A buffer with `alias` shares the storage of another buffer (an update writes its input in place).

Steps (`Plan.steps` runs in order; each step's buffers are those of the ranks of its stage):
- `Compute`: one generated kernel (a fused stage of pointwise statements, possibly ending in
  reductions to scalars), run over the loop's elements [begin, end).
- `MatMul`: a library matmul [.., K] x [K, H].
- `Attention`: a library scaled dot-product attention of [S, B, E] q, k, v (`dsl.attention`),
  heads of `head_dim` columns; flops 4 S^2 B E (the two products) + 5 S^2 B E / head_dim (the
  softmax), bytes q, k, v and the output once.
- `Collective`: all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all within the
  tensor-parallel group of a stage.
- `P2P`: rank i of stage `src_stage` sends a buffer to rank i of stage `dst_stage`.
- `Copy`: dst <- src (when an update cannot write in place).
- `FusedCollective`: a collective whose chunks run kernels as soon as they are reduced; its
  `steps` are the collective's parts and kernels in program order (`RS, Compute.., AG..` or
  `P2P, Compute.., AG..`; a 0-d all_reduce inside is a barrier across chunks).
- `Overlap`: `producer` (a MatMul or a collective) computed in `chunks` row chunks, each chunk
  handed to `consumer` (a Collective, P2P or FusedCollective) as soon as it is ready; or an
  all-gather whose chunks a MatMul consumes as they arrive (`ol(AG,MM)`).
- `Prefetch`: an all-gather `gather` started before `behind` (a step that does not read it) and
  run at once with it, waited for after it (`pf(AG,..)`: FSDP's layer-ahead all-gather).

Kernels read operands through `Access`es: at loop element e (a flat index into the loop shape L,
with multi-index i_d = (e // prod(L[d+1:])) % L[d]) the operand's element is
    index = rank * rank_stride + sum_d i_d * strides[d]
where rank is the tensor-parallel index. This covers same-shape reads (strides = contiguous
strides of L), broadcasting (stride 0) and a replicated tensor read as this rank's slice
(`rank_stride` = the slice's offset). Dropout's global element index is an Access too.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Optional, Union

from dsl.ir import Stmt
from dsl.types import DType, Layout

ITEMSIZE = {
    DType.f16: 2,
    DType.bf16: 2,
    DType.f32: 4,
    DType.f64: 8,
    DType.i32: 4,
    DType.i64: 8,
    DType.bool: 1,
}


@dataclass(frozen=True)
class Buffer:
    id: int
    name: str
    dtype: DType
    shape: tuple[int, ...]
    layout: Layout
    stage: Optional[int]
    alias: Optional[int] = None

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Access:
    value: int  # the DSL value id the kernel's statements refer to
    buffer: int
    strides: tuple[int, ...]  # one per loop dimension, in elements
    rank_stride: int = 0

    def is_contiguous(self, loop: tuple[int, ...]) -> bool:
        """Whether the element index is the flat loop index e: the loop's contiguous strides at
        every dimension of extent > 1 (a dimension of extent 1 adds 0, whatever its stride, e.g.
        the micro-batch B=1 of an [S, B, H] activation read with stride 0)."""
        return len(self.strides) == len(loop) and all(
            s == c for s, c, n in zip(self.strides, contiguous_strides(loop), loop) if n != 1
        )


@dataclass(frozen=True)
class Kernel:
    name: str
    loop: tuple[int, ...]  # the loop shape; the kernel runs over flat elements [begin, end)
    stmts: tuple[Stmt, ...]  # the DSL statements it computes, in program order
    scalars: tuple[
        int, ...
    ]  # 0-d buffers read, passed by value (hyper-parameters, reduced scalars)
    reads: tuple[Access, ...]  # tensor operands
    writes: tuple[tuple[int, int], ...]  # (value id, buffer id) written at e, loop-shaped
    # (value id, buffer id) accumulated over the loop (+=): a sum's 0-d, a segment_sum's [nseg]
    reduces: tuple[tuple[int, int], ...]
    scalar_outs: tuple[tuple[int, int], ...]  # (value id, 0-d buffer id) computed once (prologue)
    dropout_index: tuple[tuple[int, Access], ...] = ()  # stmt out id -> its global element index

    @property
    def numel(self) -> int:
        return prod(self.loop)

    def args(self) -> tuple[int, ...]:
        """The buffer ids the compiled kernel takes, in this order, after (begin, end, rank)."""
        ids = {a.buffer for a in self.reads} | set(self.scalars)
        ids |= {b for _, b in self.writes + self.reduces + self.scalar_outs}
        return tuple(sorted(ids))


@dataclass(frozen=True)
class Compute:
    id: int
    kernel: Kernel
    stage: Optional[int]
    nbytes: int  # bytes moved through memory by one full run
    flops: int


@dataclass(frozen=True)
class MatMul:
    id: int
    a: int
    b: int
    out: int
    stage: Optional[int]
    m: int
    k: int
    n: int
    nbytes: int
    flops: int


@dataclass(frozen=True)
class Attention:
    id: int
    q: int
    k: int
    v: int
    out: int
    stage: Optional[int]
    s: int
    b: int
    e: int
    head_dim: int
    causal: bool
    nbytes: int
    flops: int


@dataclass(frozen=True)
class Collective:
    id: int
    kind: str  # all_reduce | reduce_scatter | all_gather | broadcast | reduce | all_to_all
    src: int
    dst: int
    stage: Optional[int]
    nbytes: (
        int  # the whole message as nccl-tests counts it (reduce_scatter/all_gather: the full array)
    )
    op: str = "sum"
    dim: int = 0
    root: int = 0
    split_dim: int = 0
    concat_dim: int = 0
    partial: bool = False  # combines a sliced reduction's partials (`dsl.ops.is_combine`)


@dataclass(frozen=True)
class P2P:
    id: int
    src: int
    dst: int
    src_stage: int
    dst_stage: int
    nbytes: int


@dataclass(frozen=True)
class Copy:
    id: int
    src: int
    dst: int
    stage: Optional[int]
    nbytes: int


Step = Union[
    Compute, MatMul, Attention, Collective, P2P, Copy, "FusedCollective", "Overlap", "Prefetch"
]


@dataclass(frozen=True)
class FusedCollective:
    id: int
    steps: tuple[Step, ...]
    chunks: int


@dataclass(frozen=True)
class Overlap:
    id: int
    producer: Step
    consumer: Step
    chunks: int


@dataclass(frozen=True)
class Prefetch:
    id: int
    gather: Step  # an all_gather Collective, started before `behind` and waited for after it
    behind: Step


@dataclass(frozen=True)
class Plan:
    name: str
    schedule: str
    world_size: int
    P: int
    stages: int
    bindings: tuple[tuple[str, int], ...]
    buffers: tuple[Buffer, ...]
    inputs: tuple[tuple[str, int], ...]  # input name -> buffer id
    outputs: tuple[tuple[str, int], ...]  # output name -> buffer id
    steps: tuple[Step, ...]
    defaults: tuple[tuple[str, float], ...] = ()  # hyper-parameter inputs' default values

    def buffer(self, id_: int) -> Buffer:
        for b in self.buffers:
            if b.id == id_:
                return b
        raise KeyError(id_)

    def kernels(self) -> list[Kernel]:
        return [s.kernel for s in walk(self.steps) if isinstance(s, Compute)]


def label(step) -> str:
    """A step's name in timelines, measured (`PlanRunner.marks`) and modelled (the cost model's
    trace): "<id>:<type>", then the kernel's name or the collective's kind."""
    extra = step.kernel.name if isinstance(step, Compute) else getattr(step, "kind", "")
    return f"{step.id}:{type(step).__name__}" + (f" {extra}" if extra else "")


def walk(steps) -> list:
    """Every step, composite ones followed by their parts, in order."""
    out = []
    for s in steps:
        out.append(s)
        if isinstance(s, FusedCollective):
            out.extend(walk(s.steps))
        elif isinstance(s, Overlap):
            out.extend(walk((s.producer, s.consumer)))
        elif isinstance(s, Prefetch):
            out.extend(walk((s.gather, s.behind)))
    return out


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))
