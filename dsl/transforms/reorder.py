"""`reorder(program, at=None)`: move computation across a communication statement.

Rules, keyed by the kind of the statement `at` names:

- all_gather g = all_gather(s), s Sliced(d): the pointwise computation that consumes g (directly
  or through other such computation) moves before the gather and runs on slices:
      f(allgather(s), r) -> allgather(f(s, slice(r)))
  Replicated operands are read as their slice. A row op (softmax, layer_norm) moves too when the
  gathered dimension is not its last one (its rows are whole on every rank; sequence parallelism):
      layer_norm(allgather(s)) -> allgather(layer_norm(s))      (s Sliced(d), d not last)
  A reduction to a scalar (LAMB's norms) of a moved
  value, or of a replicated tensor whose result feeds moved computation, becomes a partial
  reduction of the slice followed by an all_reduce of the partials:
      norm(x) -> sqrt(allreduce(sum(x_s * x_s)));  sum(x) -> allreduce(sum(x_s));
      mean(x) -> allreduce(sum(x_s)) / numel(x)
  New all_gathers are placed just before the first statement that needs a full tensor (a matmul,
  an update, an output, ...).
- p2p y' = p2p(y): the computation and all_gathers that produce y (back to the last other
  collective or input) move after the transfer and run on the receiving stage; what they read on
  the sending stage is sent instead:
      p2p(f(allgather(s))) -> f(allgather(p2p(s)))
  Operands that live on every stage (stage None) are read where they are.

Preconditions: `at` is an all_gather or p2p (or the program has exactly one); there is something
to move; a moved value is not used elsewhere (p2p); an operand cannot be sliced (a Local operand
meeting a slice) -> TransformError naming the statement.
"""

from __future__ import annotations

from typing import Optional

from ..errors import TransformError
from ..ir import Const, Program, Ref, Stmt, Value
from ..ops import POINTWISE, REDUCE, ROW, SEGMENT
from ..printer import format_stmt
from ..sizes import Size
from ..types import Replicated, Sliced
from ._rebuild import Rebuild, no_schedule, select

MOVABLE = POINTWISE + REDUCE + SEGMENT
REDUCTIONS = REDUCE + ("segment_sum",)  # of a slice: partials, then an all_reduce


def _numel(v: Value) -> Size:
    n = Size.of(1)
    for s in v.type.shape:
        n = n * s
    return n


def _movable_after_gather(p: Program, g: Stmt) -> set[int]:
    """Ids of the statements that move onto slices."""
    tainted, moved = {g.out.id}, set()
    d = g.args[0].type.layout.dim
    for s in p.body:
        whole_rows = s.op in ROW and s.out.type.rank == g.out.type.rank and d != s.out.type.rank - 1
        if (s.op in MOVABLE or whole_rows) and any(a.id in tainted for a in s.values):
            tainted.add(s.out.id)
            moved.add(s.out.id)
    _replicated_users(p, g, moved)
    # reductions of replicated tensors whose results feed moved computation
    d = g.args[0].type.layout.dim
    for s in p.body:
        x = s.args[0]
        if (
            s.op in REDUCTIONS
            and s.out.id not in moved
            and isinstance(x.type.layout, Replicated)
            and x.type.rank > d
            and _feeds(p, s, moved)
        ):
            moved.add(s.out.id)
    _replicated_users(p, g, moved)  # what those reductions read (segment_sum(w * w, seg))
    return moved


def _feeds(p: Program, s: Stmt, moved: set[int]) -> bool:
    """A user of s moves (of a segment_sum: any statement after it, through its [nseg] values)."""
    users, seen = list(p.users(s.out.id)), set()
    while users:
        u = users.pop()
        if u.out.id in moved:
            return True
        if s.op == "segment_sum" and u.out.id not in seen:
            seen.add(u.out.id)
            users += p.users(u.out.id)
    return False


def _replicated_users(p: Program, g: Stmt, moved: set[int]) -> None:
    """Replicated pointwise computation used only by moved computation moves too (b1 * m)."""
    full_shape, changed = g.out.type.shape, True
    while changed:
        changed = False
        for s in p.body:
            users = p.users(s.out.id)
            if (
                s.op in POINTWISE
                and s.out.id not in moved
                and s.out.type.shape == full_shape
                and isinstance(s.out.type.layout, Replicated)
                and not p.is_output(s.out.id)
                and users
                and all(u.out.id in moved for u in users)
            ):
                moved.add(s.out.id)
                changed = True


def _sliced_reduction(r: Rebuild, s: Stmt, xs: Value) -> Value:
    name = s.out.name
    if s.op == "norm":
        xs = r.emit("mul", [xs, xs], (), f"{name}.sq")
    part = r.emit("sum", [xs], (), f"{name}.part")
    if s.op == "sum":
        return r.emit("all_reduce", [part], (("op", "sum"),), name, like=s)
    total = r.emit("all_reduce", [part], (("op", "sum"),), f"{name}.total")
    if s.op == "norm":
        return r.emit("sqrt", [total], (), name, like=s)
    return r.emit("div", [total, Const(_numel(s.args[0]))], (), name, like=s)  # mean


def _sliced_operand(r: Rebuild, sliced: dict[int, Value], a, d: int, rank: int):
    """The operand of a moved statement: its slice when it has one or can be sliced along the
    gathered dimension (aligned to the right, as broadcasting does), else itself."""
    if not isinstance(a, Value):
        return a
    if a.id in sliced:
        return sliced[a.id]
    new = r.arg(a)
    ad = d - (rank - new.type.rank)
    if (
        isinstance(new.type.layout, Replicated)
        and 0 <= ad < new.type.rank
        and new.type.shape[ad] != Size.of(1)
    ):
        return _slice_of(r, new, ad)
    return new


def _slice_of(r: Rebuild, x: Value, dim: int) -> Value:
    """slice(x, dim), emitted once per (x, dim)."""
    cache = r.memo
    if (x.id, dim) not in cache:
        cache[(x.id, dim)] = r.emit("slice", [x], (("dim", dim),), f"{x.name}.s")  # r -> slice(r)
    return cache[(x.id, dim)]


def _deferred(p: Program, g: Stmt, moved: set[int]) -> set[int]:
    """Statements between the gather and the last moved statement that need a full tensor the
    move slices (or a deferred result) and that no moved statement needs: they move after the
    moved computation, so its all_gathers come together at the end."""
    needed: set[int] = set()
    for s in reversed(p.body):
        if s.out.id in moved or s.out.id in needed:
            needed |= {a.id for a in s.values}
    k0 = p.body.index(g)
    last = max(k for k, s in enumerate(p.body) if s.out.id in moved)
    changed, deferred = moved | {g.out.id}, set()
    for s in p.body[k0 + 1 : last]:
        if (
            s.out.id not in moved
            and s.out.id not in needed
            and any(a.id in changed or a.id in deferred for a in s.values)
        ):
            deferred.add(s.out.id)
    return deferred


def _reorder_gather(p: Program, g: Stmt) -> Program:
    moved = _movable_after_gather(p, g)
    if not moved:
        raise TransformError(f"reorder: {format_stmt(g)}: no pointwise computation consumes it")
    d = g.args[0].type.layout.dim
    r = Rebuild(p, "reorder")
    sliced: dict[int, Value] = {}  # old id -> its slice in the new program

    def full(a):
        if isinstance(a, Value) and a.id in sliced and a.id not in r.env:
            r.env[a.id] = r.emit("all_gather", [sliced[a.id]], (), f"{a.name}.ag")
        return r.arg(a)

    def emit_moved(s: Stmt) -> None:
        if s.op in REDUCTIONS:
            xs, segs = (sliced.get(a.id) or _slice_of(r, r.arg(a), d) for a in (s.args * 2)[:2])
            if s.op != "segment_sum":
                r.env[s.out.id] = _sliced_reduction(r, s, xs)
                return
            # segment_sum(x, seg) -> all_reduce[partial](segment_sum(x.s, seg.s))
            part = r.emit("segment_sum", [xs, segs], s.attrs, f"{s.out.name}.part")
            marked = (("op", "sum"), ("partial", True))
            r.env[s.out.id] = r.emit("all_reduce", [part], marked, s.out.name, like=s)
            return
        if s.out.type.rank and s.out.type.shape != g.out.type.shape and s.op != "take":
            args = [r.arg(a) for a in s.args]  # per-segment values ([nseg]) stay whole
        elif s.op == "take":  # the table whole, the ids sliced
            args = [r.arg(s.args[0]), _sliced_operand(r, sliced, s.args[1], d, 1)]
        else:
            args = [_sliced_operand(r, sliced, a, d, s.out.type.rank) for a in s.args]
        v = r.emit(s.op, args, s.attrs, f"{s.out.name}.s", like=s)
        (sliced if isinstance(v.type.layout, Sliced) else r.env)[s.out.id] = v

    deferred = _deferred(p, g, moved)
    last = max(k for k, s in enumerate(p.body) if s.out.id in moved)
    for k, s in enumerate(p.body):
        if s is g:
            sliced[g.out.id] = r.arg(g.args[0])
        elif s.out.id in moved:
            emit_moved(s)
        elif s.out.id not in deferred:
            r.env[s.out.id] = r.emit(s.op, [full(a) for a in s.args], s.attrs, s.out.name, like=s)
        if k == last:  # the statements that need full tensors follow the moved computation
            for t in p.body:
                if t.out.id in deferred:
                    r.env[t.out.id] = r.emit(
                        t.op, [full(a) for a in t.args], t.attrs, t.out.name, like=t
                    )
    for _, v in p.outputs:
        full(v)
    return r.finish()


def _chain_before_send(p: Program, send: Stmt) -> list[Stmt]:
    """The computation and all_gathers producing the sent value, in body order."""
    chain: dict[int, Stmt] = {}
    todo = [send.args[0]]
    while todo:
        v = todo.pop()
        s = p.producer(v.id)
        if s is None or s.out.id in chain or not (s.op in MOVABLE or s.op == "all_gather"):
            continue
        chain[s.out.id] = s
        todo.extend(s.values)
    return [s for s in p.body if s.out.id in chain]


def _reorder_send(p: Program, send: Stmt) -> Program:
    chain = _chain_before_send(p, send)
    if not chain:
        raise TransformError(
            f"reorder: {format_stmt(send)}: no computation or all_gather produces "
            "the sent tensor; nothing to move"
        )
    ids = {s.out.id for s in chain} | {send.out.id}
    for s in chain:
        outside = [u for u in p.users(s.out.id) if u.out.id not in ids]
        if outside or p.is_output(s.out.id):
            at = format_stmt(outside[0]) if outside else f"output {s.out.name}"
            raise TransformError(
                f"reorder: {format_stmt(s)}: also used by {at}; cannot move it past the send"
            )
    dst = send.attr("dst")
    r = Rebuild(p, "reorder")
    for s in p.body:
        if s.out.id in ids and s is not send:
            continue
        if s is not send:
            r.copy(s)
            continue
        leaves = [a for c in chain for a in c.values if a.id not in ids]
        for v in dict.fromkeys(leaves):  # send what the moved computation reads on this stage
            if v.type.stage is not None:
                r.env[v.id] = r.emit("p2p", [r.arg(v)], (("dst", dst),), f"{v.name}.p2p")
        for c in chain:
            r.copy(c)
        r.env[send.out.id] = r.env[send.args[0].id]
    return r.finish()


RULES = {"all_gather": _reorder_gather, "p2p": _reorder_send}


def reorder(p: Program, at: Optional[Ref] = None) -> Program:
    no_schedule(p, "reorder")
    s = select(p, at, tuple(RULES), "reorder")
    return RULES[s.op](p, s)
