"""`verify(program)`: the program is well formed and every recorded type is what the rules infer.

Checks: unique ids and names; every argument defined before use (SSA order); every statement's
type re-inferred and equal to the recorded one; updates write program inputs, once each; outputs
name defined values; fused groups, overlaps and prefetches refer to statements of the body, groups do not
overlap, chunk counts are >= 1. Run after every transform in tests. Raises a `DSLError` subclass.
"""

from __future__ import annotations

from .errors import DSLError, ShapeError, TransformError
from .ir import Program, Value
from .ops import Ctx, infer
from .printer import format_stmt


def verify(p: Program) -> None:
    seen: dict[int, Value] = {}
    names: set[str] = set()
    for v in p.values():
        if v.id in seen or v.name in names:
            raise ShapeError(f"program {p.name}: value %{v.id} ({v.name}) is defined twice")
        seen[v.id], _ = v, names.add(v.name)
    defined = {i.value.id for i in p.inputs}
    input_ids = set(defined)
    updated: set[int] = set()
    ctx = Ctx(p.stages)
    for s in p.body:
        for a in s.values:
            if a.id not in defined or seen[a.id] != a:
                raise ShapeError(f"{format_stmt(s)}: operand %{a.id} is used before it is defined")
        if s.op == "update":
            target = s.args[0]
            if target.id not in input_ids or target.id in updated:
                raise ShapeError(f"{format_stmt(s)}: update must write a program input, once")
            updated.add(target.id)
        try:
            t = infer(
                s.op, [a.type if isinstance(a, Value) else a for a in s.args], dict(s.attrs), ctx
            )
        except DSLError as e:
            raise type(e)(f"{format_stmt(s)}: {e}") from None
        if t != s.out.type:
            raise ShapeError(f"{format_stmt(s)}: recorded type differs from the inferred {t}")
        defined.add(s.out.id)
    for name, v in p.outputs:
        if v.id not in defined:
            raise ShapeError(f"output {name} refers to undefined %{v.id}")
    body_ids = [s.out.id for s in p.body]
    grouped: set[int] = set()
    for g in p.fused:
        if not g.ids or not set(g.ids) <= set(body_ids) or grouped & set(g.ids):
            raise TransformError(
                f"fused group {g.ids} names statements not in the body or in two groups"
            )
        grouped |= set(g.ids)
    for o in p.overlaps:
        if o.producer not in body_ids or o.consumer not in body_ids or o.chunks < 1:
            raise TransformError(f"overlap {o} refers to unknown statements or has chunks < 1")
    for f in p.prefetches:
        if f.gather not in body_ids or f.behind not in body_ids:
            raise TransformError(f"prefetch {f} refers to unknown statements")
