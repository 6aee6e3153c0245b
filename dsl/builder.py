"""The surface users write programs with: a `Builder` and the `Tensor` handles it returns.

    b = Builder("adam")
    N = sym("N")
    g = b.input("g", f32, [N], Local())
    w = b.input("w", f32, [N], Replicated())
    lr = b.param("lr", 1e-3)
    g = b.all_reduce(g)
    b.update(w, w - lr * g)
    program = b.build()

Handles support + - * / ** unary -, < <= > >= and methods for everything else. Each op is
checked when it is written: a bad shape, layout or dtype raises at that line with the statement's
printed form. There is no global "current program": every handle knows its builder. Arguments are
checked where they are given: a name that is not an identifier (dots allowed: `m.next`), a
hyper-parameter default or constant that is not a finite number, a bool where an operation wants
a number (a root, a seed, a dim), a dtype or layout given as a
string, a `Sliced(d)` beyond the tensor's rank, a dimension that is not a positive size, an unknown
`init`, a hyper-parameter default that is not a number, a target or output that is not a tensor of
this builder each raise a one-line `DSLError` subclass naming the argument.
"""

from __future__ import annotations

import math
import re
from typing import Optional, Sequence, Union

from .errors import ArgumentError, DSLError, ShapeError
from .ir import Const, Input, Program, Stmt, Value
from .ops import Ctx, infer
from .printer import _attr
from .sizes import Size, SizeLike
from .types import DType, Layout, Local, Replicated, TensorType, _is_int, f32
from .verify import verify

Operand = Union["Tensor", float, int, Size]


class Tensor:
    """A handle on a Value of the program being built."""

    def __init__(self, builder: "Builder", value: Value):
        self.b, self.value = builder, value

    @property
    def type(self) -> TensorType:
        return self.value.type

    def __add__(self, o):
        return self.b.op("add", self, o)

    def __radd__(self, o):
        return self.b.op("add", o, self)

    def __sub__(self, o):
        return self.b.op("sub", self, o)

    def __rsub__(self, o):
        return self.b.op("sub", o, self)

    def __mul__(self, o):
        return self.b.op("mul", self, o)

    def __rmul__(self, o):
        return self.b.op("mul", o, self)

    def __truediv__(self, o):
        return self.b.op("div", self, o)

    def __rtruediv__(self, o):
        return self.b.op("div", o, self)

    def __pow__(self, o):
        return self.b.op("pow", self, o)

    def __rpow__(self, o):
        return self.b.op("pow", o, self)

    def __neg__(self):
        return self.b.op("neg", self)

    def __lt__(self, o):
        return self.b.op("lt", self, o)

    def __le__(self, o):
        return self.b.op("le", self, o)

    def __gt__(self, o):
        return self.b.op("gt", self, o)

    def __ge__(self, o):
        return self.b.op("ge", self, o)

    def __matmul__(self, o):
        return self.b.op("matmul", self, o)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Tensor(%{self.value.id} {self.value.name}: {self.type})"


INITS = ("normal", "positive", "fan_in")


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")  # e.g. g, m.next, t37.ag
PROGRAM_NAME = re.compile(r"[A-Za-z0-9_.+\-(),]+")  # e.g. adam, AR-C, fuse(RS-C-AG)


def _name(what: str, name: object, pattern: re.Pattern = NAME) -> str:
    """`name` if it is a name: identifiers joined by dots (what the printer, the reports and the
    generated code's comments show; the renderers emit only identifiers they generate); a
    program's may read like a schedule (`AR-C`), never with spaces or control characters."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"{what} name must be a non-empty string, got {name!r}")
    if not pattern.fullmatch(name):
        allowed = (
            "letters, digits, _ and dots between them"
            if pattern is NAME
            else "letters, digits and _ . + - ( ) ,"
        )
        raise ArgumentError(f"{what} name {name!r} is not a name ({allowed})")
    return name


def _finite(what: str, x: float) -> float:
    if not math.isfinite(x):
        raise ArgumentError(f"{what} must be finite, got {x!r}")
    return x


class Builder:
    def __init__(self, name: str, stages: int = 1):
        _name("program", name, PROGRAM_NAME)
        if not _is_int(stages) or stages < 1:
            raise ShapeError(f"a program needs at least one pipeline stage, got {stages!r}")
        self.name, self.stages = name, stages
        self.inputs: list[Input] = []
        self.body: list[Stmt] = []
        self.outputs: list[tuple[str, Value]] = []
        self._names: set[str] = set()

    # -- values -------------------------------------------------------------------------------
    def _value(self, name: Optional[str], type_: TensorType) -> Value:
        base = name or f"t{len(self.inputs) + len(self.body)}"
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}.{k}", k + 1
        self._names.add(name)
        return Value(len(self.inputs) + len(self.body), name, type_)

    def input(
        self,
        name: str,
        dtype: DType,
        shape: Sequence[SizeLike],
        layout: Layout,
        stage: Optional[int] = None,
        init: str = "normal",
    ) -> Tensor:
        if _name("input", name) in self._names:
            raise ShapeError(f"input name {name!r} is already used")
        if stage is not None and (not _is_int(stage) or not 0 <= stage < self.stages):
            raise ShapeError(f"input {name}: stage {stage!r} not in [0, {self.stages})")
        if init not in INITS:
            raise ArgumentError(
                f"input {name}: init must be one of {', '.join(INITS)}, got {init!r}"
            )
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise ShapeError(f"input {name}: shape must be a list of sizes, got {shape!r}")
        try:
            t = TensorType(dtype, tuple(Size.of(s) for s in shape), layout, stage)
        except DSLError as e:
            raise type(e)(f"input {name}: {e}") from None
        v = self._value(name, t)
        self.inputs.append(Input(v, None, init))
        return Tensor(self, v)

    def param(self, name: str, default: float, dtype: DType = f32) -> Tensor:
        """A scalar hyper-parameter (replicated, on every stage) with a default value."""
        if _name("parameter", name) in self._names:
            raise ShapeError(f"parameter name {name!r} is already used")
        if not isinstance(default, (int, float)) or isinstance(default, bool):
            raise ArgumentError(f"parameter {name}: default must be a number, got {default!r}")
        _finite(f"parameter {name}: default", default)
        try:
            t = TensorType(dtype, (), Replicated(), None)
        except DSLError as e:
            raise type(e)(f"parameter {name}: {e}") from None
        v = self._value(name, t)
        self.inputs.append(Input(v, float(default)))
        return Tensor(self, v)

    def _arg(self, x: Operand):
        if isinstance(x, Tensor):
            if x.b is not self:
                raise ShapeError(f"{x!r} belongs to another program")
            return x.value
        if isinstance(x, (int, float, Size)) and not isinstance(x, bool):
            return Const(_finite("a constant operand", x) if isinstance(x, float) else x)
        raise ShapeError(f"operand {x!r} is neither a tensor nor a number")

    def op(self, kind: str, *operands: Operand, name: Optional[str] = None, **attrs) -> Tensor:
        if name is not None:
            _name(f"{kind}'s result", name)
        bools = [k for k, v in attrs.items() if isinstance(v, bool)]
        if bools:  # no operation takes a flag: True as a rank, seed or dim is a mistake
            raise ArgumentError(
                f"{kind}: attribute {bools[0]}={attrs[bools[0]]!r} must be a number, not a bool"
            )
        args = tuple(self._arg(x) for x in operands)
        attr_t = tuple(attrs.items())
        types = [a.type if isinstance(a, Value) else a for a in args]
        try:
            t = infer(kind, types, attrs, Ctx(self.stages))
        except DSLError as e:
            shown = ",".join(_attr(k, v) for k, v in attr_t)  # as the printer shows them
            text = (f"{kind}[{shown}]" if shown else kind) + f"({', '.join(map(str, args))})"
            raise type(e)(f"{text}: {e}") from None
        s = Stmt(self._value(name, t), kind, args, attr_t)
        self.body.append(s)
        return Tensor(self, s.out)

    # -- ops that need names or attributes ----------------------------------------------------
    def neg(self, x, **kw):
        return self.op("neg", x, **kw)

    def sqrt(self, x, **kw):
        return self.op("sqrt", x, **kw)

    def rsqrt(self, x, **kw):
        return self.op("rsqrt", x, **kw)

    def exp(self, x, **kw):
        return self.op("exp", x, **kw)

    def tanh(self, x, **kw):
        return self.op("tanh", x, **kw)

    def erf(self, x, **kw):
        return self.op("erf", x, **kw)

    def gelu(self, x, approximate: str = "none", **kw):
        """x * Phi(x) (torch.nn.functional.gelu); approximate="tanh" for its tanh form."""
        if approximate != "none":  # the default is not printed
            kw["approximate"] = approximate
        return self.op("gelu", x, **kw)

    def softmax(self, x, **kw):
        """Softmax over the LAST dimension (numerically stable: the row max is subtracted).
        A row op: its own kernel, never fused with its neighbours."""
        return self.op("softmax", x, **kw)

    def layer_norm(self, x, eps: float = 1e-5, **kw):
        """(x - mean) / sqrt(var + eps) over the LAST dimension (biased variance), no affine:
        write `layer_norm(x) * w + b` for one. A row op, like softmax."""
        return self.op("layer_norm", x, eps=eps, **kw)

    def maximum(self, a, b, **kw):
        return self.op("maximum", a, b, **kw)

    def minimum(self, a, b, **kw):
        return self.op("minimum", a, b, **kw)

    def eq(self, a, b, **kw):
        return self.op("eq", a, b, **kw)

    def ne(self, a, b, **kw):
        return self.op("ne", a, b, **kw)

    def where(self, c, a, b, **kw):
        return self.op("where", c, a, b, **kw)

    def cast(self, x, dtype: DType, **kw):
        return self.op("cast", x, dtype=dtype, **kw)

    def sum(self, x, **kw):
        return self.op("sum", x, **kw)

    def mean(self, x, **kw):
        return self.op("mean", x, **kw)

    def norm(self, x, **kw):
        return self.op("norm", x, **kw)

    def segment_sum(self, x, seg, nseg: int, **kw):
        return self.op("segment_sum", x, seg, nseg=nseg, **kw)

    def take(self, table, seg, **kw):
        return self.op("take", table, seg, **kw)

    def matmul(self, a, b, **kw):
        return self.op("matmul", a, b, **kw)

    def attention(self, q, k, v, head_dim: int, causal: bool = False, **kw):
        """softmax(q k^T / sqrt d) v per batch and head of [S, B, E] activations (`dsl.ops`)."""
        mask = "causal" if causal else "none"  # attributes are numbers or names, not flags
        return self.op("attention", q, k, v, head_dim=head_dim, mask=mask, **kw)

    def slice(self, x, dim: int = 0, **kw):
        return self.op("slice", x, dim=dim, **kw)

    def dropout(self, x, p: float, seed: int, **kw):
        return self.op("dropout", x, p=p, seed=seed, **kw)

    def all_reduce(self, x, op: str = "sum", **kw):
        return self.op("all_reduce", x, op=op, **kw)

    def reduce_scatter(self, x, dim: int = 0, op: str = "sum", **kw):
        return self.op("reduce_scatter", x, op=op, dim=dim, **kw)

    def all_gather(self, x, **kw):
        return self.op("all_gather", x, **kw)

    def broadcast(self, x, root: int = 0, **kw):
        return self.op("broadcast", x, root=root, **kw)

    def reduce(self, x, root: int = 0, op: str = "sum", **kw):
        return self.op("reduce", x, op=op, root=root, **kw)

    def all_to_all(self, x, split_dim: int, concat_dim: int, **kw):
        return self.op("all_to_all", x, split_dim=split_dim, concat_dim=concat_dim, **kw)

    def send(self, x, dst: int, **kw) -> Tensor:
        """Send x from its stage to stage `dst` (rank i to rank i); the result lives on `dst`."""
        return self.op("p2p", x, dst=dst, **kw)

    def update(self, target: Tensor, value: Operand, **kw) -> Tensor:
        """Write `value` back into input `target`; the program outputs it under target's name."""
        if not isinstance(target, Tensor):
            raise ArgumentError(f"update target must be an input tensor, got {target!r}")
        if not any(i.value is target.value for i in self.inputs):
            raise ShapeError(f"update target {target.value.name} is not a program input")
        if any(n == target.value.name for n, _ in self.outputs):
            raise ShapeError(f"input {target.value.name} is updated twice")
        t = self.op("update", target, value, name=kw.pop("name", f"{target.value.name}.new"))
        self.outputs.append((target.value.name, t.value))
        return t

    def output(self, name: str, x: Tensor) -> None:
        _name("output", name)
        if not isinstance(x, Tensor):
            raise ArgumentError(f"output {_name('output', name)} must be a tensor, got {x!r}")
        if any(n == name for n, _ in self.outputs):
            raise ShapeError(f"output {name} is defined twice")
        self.outputs.append((name, self._arg(x)))

    def build(self, schedule: str = "") -> Program:
        p = Program(
            self.name,
            tuple(self.inputs),
            tuple(self.body),
            tuple(self.outputs),
            self.stages,
            schedule=schedule,
        )
        verify(p)
        return p


__all__ = ["Builder", "Tensor", "Local", "Replicated"]
