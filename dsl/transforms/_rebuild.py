"""Shared machinery of the transforms: pick statements, re-emit a body with re-inferred types.

A transform walks the old body and emits a new one through `Rebuild`: `copy(stmt)` re-emits a
statement with its operands renamed through `env` (old value id -> new Value), `emit(...)` adds a
new statement. Types are always re-inferred, so a transform cannot produce an ill-typed program;
a rule that fails becomes a `TransformError` naming the statement at fault. `finish()` renames the
outputs, names the schedule and verifies the result.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from ..errors import DSLError, TransformError
from ..ir import Arg, Input, Program, Ref, Stmt, Value
from ..ops import Ctx, infer, is_combine
from ..printer import format_stmt
from ..verify import verify


def select(p: Program, ref: Optional[Ref], ops: Sequence[str], transform: str) -> Stmt:
    """The statement producing `ref`, or the only statement of kind in `ops` when ref is None."""
    if ref is None:
        found = [s for s in p.body if s.op in ops and not _scalar_sync(s)]
        if len(found) != 1:
            raise TransformError(
                f"{transform}: program {p.name} has {len(found)} statements of kind "
                f"{'/'.join(ops)}; name the one to transform"
            )
        return found[0]
    try:
        v = p.value(getattr(ref, "value", ref))  # a builder Tensor handle, a Value, an id or a name
    except KeyError as e:
        raise TransformError(f"{transform}: {e.args[0]}") from None
    s = p.producer(v.id)
    if s is None or s.op not in ops:
        shown = format_stmt(s) if s else f"input {v.name}"
        raise TransformError(f"{transform}: {shown}: expected a statement of kind {'/'.join(ops)}")
    return s


def _scalar_sync(s: Stmt) -> bool:
    """The combine step of a sliced reduction (`ops.is_combine`), part of a computation stage."""
    return is_combine(s)


def need_program(p: object, transform: str) -> None:
    """The first argument of every transform is a Program (not None, not a Builder)."""
    if not isinstance(p, Program):
        hint = "; call .build() first" if type(p).__name__ == "Builder" else ""
        raise TransformError(f"{transform}: expected a Program, got {p!r}{hint}")


def no_schedule(p: Program, transform: str) -> None:
    need_program(p, transform)
    if p.fused or p.overlaps or p.prefetches:
        raise TransformError(
            f"{transform}: program {p.name} is already fused, overlapped or prefetched; "
            "apply fuse, overlap and prefetch last"
        )


class Rebuild:
    def __init__(self, p: Program, transform: str):
        self.p, self.transform = p, transform
        self.next_id = p.fresh_id()
        self.names = {v.name for v in p.values()}
        self.body: list[Stmt] = []
        self.env: dict[int, Value] = {}
        self.inputs: list[Input] = list(p.inputs)
        self.memo: dict = {}  # for a transform's own caches (e.g. one slice per tensor)

    def arg(self, a: Arg) -> Arg:
        return self.env.get(a.id, a) if isinstance(a, Value) else a

    def _name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}.{k}", k + 1
        self.names.add(name)
        return name

    def emit(
        self,
        op: str,
        args: Sequence[Arg],
        attrs: Iterable[tuple[str, object]] = (),
        name: str = "t",
        like: Optional[Stmt] = None,
    ) -> Value:
        attrs = tuple(attrs)
        types = [a.type if isinstance(a, Value) else a for a in args]
        try:
            t = infer(op, types, dict(attrs), Ctx(self.p.stages))
        except DSLError as e:
            at = format_stmt(like) if like is not None else f"{op}({', '.join(map(str, args))})"
            raise TransformError(f"{self.transform}: {at}: {e}") from None
        if like is not None and like.out.type == t:
            out = like.out if tuple(args) == like.args else Value(like.out.id, like.out.name, t)
        elif like is not None:  # the old value is replaced: its name moves to the new one
            out = Value(self.next_id, like.out.name, t)
            self.next_id += 1
        else:
            out = Value(self.next_id, self._name(name), t)
            self.next_id += 1
        self.body.append(Stmt(out, op, tuple(args), attrs))
        return out

    def copy(self, s: Stmt) -> Value:
        v = self.emit(s.op, [self.arg(a) for a in s.args], s.attrs, s.out.name, like=s)
        self.env[s.out.id] = v
        return v

    def finish(self, suffix: str = "") -> Program:
        from .naming import schedule_name

        outputs = tuple((n, self.env.get(v.id, v)) for n, v in self.p.outputs)
        q = self.p.with_(inputs=tuple(self.inputs), body=tuple(self.body), outputs=outputs)
        return verified(q.with_(schedule=schedule_name(q)), self.transform)


def verified(q: Program, transform: str) -> Program:
    """q after `verify` (every transform's result is re-checked); a TransformError naming the
    transform when it is not a valid program."""
    try:
        verify(q)
    except DSLError as e:
        raise TransformError(f"{transform} produced an invalid program: {e}") from None
    return q
