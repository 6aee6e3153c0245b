"""The IR: a program is inputs, a flat list of SSA statements, outputs, and schedule annotations.

Everything here is a frozen dataclass; transforms build new programs, never mutate old ones.

- `Value`: an SSA value (unique `id`, unique `name`, `TensorType`).
- `Const`: a scalar literal argument; its value is a number or a symbolic `Size` (e.g. `1/P`).
- `Stmt`: `out = op[attrs](args)`; `op` is a kind from `dsl.ops`.
- `Input`: a program input; `default` makes it a scalar hyper-parameter (lr, beta1, step, ...),
  `init` says how `check_equivalent` draws random contents ("normal", "positive").
- `Fuse`: statements (by out id) that run as one fused stage; with a collective in it, a fused
  collective (the computation runs on each reduced chunk).
- `Overlap`: a producer statement and its consumer (a communication statement, or the fused group
  that starts with it) pipelined over `chunks` chunks.
- `Prefetch`: an all-gather started before an earlier statement (`behind`) that does not need it
  and run at once with it (FSDP's layer-ahead all-gather of the next layer's weights).
- `Program.outputs`: (name, value) pairs; an `update` of input `w` makes an output named `w`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

from .sizes import Size
from .types import TensorType


@dataclass(frozen=True)
class Value:
    id: int
    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.id}"


@dataclass(frozen=True)
class Const:
    value: Union[float, int, Size]

    def __str__(self) -> str:
        return str(self.value)


Arg = Union[Value, Const]


@dataclass(frozen=True)
class Stmt:
    out: Value
    op: str
    args: tuple[Arg, ...]
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, key: str, default: object = None) -> object:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def values(self) -> tuple[Value, ...]:
        """The Value arguments (constants left out)."""
        return tuple(a for a in self.args if isinstance(a, Value))

    def __str__(self) -> str:
        from .printer import format_stmt

        return format_stmt(self)


@dataclass(frozen=True)
class Input:
    value: Value
    default: Optional[float] = None
    init: str = "normal"


@dataclass(frozen=True)
class Fuse:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Overlap:
    producer: int
    consumer: int
    chunks: int


@dataclass(frozen=True)
class Prefetch:
    gather: int
    behind: int


@dataclass(frozen=True)
class Program:
    name: str
    inputs: tuple[Input, ...]
    body: tuple[Stmt, ...]
    outputs: tuple[tuple[str, Value], ...]
    stages: int = 1
    fused: tuple[Fuse, ...] = ()
    overlaps: tuple[Overlap, ...] = ()
    prefetches: tuple[Prefetch, ...] = ()
    schedule: str = ""  # the paper's name of this schedule, set by the transforms that made it

    # -- lookups ----------------------------------------------------------------------------
    def input(self, name: str) -> Input:
        for i in self.inputs:
            if i.value.name == name:
                return i
        raise KeyError(name)

    def values(self) -> Iterator[Value]:
        for i in self.inputs:
            yield i.value
        for s in self.body:
            yield s.out

    def value(self, ref: "Ref") -> Value:
        """The value named, numbered or given by `ref`."""
        for v in self.values():
            if v is ref or v.id == ref or v.name == ref:
                return v
        raise KeyError(f"program {self.name} has no value {ref!r}")

    def producer(self, value_id: int) -> Optional[Stmt]:
        for s in self.body:
            if s.out.id == value_id:
                return s
        return None

    def users(self, value_id: int) -> list[Stmt]:
        return [s for s in self.body if any(v.id == value_id for v in s.values)]

    def is_output(self, value_id: int) -> bool:
        return any(v.id == value_id for _, v in self.outputs)

    def group_of(self, stmt_id: int) -> Optional[Fuse]:
        for g in self.fused:
            if stmt_id in g.ids:
                return g
        return None

    def fresh_id(self) -> int:
        return 1 + max((v.id for v in self.values()), default=-1)

    def fresh_name(self, base: str) -> str:
        taken = {v.name for v in self.values()}
        if base not in taken:
            return base
        k = 1
        while f"{base}.{k}" in taken:
            k += 1
        return f"{base}.{k}"

    def with_(self, **changes) -> "Program":
        return replace(self, **changes)

    def __str__(self) -> str:
        from .printer import format_program

        return format_program(self)


Ref = Union[Value, int, str]
