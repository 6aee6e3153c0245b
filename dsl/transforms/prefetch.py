"""`prefetch(program, gather, behind=None)`: start an all-gather early, at once with an earlier
statement that does not need it (FSDP's layer-ahead all-gather: the next layer's weights gathered
while this layer computes).

The all-gather is issued just before `behind` (by default the statement just before it in the
body) and runs with it; its result is waited for after `behind`, before its first user. The
program's statements and their order of meaning do not change, only when the gather's transfer
happens, so every result is bit for bit the same.

Preconditions (a `TransformError` naming the statement at fault): `gather` is an all_gather and
`behind` a library computation (a matmul, an attention: a layer's compute; not a collective, as
two collectives on one communicator do not run at once, and not a pointwise statement, which the
lowering may put in one kernel with the gather's users); `behind` comes before the gather; the gather's
operand is defined before `behind` (an input, or computed earlier), so that it can start there;
neither is already prefetched, overlapped or in a fused group.
"""

from __future__ import annotations

from typing import Optional

from ..errors import TransformError
from ..ir import Prefetch, Program, Ref
from ..ops import LIBRARY
from ..printer import format_stmt
from ._rebuild import need_program, select, verified
from .naming import schedule_name


def prefetch(p: Program, gather: Ref, behind: Optional[Ref] = None) -> Program:
    need_program(p, "prefetch")
    g = select(p, gather, ("all_gather",), "prefetch")
    order = [s.out.id for s in p.body]
    at = order.index(g.out.id)
    if behind is None:
        if at == 0:
            raise TransformError(f"prefetch: {format_stmt(g)}: no statement before it")
        b = p.body[at - 1]
    else:
        try:
            b = p.producer(p.value(getattr(behind, "value", behind)).id)
        except KeyError as e:
            raise TransformError(f"prefetch: {e.args[0]}") from None
        if b is None:
            raise TransformError(f"prefetch: behind {behind!r} is an input, not a statement")
    where = f"prefetch: {format_stmt(g)} behind {format_stmt(b)}"
    if b.op not in LIBRARY:
        raise TransformError(
            f"{where}: it runs behind a library computation ({'/'.join(LIBRARY)}), not {b.op}"
            " (a pointwise statement may share a kernel with the gather's users)"
        )
    if order.index(b.out.id) >= at:
        raise TransformError(f"{where}: the statement it runs behind must come before it")
    source = g.values[0].id
    if source in order and order.index(source) >= order.index(b.out.id):
        raise TransformError(
            f"{where}: its operand is computed at or after that statement, so it cannot start there"
        )
    taken = {i for o in p.overlaps for i in (o.producer, o.consumer)}
    taken |= {i for f in p.prefetches for i in (f.gather, f.behind)}
    taken |= {i for grp in p.fused for i in grp.ids}
    if g.out.id in taken or b.out.id in taken:
        raise TransformError(f"{where}: already prefetched, overlapped or fused")
    q = p.with_(prefetches=p.prefetches + (Prefetch(g.out.id, b.out.id),))
    return verified(q.with_(schedule=schedule_name(q)), "prefetch")
