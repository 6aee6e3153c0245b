"""`split(program, at=None, dim=0)`: all_reduce(x) -> all_gather(reduce_scatter(x, dim)).

Preconditions: `at` names an all_reduce (or the program has exactly one that is not 0-d); the
tensor has a dimension `dim` to scatter along; the program is not yet fused or overlapped.
"""

from __future__ import annotations

from typing import Optional

from ..errors import TransformError
from ..ir import Program, Ref
from ..printer import format_stmt
from ._rebuild import Rebuild, no_schedule, select


def split(p: Program, at: Optional[Ref] = None, dim: int = 0) -> Program:
    no_schedule(p, "split")
    target = select(p, at, ("all_reduce",), "split")
    if target.out.type.rank == 0:
        raise TransformError(
            f"split: {format_stmt(target)}: a 0-d all_reduce has nothing to scatter"
        )
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < target.out.type.rank:
        raise TransformError(f"split: {format_stmt(target)}: dim {dim!r} is out of range")
    r = Rebuild(p, "split")
    for s in p.body:
        if s is not target:
            r.copy(s)
            continue
        # allreduce(x) -> allgather(reducescatter(x))
        x = r.arg(s.args[0])
        rs = r.emit(
            "reduce_scatter", [x], (("op", s.attr("op", "sum")), ("dim", dim)), f"{s.out.name}.rs"
        )
        r.env[s.out.id] = r.emit("all_gather", [rs], (), f"{s.out.name}.ag")
    return r.finish()
