"""`as_slice(program, name)`: keep a replicated input (e.g. optimizer state) only as slices.

ZeRO-style: the input becomes Sliced(d); statements that read it as a slice are unchanged, a
`slice(x)` of it becomes the input itself, and `update(x, all_gather(v))` becomes `update(x, v)`,
dropping the all_gather when nothing else uses it.

Preconditions: the input is Replicated and not a 0-d hyper-parameter; every use reads it as a slice
(a pointwise statement with a Sliced result, a `slice`, or an update from an all_gather), all along
the same dimension; the program is not yet fused or overlapped.
"""

from __future__ import annotations

from ..errors import TransformError
from ..ir import Input, Program, Stmt, Value
from ..ops import POINTWISE
from ..printer import format_stmt
from ..sizes import P
from ..types import Replicated, Sliced
from ._rebuild import Rebuild, no_schedule


def _slice_dim(p: Program, x: Value, s: Stmt) -> int:
    """The dimension of x that statement s reads as a slice, or TransformError."""
    out = s.out.type
    if s.op in POINTWISE and isinstance(out.layout, Sliced):
        d = out.layout.dim - (out.rank - x.type.rank)
        if d >= 0 and x.type.shape[d] != 1:
            return d
    if s.op == "slice":
        return s.attr("dim", 0)
    if s.op == "update" and s.args[0].id == x.id:
        src = p.producer(s.args[1].id) if isinstance(s.args[1], Value) else None
        if src is not None and src.op == "all_gather":
            return src.args[0].type.layout.dim
    raise TransformError(
        f"as_slice: {format_stmt(s)}: needs the full tensor {x.name}; "
        "reorder the computation onto slices first"
    )


def as_slice(p: Program, name: str) -> Program:
    no_schedule(p, "as_slice")
    if not isinstance(name, str):
        raise TransformError(
            f"as_slice: the input to keep as slices is named by a string, got {name!r}"
        )
    try:
        inp = p.input(name)
    except KeyError:
        raise TransformError(f"as_slice: program {p.name} has no input {name!r}") from None
    x = inp.value
    if not isinstance(x.type.layout, Replicated) or x.type.rank == 0:
        raise TransformError(f"as_slice: input {name}: {x.type} is not a replicated tensor")
    uses = p.users(x.id)
    dims = {_slice_dim(p, x, s) for s in uses}
    if len(dims) != 1:
        raise TransformError(
            f"as_slice: input {name} is read as slices along {sorted(dims) or 'no'} "
            "dimensions; need exactly one"
        )
    d = dims.pop()
    shape = x.type.shape[:d] + (x.type.shape[d] / P,) + x.type.shape[d + 1 :]
    new_x = Value(x.id, x.name, x.type.__class__(x.type.dtype, shape, Sliced(d), x.type.stage))
    r = Rebuild(p, "as_slice")
    r.inputs = [Input(new_x, i.default, i.init) if i is inp else i for i in p.inputs]
    r.env[x.id] = new_x
    updates = [s for s in uses if s.op == "update"]
    gathers = {u.args[1].id: p.producer(u.args[1].id) for u in updates}
    for s in p.body:
        if s.out.id in gathers and len(p.users(s.out.id)) == 1 and not p.is_output(s.out.id):
            continue  # the all_gather only re-replicated x: dropped
        if s in updates:  # update(x, allgather(v)) -> update(x, v)
            v = r.arg(gathers[s.args[1].id].args[0])
            r.env[s.out.id] = r.emit("update", [new_x, v], (), s.out.name, like=s)
        elif s.op == "slice" and s.args[0].id == x.id:
            r.env[s.out.id] = new_x  # slice(x) -> x
        else:
            r.copy(s)
    return r.finish()
