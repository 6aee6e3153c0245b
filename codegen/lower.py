"""`lower(program, bindings, world_size) -> Plan`: a scheduled program at concrete sizes.

Contract: the Plan computes exactly what `dsl.interpret` computes for the program (the runtime is
tested against it). Steps keep the program's statement order. Lowering:

1. binds sizes (P = world_size / stages), evaluates symbolic constants, and expands `norm(x)` to
   `sqrt(sum(x * x))` and `mean(x)` to `sum(x) / numel`, so kernels only ever reduce by `sum`;
2. delays 0-d all_reduces (the combine steps of sliced reductions) until their results are needed,
   so several partial reductions share one pass; then
   groups consecutive computation with the same loop shape and layout into one kernel, starting a
   new kernel at any communication, library op (matmul, attention: a step of its own), or
   statement that reads a reduction of the current kernel; 0-d statements run once in a kernel's prologue; a row op (softmax, layer_norm) is a
   kernel of its own (a loop over rows: `codegen.render`), never grouped with its neighbours;
3. gives storage to what crosses a step (inputs, communication results, kernel values used
   elsewhere, outputs); `slice(x)` becomes an `Access` into x's buffer, `update(x, v)` writes v into
   x's buffer (in the kernel that computes v, or as the destination of the collective that
   produces it when nothing else reads v, else by a `Copy`);
4. wraps the steps of a fused group into a `FusedCollective` (chunks: the largest divisor of the
   rank's slice not above `fused_chunks`) and an overlapped pair into an `Overlap` (its chunk
   count must divide the producer's rows: `ShapeError` otherwise), and a prefetched all-gather
   with the step it runs behind into a `Prefetch` (`ShapeError` if that step reads it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from math import prod
from typing import Mapping, Optional

from dsl.errors import BindError, ShapeError
from dsl.interpret import bind
from dsl.ir import Const, Program, Stmt, Value
from dsl.ops import COMM, LIBRARY, ROW, is_combine
from dsl.sizes import Size
from dsl.transforms import check_chunks
from dsl.types import Replicated, Sliced, TensorType

from .plan import (
    ITEMSIZE,
    P2P,
    Access,
    Attention,
    Buffer,
    Collective,
    Compute,
    Copy,
    FusedCollective,
    Kernel,
    MatMul,
    Overlap,
    Plan,
    Prefetch,
    contiguous_strides,
)

# flops per element of the ops that cost more than one (the cost model's roofline); a row op's
# bytes count one read and one write (its second and third passes over a row hit the cache)
ACCUMULATED = ("sum", "segment_sum")  # accumulated over a kernel's loop into its reduces

FLOPS_PER_ELEMENT = {"tanh": 8, "erf": 8, "gelu": 12, "softmax": 5, "layer_norm": 7}


@dataclass
class _Unit:
    """A kernel under construction, or one non-kernel statement."""

    kind: str  # "kernel" | "matmul" | "comm"
    stmts: list[Stmt] = field(default_factory=list)
    group: Optional[int] = None  # index of the fused group, if any
    loop: Optional[TensorType] = None  # the kernel's loop type
    row: bool = False  # a row op's kernel: nothing joins it


def _expand(p: Program, bound: Mapping[str, int]) -> tuple[list[Stmt], dict[int, int]]:
    """Statements with sizes bound, norm/mean expanded; and new stmt id -> original stmt id."""
    next_id = p.fresh_id()
    out: list[Stmt] = []
    origin: dict[int, int] = {}

    def const(a):
        if isinstance(a, Const) and isinstance(a.value, Size):
            return Const(float(a.value.value(bound)))
        return a

    for s in p.body:
        s = Stmt(s.out, s.op, tuple(const(a) for a in s.args), s.attrs)
        if s.op in ("norm", "mean"):
            x = s.args[0]
            t0 = s.out.type
            if s.op == "norm":
                sq = Value(next_id, f"{s.out.name}.sq", x.type)
                tot = Value(next_id + 1, f"{s.out.name}.sum", t0)
                new = [
                    Stmt(sq, "mul", (x, x)),
                    Stmt(tot, "sum", (sq,)),
                    Stmt(s.out, "sqrt", (tot,)),
                ]
            else:
                tot = Value(next_id + 1, f"{s.out.name}.sum", t0)
                n = float(prod(d.evaluate(bound) for d in x.type.shape))
                new = [Stmt(tot, "sum", (x,)), Stmt(s.out, "div", (tot, Const(n)))]
            next_id += 2
        else:
            new = [s]
        for t in new:
            origin[t.out.id] = s.out.id
            out.append(t)
    return out, origin


def _sink_scalar_syncs(stmts: list[Stmt]) -> list[Stmt]:
    """Delay each 0-d all_reduce (a sliced reduction's combine step) and the scalar arithmetic
    on its result or on a sum until something else needs them, so that the partial sums of
    several reductions (LAMB's two norms) are computed in one pass and combined together. A stable
    topological reordering: every statement still follows what it reads."""
    out: list[Stmt] = []
    pending: list[Stmt] = []
    waiting: set[int] = set()
    for s in stmts:
        needs = any(a.id in waiting for a in s.values)
        sync = is_combine(s)
        if sync or (needs and s.out.type.rank == 0 and s.op not in COMM and s.op != "update"):
            pending.append(s)
            waiting.add(s.out.id)
            continue
        if needs:
            out += _syncs_first(pending)
            pending, waiting = [], set()
        out.append(s)
        if s.op in ACCUMULATED:  # what reads a reduction waits too: it cannot share the loop
            waiting.add(s.out.id)
    return out + _syncs_first(pending)


def _syncs_first(pending: list[Stmt]) -> list[Stmt]:
    """The pending statements in a dependency order that puts the all_reduces as early as it
    can, so they run back to back."""
    out, done, todo = [], set(), list(pending)
    ids = {s.out.id for s in pending}
    while todo:
        ready = [s for s in todo if all(a.id in done or a.id not in ids for a in s.values)]
        s = next((s for s in ready if s.op == "all_reduce"), ready[0])
        out.append(s)
        done.add(s.out.id)
        todo.remove(s)
    return out


def _partition(p: Program, stmts: list[Stmt], origin: dict[int, int]) -> list[_Unit]:
    units: list[_Unit] = []
    reduced: set[int] = set()  # sums computed in the current kernel
    for s in stmts:
        g = p.group_of(origin[s.out.id])
        gi = p.fused.index(g) if g is not None else None
        if s.op in COMM or s.op in LIBRARY:  # a step of its own: comm, matmul or attention
            units.append(_Unit("comm" if s.op in COMM else s.op, [s], gi))
            continue
        if s.op in ROW:  # a row op: a kernel of its own (a loop over rows)
            units.append(_Unit("kernel", [s], gi, s.out.type, row=True))
            continue
        cur = units[-1] if units else None
        t = s.args[0].type if s.op in ACCUMULATED else s.out.type  # what it loops over
        fits = (
            cur is not None
            and cur.kind == "kernel"
            and not cur.row
            and cur.group == gi
            and not any(a.id in reduced for a in s.values)
            and (
                t.rank == 0
                or cur.loop is None
                or (cur.loop.shape, cur.loop.layout) == (t.shape, t.layout)
            )
        )
        if not fits:
            cur = _Unit("kernel", [], gi)
            units.append(cur)
            reduced = set()
        cur.stmts.append(s)
        if t.rank > 0 and cur.loop is None:
            cur.loop = t
        if s.op in ACCUMULATED:
            reduced.add(s.out.id)
    return units


class _Lowering:
    def __init__(self, p: Program, bound: dict[str, int], world_size: int, fused_chunks: int):
        self.p, self.bound, self.world_size, self.fused_chunks = p, bound, world_size, fused_chunks
        self.P = bound["P"]
        self.storage: dict[int, int] = {}  # value id -> buffer id
        self.buffers: dict[int, Buffer] = {}
        self.slices: dict[int, tuple[Value, int]] = {}  # slice value id -> (tensor, dim)
        self.next_step = 0

    def shape(self, t: TensorType) -> tuple[int, ...]:
        return tuple(d.evaluate(self.bound) for d in t.shape)

    def buffer(self, v: Value) -> int:
        """The buffer holding v, created on first use."""
        if v.id not in self.storage:
            t = v.type
            self.buffers[v.id] = Buffer(v.id, v.name, t.dtype, self.shape(t), t.layout, t.stage)
            self.storage[v.id] = v.id
        return self.storage[v.id]

    def step_id(self) -> int:
        self.next_step += 1
        return self.next_step - 1

    # -- accesses ---------------------------------------------------------------------------
    def access(
        self, value: Value, src: Value, loop: TensorType, slice_dim: Optional[int]
    ) -> Access:
        """How the loop reads `src` (stored in its buffer) as the kernel's operand `value`."""
        L, R = self.shape(loop), loop.rank
        shape = self.shape(src.type)
        strides_src = contiguous_strides(shape)
        strides, rank_stride = [0] * R, 0
        sliced_od = loop.layout.dim if isinstance(loop.layout, Sliced) else None
        for od in range(R):
            ad = od - (R - len(shape))
            if ad < 0 or shape[ad] == 1:
                continue
            strides[od] = strides_src[ad]
            reads_slice = (
                (slice_dim == ad)
                if slice_dim is not None
                else (od == sliced_od and isinstance(src.type.layout, Replicated))
            )
            if reads_slice and shape[ad] == L[od] * self.P:
                rank_stride += L[od] * strides_src[ad]
            elif shape[ad] != L[od]:
                raise BindError(
                    f"lowering: {src.name} of shape {shape} cannot be read in a loop of {L}"
                )
        return Access(value.id, self.buffer(src), tuple(strides), rank_stride)

    def global_index(self, t: TensorType) -> Access:
        L = self.shape(t)
        if isinstance(t.layout, Sliced):
            d = t.layout.dim
            G = L[:d] + (L[d] * self.P,) + L[d + 1 :]
            gs = contiguous_strides(G)
            return Access(-1, -1, gs, L[d] * gs[d])
        return Access(-1, -1, contiguous_strides(L), 0)

    # -- kernels ----------------------------------------------------------------------------
    def kernel(self, k: int, unit: _Unit, outside: dict[int, bool], absorbed: set[int]) -> Compute:
        inside = {s.out.id for s in unit.stmts}
        loop = unit.loop or TensorType(
            unit.stmts[0].out.type.dtype, (), Replicated(), unit.stmts[0].out.type.stage
        )
        reads: dict[int, Access] = {}
        scalars, writes, reduces, scalar_outs, dropout, body = set(), [], [], [], [], []
        for s in unit.stmts:
            if s.op == "slice":
                self.slices[s.out.id] = (s.args[0], s.attr("dim"))
                reads[s.out.id] = self.access(s.out, s.args[0], loop, s.attr("dim"))
                continue
            for a in s.values:
                if a.id in inside or a.id in reads:
                    continue
                if a.type.rank == 0 or (s.op == "take" and a is s.args[0]):
                    scalars.add(self.buffer(a))  # by value; a take's table whole
                elif a.id in self.slices:  # a slice taken in an earlier kernel: read it again
                    src, dim = self.slices[a.id]
                    reads[a.id] = self.access(a, src, loop, dim)
                else:
                    reads[a.id] = self.access(a, a, loop, None)
            body.append(s)
            if s.op in ACCUMULATED:
                reduces.append((s.out.id, self.buffer(s.out)))
            elif s.op == "update":
                writes.append((s.out.id, self.storage[s.out.id]))
            elif outside[s.out.id]:
                pair = (s.out.id, self.buffer(s.out))
                (scalar_outs if s.out.type.rank == 0 else writes).append(pair)
            if s.op == "dropout":
                dropout.append((s.out.id, self.global_index(s.out.type)))
        kern = Kernel(
            "",
            self.shape(loop),
            tuple(body),
            tuple(sorted(scalars)),
            tuple(reads.values()),
            tuple(writes),
            tuple(reduces),
            tuple(scalar_outs),
            tuple(dropout),
        )
        # the name says where the kernel comes from and, by a hash of its content, tells apart
        # kernels of other sizes and schedules built into the same module
        digest = hashlib.sha1(repr(kern).encode()).hexdigest()[:10]
        base = "".join(c if c.isalnum() else "_" for c in self.p.name)
        kern = replace(kern, name=f"{base}_k{k}_{digest}")
        n = kern.numel
        nbytes = sum(n * ITEMSIZE[self.buffers[a.buffer].dtype] for a in kern.reads)
        nbytes += sum(n * ITEMSIZE[self.buffers[b].dtype] for _, b in kern.writes)
        flops = n * sum(
            FLOPS_PER_ELEMENT.get(s.op, 1) for s in body if s.op != "update" and s.out.type.rank > 0
        )
        return Compute(self.step_id(), kern, loop.stage, nbytes, flops)

    def comm(self, s: Stmt) -> object:
        x = s.values[0]
        src, dst = self.buffer(x), self.buffer(s.out)
        if s.op == "p2p":
            return P2P(
                self.step_id(), src, dst, x.type.stage, s.attr("dst"), self.buffers[src].nbytes
            )
        full = self.buffers[dst] if s.op == "all_gather" else self.buffers[src]
        kept = ("op", "dim", "root", "split_dim", "concat_dim", "partial")
        attrs = {k: v for k, v in s.attrs if k in kept}
        return Collective(self.step_id(), s.op, src, dst, x.type.stage, full.nbytes, **attrs)

    def matmul(self, s: Stmt) -> MatMul:
        a, b = s.values
        sa, sb = self.shape(a.type), self.shape(b.type)
        m, k, n = prod(sa[:-1]), sa[-1], sb[-1]
        item = ITEMSIZE[a.type.dtype]
        return MatMul(
            self.step_id(),
            self.buffer(a),
            self.buffer(b),
            self.buffer(s.out),
            a.type.stage,
            m,
            k,
            n,
            (m * k + k * n + m * n) * item,
            2 * m * k * n,
        )

    def attention(self, s: Stmt) -> Attention:
        q, k, v = s.values
        S, B, E = self.shape(q.type)
        d = s.attr("head_dim")
        if E % d:
            raise ShapeError(f"attention's head_dim {d} does not divide the {E} columns")
        return Attention(
            self.step_id(),
            *(self.buffer(x) for x in (q, k, v, s.out)),
            q.type.stage,
            S,
            B,
            E,
            d,
            s.attr("mask", "none") == "causal",
            4 * S * B * E * ITEMSIZE[q.type.dtype],
            4 * S * S * B * E + FLOPS_PER_ELEMENT["softmax"] * S * S * B * (E // d),
        )


def _updates(p: Program, stmts: list[Stmt], units: list[_Unit], low: _Lowering):
    """Decide where each update writes: returns (absorbed update ids, final copies)."""
    unit_of = {s.out.id: i for i, u in enumerate(units) for s in u.stmts}
    producer = {s.out.id: s for s in stmts}
    absorbed, copies = set(), []
    for u in (s for s in stmts if s.op == "update"):
        target, v = u.args
        i = unit_of[u.out.id]
        later = any(
            unit_of[s.out.id] > i
            for s in stmts
            if target.id in {a.id for a in s.values} and s is not u
        )
        prod_v = producer.get(v.id)
        if later:  # readers of the old value follow: write a fresh buffer, copy at the end
            low.storage[u.out.id] = low.buffer(u.out)
            copies.append((low.storage[u.out.id], low.buffer(target)))
            continue
        low.storage[u.out.id] = low.buffer(target)
        single = [s for s in stmts if v.id in {a.id for a in s.values}] == [u]
        if (
            prod_v is not None
            and units[unit_of[v.id]].kind != "kernel"
            and single
            and not p.is_output(v.id)
        ):
            low.storage[v.id] = low.buffer(target)  # the collective writes the input in place
            absorbed.add(u.out.id)
    return absorbed, copies


def lower(
    p: Program, bindings: Optional[Mapping[str, int]], world_size: int, fused_chunks: int = 4
) -> Plan:
    P, bound = bind(p, world_size, bindings)
    check_chunks(p, bound)
    stmts, origin = _expand(p, bound)
    stmts = _sink_scalar_syncs(stmts)
    low = _Lowering(p, bound, world_size, fused_chunks)
    inputs = tuple((i.value.name, low.buffer(i.value)) for i in p.inputs)
    units = _partition(p, stmts, origin)
    absorbed, copies = _updates(p, stmts, units, low)
    for u in units:  # absorbed updates do no work
        u.stmts = [s for s in u.stmts if s.out.id not in absorbed]
    units = [u for u in units if u.stmts]
    unit_of = {s.out.id: i for i, u in enumerate(units) for s in u.stmts}
    outside = {s.out.id: p.is_output(s.out.id) for s in stmts}
    for s in stmts:
        for a in s.values:
            if a.id in unit_of and unit_of[a.id] != unit_of.get(s.out.id):
                outside[a.id] = True
    steps: list[tuple[_Unit, object]] = []
    for k, u in enumerate(units):
        if u.kind == "kernel":
            steps.append((u, low.kernel(k, u, outside, absorbed)))
        elif u.kind in LIBRARY:  # low.matmul, low.attention
            steps.append((u, getattr(low, u.kind)(u.stmts[0])))
        else:
            steps.append((u, low.comm(u.stmts[0])))
    final = _compose(p, steps, low, origin)
    final += [
        Copy(low.step_id(), s, d, low.buffers[d].stage, low.buffers[d].nbytes) for s, d in copies
    ]
    outputs = tuple((name, low.storage[v.id]) for name, v in p.outputs)
    return Plan(
        p.name,
        p.schedule,
        world_size,
        P,
        p.stages,
        tuple(sorted(bound.items())),
        tuple(low.buffers.values()),
        inputs,
        outputs,
        tuple(final),
        tuple((i.value.name, i.default) for i in p.inputs if i.default is not None),
    )


def _reads(step) -> set[int]:
    """The buffers a (non-composite) step reads."""
    if isinstance(step, Compute):
        return {a.buffer for a in step.kernel.reads} | set(step.kernel.scalars)
    if isinstance(step, MatMul):
        return {step.a, step.b}
    if isinstance(step, Attention):
        return {step.q, step.k, step.v}
    return {getattr(step, "src", -1)}


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, at_most) + 1) if n % d == 0)


def _compose(p: Program, steps, low: _Lowering, origin: dict[int, int]) -> list:
    """Group the steps of fused groups, then pair overlapped steps."""
    out: list = []
    step_of_stmt: dict[int, object] = {}
    i = 0
    while i < len(steps):
        u, st = steps[i]
        if u.group is None:
            out.append(st)
            for s in u.stmts:
                step_of_stmt[origin[s.out.id]] = st
            i += 1
            continue
        j = i
        while j < len(steps) and steps[j][0].group == u.group:
            j += 1
        members = [st for _, st in steps[i:j]]
        head = next(m for m in members if isinstance(m, (Collective, P2P)))
        n = low.buffers[head.dst].numel
        ov = [o for o in p.overlaps if p.group_of(o.consumer) is p.fused[u.group]]
        chunks = ov[0].chunks if ov else _largest_divisor(n, low.fused_chunks)
        fused = FusedCollective(low.step_id(), tuple(members), chunks)
        out.append(fused)
        for uu, _ in steps[i:j]:
            for s in uu.stmts:
                step_of_stmt[origin[s.out.id]] = fused
        i = j
    for o in p.overlaps:
        prod_step, cons_step = step_of_stmt[o.producer], step_of_stmt[o.consumer]
        k = out.index(cons_step)
        out[k] = Overlap(low.step_id(), prod_step, cons_step, o.chunks)
        out.remove(prod_step)
    for f in p.prefetches:
        gather, behind = step_of_stmt[f.gather], step_of_stmt[f.behind]
        if gather.dst in _reads(behind):
            raise ShapeError(f"prefetch(%{f.gather} behind %{f.behind}): that step reads it")
        out[out.index(behind)] = Prefetch(low.step_id(), gather, behind)
        out.remove(gather)

    return out
