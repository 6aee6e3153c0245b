"""`fuse(program, first=None, last=None, stmts=None)`: run statements as one fused stage.

The statements are a contiguous range of the body (`first`..`last`, by default from the first
communication statement to the end) or an explicit list `stmts`. With a collective among them the
group is a fused collective: the computation runs on each chunk as soon as the collective delivers
it. Allowed communication in one group (0-d all_reduces, the combine steps of sliced reductions,
do not count): one collective; or one reduce_scatter with the all_gathers of what was computed from
it (a fused all-reduce, `fuse(RS-C-AG)`); or one p2p with all_gathers (`fuse(P2P-C-AG)`).

Preconditions (else TransformError naming the statement): the statements exist and are not already
fused; no matmul (overlap it instead); no row op (softmax, layer_norm: a kernel of its own); at most one collective as above; no cycle through a
statement outside the group (a member depending on an outside statement that depends on a member).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional, Sequence

from ..errors import TransformError
from ..ir import Fuse, Program, Ref, Stmt
from ..ops import COMM, LIBRARY, ROW, is_combine
from ..printer import format_stmt
from ._rebuild import need_program, verified
from .naming import schedule_name


def _range(p: Program, first: Optional[Ref], last: Optional[Ref]) -> list[Stmt]:
    ids = [s.out.id for s in p.body]

    def index(ref, default):
        if ref is None:
            return default
        try:
            return ids.index(p.value(getattr(ref, "value", ref)).id)
        except (KeyError, ValueError):
            raise TransformError(f"fuse: {ref!r} is not a statement of {p.name}") from None

    comm = [k for k, s in enumerate(p.body) if s.op in COMM]
    i = index(first, comm[0] if comm else 0)
    j = index(last, len(ids) - 1)
    if j < i:
        raise TransformError(
            f"fuse: {format_stmt(p.body[j])} comes before {format_stmt(p.body[i])}"
        )
    return list(p.body[i : j + 1])


def _check_comm(members: list[Stmt]) -> None:
    comm = [s for s in members if s.op in COMM and not is_combine(s)]
    kinds = [s.op for s in comm]
    heads = [s for s in comm if s.op != "all_gather"]
    ok = (
        len(comm) <= 1
        or (len(heads) == 1 and heads[0].op in ("reduce_scatter", "p2p") and heads[0] is comm[0])
        or (not heads)
    )
    if not ok:
        raise TransformError(
            f"fuse: more than one collective in one group ({', '.join(kinds)}); at "
            f"{format_stmt(comm[1])}"
        )


def _check_cycle(p: Program, members: list[Stmt]) -> None:
    inside = {s.out.id for s in members}
    after_member: set[int] = set(inside)  # values that depend on a member
    for s in p.body:
        if s.out.id in inside:
            outside_deps = [a for a in s.values if a.id in after_member and a.id not in inside]
            if outside_deps:
                raise TransformError(
                    f"fuse: {format_stmt(s)}: depends on %{outside_deps[0].id}, "
                    "outside the group, which depends on the group: a cycle"
                )
        elif any(a.id in after_member for a in s.values):
            after_member.add(s.out.id)


def fuse(
    p: Program,
    first: Optional[Ref] = None,
    last: Optional[Ref] = None,
    stmts: Optional[Sequence[Ref]] = None,
) -> Program:
    need_program(p, "fuse")
    if stmts is not None and (isinstance(stmts, (str, bytes)) or not isinstance(stmts, Iterable)):
        raise TransformError(f"fuse: stmts must be a list of statements, got {stmts!r}")
    if stmts is not None:
        try:
            ids = {p.value(getattr(r, "value", r)).id for r in stmts}
        except KeyError as e:
            raise TransformError(f"fuse: {e.args[0]}") from None
        members = [s for s in p.body if s.out.id in ids]
        if len(members) != len(ids):
            raise TransformError("fuse: only statements can be fused, not inputs")
    else:
        members = _range(p, first, last)
    if len(members) < 2:
        raise TransformError(f"fuse: {len(members)} statement(s) selected; nothing to fuse")
    prefetched = {i for f in p.prefetches for i in (f.gather, f.behind)}
    for s in members:
        if p.group_of(s.out.id) is not None:
            raise TransformError(f"fuse: {format_stmt(s)}: already fused")
        if s.out.id in prefetched:
            raise TransformError(f"fuse: {format_stmt(s)}: prefetched; fuse first, then prefetch")
        if s.op in LIBRARY:
            raise TransformError(
                f"fuse: {format_stmt(s)}: a {s.op} is a library call, not fused; overlap it instead"
            )
        if s.op in ROW:
            raise TransformError(
                f"fuse: {format_stmt(s)}: {s.op} works on whole rows in a kernel of its own;"
                " fuse the statements before or after it"
            )
    _check_comm(members)
    _check_cycle(p, members)
    # members become contiguous: outside statements between them that do not depend on a member
    # move before the group (the cycle check guarantees none of them does)
    ids = {s.out.id for s in members}
    start = p.body.index(members[0])
    stop = p.body.index(members[-1])
    between = [s for s in p.body[start : stop + 1] if s.out.id not in ids]
    body = p.body[:start] + tuple(between) + tuple(members) + p.body[stop + 1 :]
    q = p.with_(body=body, fused=p.fused + (Fuse(tuple(s.out.id for s in members)),))
    return verified(q.with_(schedule=schedule_name(q)), "fuse")
