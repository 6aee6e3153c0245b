"""`Renderer`: the target-independent walk that turns one `plan.Kernel` into C-style source text.

Contract (the semantics of a Kernel are in the docstring of `codegen.plan`):
- `render(kernel) -> str` is pure text: one function `<kernel.name>(begin, end, rank, bufs)` where
  `bufs[j]` is the buffer `kernel.args()[j]`; `render_module(kernels) -> str` is a whole
  translation unit (a header of helpers once, then each distinct function, then the bindings).
- Every value a statement uses is exactly one of: a local computed by an earlier statement of the
  kernel (`v<id>`), an operand read through its `Access` (`kernel.reads`, by value id), or a 0-d
  buffer in `kernel.scalars` (by convention the buffer id equals the value id).
- Prologue (once per call): scalar loads, loop-invariant reads (all strides 0), every 0-d
  statement that is not a reduction; then (`scalar_stores`) the stores of `scalar_outs` (and of
  any 0-d value in `writes`).
- Loop over flat e in [begin, end): loads of the operands used, the loop statements in program
  order, `sum`s accumulated in double (int64 for integers and bools), stores of `writes` at e.
- Epilogue: every accumulator ADDED to its 0-d buffer (the caller zeroes it before the 1st chunk).
- f16/bf16 are loaded and computed as float (f32 accumulation) and converted back at the store;
  a `cast` to f16/bf16 rounds to that type, as the interpreter does. Constants take the dtype of
  their statement (a comparison's: its operands'), rounded to it as `dsl.interpret` does.

Row kernels: a kernel whose one statement is a row op (`dsl.ops.ROW`: softmax, layer_norm; the
lowering gives each its own kernel) renders as a loop over the rows of its loop that [begin, end)
touches (L its last extent; a row cut by begin or end is computed whole, stored only within
[begin, end), so chunked runs equal one run) with inner loops over the row, computing in
double as `dsl.interpret` does: `code_for_row[op]` gives one row's lines from `x(j)` (the operand
at j, as double) and `y(j, value)` (the store). The inner loops run j from `row_lanes[0]` by
`row_lanes[1]` (C++: 0 by 1; CUDA: a block per row, its threads striding), and `row_combine`
combines a per-lane max or sum across the lanes (C++: nothing to do).

Targets subclass `Renderer`, set the class attributes (type names, helper names, the op table
`code_for_op`) and assemble the walk's pieces in `function()`. A missing rule raises `RenderError`
("render rule for X not implemented"); `tests/test_render.py` checks none is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dsl.interpret import as_dtype, mix32
from dsl.ir import Const, Stmt, Value
from dsl.ops import ROW
from dsl.types import DType

from .plan import Access, Kernel
from .render_rows import gelu_rule, layer_norm_row, softmax_row

_GOLDEN = 0x9E3779B9  # as dsl.interpret.dropout_keep


# The C helpers every target's module starts with (after its own includes or typedefs), as
# `helpers(qualifier)`: CC_FN is the target's function qualifier ("static inline" in C++,
# "__device__ __forceinline__" in CUDA). Target-specific helpers (dropout's select, f16 and bf16
# conversions, vector words) stay in each target's HEADER.
HELPERS = r"""// numpy's maximum/minimum: NaN wins; on ties the second operand.
template <class T> CC_FN T cc_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> CC_FN T cc_min(T a, T b) { return (a < b || a != a) ? a : b; }
// integer division truncates toward zero; x / 0 = 0 (as dsl.interpret)
template <class T> CC_FN T cc_idiv(T a, T b) { return b == 0 ? T(0) : T(a / (b == 0 ? T(1) : b)); }
template <class T> CC_FN T cc_ipow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0);
  typedef unsigned long long U;  // the product mod 2^64, truncated: T's wrap-around
  U r = 1, x = static_cast<U>(a);
  for (; b; b >>= 1) { if (b & 1) r *= x; x *= x; }
  return static_cast<T>(r);
}
// dropout: dsl.interpret.dropout_keep; `seed` is mix32(seed ^ 0x9E3779B9), threshold ceil(p * 2^24)
CC_FN uint32_t cc_mix32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}
CC_FN bool cc_keep(uint64_t index, uint32_t seed, uint32_t threshold) {
  const uint32_t h = cc_mix32(static_cast<uint32_t>(index) ^ cc_mix32(static_cast<uint32_t>(index >> 32) ^ seed));
  return (h >> 8) >= threshold;
}
"""


def helpers(qualifier: str) -> str:
    return HELPERS.replace("CC_FN", qualifier)


class RenderError(Exception):
    """A kernel the renderer cannot express (names the kernel and the statement at fault)."""


@dataclass(frozen=True)
class LoopRead:
    """An operand loaded in the loop: `value` from buffer `buffer` at element `index` (text)."""

    value: Value
    buffer: int
    index: str
    dtype: DType
    contiguous: bool  # index is e plus a loop-invariant rank term (`rank`, "" for none)
    rank: str


@dataclass
class Walk:
    """The pieces of one kernel function, as lines of text, in the order they run."""

    kernel: Kernel
    buffers: dict[int, DType] = field(default_factory=dict)  # buffer id -> dtype (used ones)
    prologue: list[str] = field(default_factory=list)  # scalar loads, 0-d stmts, scalar stores
    index: dict[int, str] = field(default_factory=dict)  # loop dim -> its multi-index variable
    loads: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)
    scalar_stores: list[str] = field(default_factory=list)  # stores of 0-d values, after prologue
    # The loop's memory traffic as data, for targets that re-shape the loop (CUDA's vector loads):
    loop_reads: list[LoopRead] = field(default_factory=list)  # one per entry of `loads`
    loop_writes: list[tuple[int, int, DType]] = field(default_factory=list)  # (value, buffer, dt)
    accs: list[tuple[str, str, str]] = field(default_factory=list)  # (acc type, acc, final stmt)
    rank_offsets: dict[int, str] = field(default_factory=dict)  # rank_stride -> hoisted name
    # segment_sum accumulators: (acc type, acc, nseg, final lines) (C++: a private array each)
    seg_accs: list[tuple[str, str, int, list[str]]] = field(default_factory=list)
    row: int = 0  # a row kernel's row length (its `body` is one row's lines); 0: elementwise


def _cmp(op: str) -> Callable[..., str]:
    return lambda a, b, dt: f"({a} {op} {b})"


class Renderer:
    # -- target description (override in subclasses) -----------------------------------------
    compute_type: dict[DType, str] = {}  # the type values of a dtype are computed in
    storage_type: dict[DType, str] = {}  # the element type of a buffer of that dtype
    acc_type = {"float": "double", "int": "int64_t"}
    index_type = "int64_t"
    # the unsigned type a loop of at most 2^32 elements divides its flat e in by a divisor that is
    # not a power of two, to find its multi-index ("": in index_type); SIMD units divide 32-bit
    # integers by a constant (a multiply), not 64-bit ones
    narrow_index = ""
    float_suffix = {DType.f16: "f", DType.bf16: "f", DType.f32: "f", DType.f64: ""}
    inf, nan = "INFINITY", "NAN"
    bool_literals = ("false", "true")
    int64_literal = "{}LL"
    # op kind -> expression (sum: the accumulation statement; update: the value it writes).
    # Arguments are rendered operands, then the statement's dtype.
    code_for_op: dict[str, Callable[..., str]] = {
        "add": lambda a, b, dt: f"({a} + {b})",
        "sub": lambda a, b, dt: f"({a} - {b})",
        "mul": lambda a, b, dt: f"({a} * {b})",
        "div": lambda a, b, dt: f"({a} / {b})" if dt.is_float else f"cc_idiv({a}, {b})",
        "pow": lambda a, b, dt: f"std::pow({a}, {b})" if dt.is_float else f"cc_ipow({a}, {b})",
        "maximum": lambda a, b, dt: f"cc_max({a}, {b})",
        "minimum": lambda a, b, dt: f"cc_min({a}, {b})",
        "lt": _cmp("<"),
        "le": _cmp("<="),
        "gt": _cmp(">"),
        "ge": _cmp(">="),
        "eq": _cmp("=="),
        "ne": _cmp("!="),
        "neg": lambda a, dt: f"(-{a})",
        "sqrt": lambda a, dt: f"std::sqrt({a})",
        "rsqrt": lambda a, dt: f"(1 / std::sqrt({a}))",
        "exp": lambda a, dt: f"std::exp({a})",
        "tanh": lambda a, dt: f"std::tanh({a})",
        "erf": lambda a, dt: f"std::erf({a})",
        "gelu": gelu_rule("std::exp", "std::erfc"),
        "where": lambda c, a, b, dt: f"({c} ? {a} : {b})",
        "cast": lambda a, ctype, dt: f"static_cast<{ctype}>({a})",
        "dropout": lambda x, index, seed, threshold, scale, dt: (
            f"cc_dropout({x}, {index}, {seed}u, {threshold}u, {scale})"
        ),
        "sum": lambda acc, x, dt: f"{acc} += {x};",
        # segment_sum: (accumulator, the id, its segment count, the value); take: the table read
        "segment_sum": lambda acc, seg, nseg, x, dt: (
            f"if ({seg} >= 0 && {seg} < {nseg}) {acc}[{seg}] += {x};"
        ),
        "take": lambda table, seg, nseg, dt: f"(({seg} >= 0 && {seg} < {nseg}) ? {table} : 0)",
        "update": lambda target, value, dt: value,
    }
    # row op kind -> one row's lines, from (x(j), y(j, value), row length, renderer, statement)
    code_for_row: dict[str, Callable[..., list[str]]] = {
        "softmax": softmax_row,
        "layer_norm": layer_norm_row,
    }
    row_lanes = ("0", "1")  # a row's inner loops: j from the first by the second

    def row_loop(self) -> str:
        j0, dj = self.row_lanes
        return f"for (int64_t j = {j0}; j < cc_len; j += {dj})"

    def row_combine(self, kind: str, var: str) -> list[str]:
        """Lines that combine `var`, a per-lane max or sum, over the lanes of one row."""
        return []

    # -- entry points -------------------------------------------------------------------------
    def render(self, kernel: Kernel) -> str:
        return self.function(self.walk(kernel))

    def render_module(self, kernels: list[Kernel]) -> str:
        """One translation unit: the helper header, each distinct function once (sorted by name,
        so the same set of kernels always gives the same text), the bindings."""
        funcs: dict[str, str] = {}
        for k in kernels:
            text = self.render(k)
            if funcs.setdefault(k.name, text) != text:
                raise RenderError(f"two different kernels are both named {k.name}")
        names = sorted(funcs)
        return self.module(names, [funcs[n] for n in names])

    # -- target hooks -------------------------------------------------------------------------
    def function(self, w: Walk) -> str:
        raise NotImplementedError

    def module(self, names: list[str], functions: list[str]) -> str:
        raise NotImplementedError

    def load(self, ptr: str, index: str, dt: DType) -> str:
        return f"{ptr}[{index}]"

    def store(self, ptr: str, index: str, value: str, dt: DType) -> str:
        return f"{ptr}[{index}] = {value};"

    def round_to(self, expr: str, dt: DType) -> str:
        """`expr` rounded to dt's storage type and back to its compute type (cast to f16/bf16)."""
        return expr

    # -- constants ----------------------------------------------------------------------------
    def const(self, value: object, dt: DType) -> str:
        if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
            raise RenderError(f"constant {value!r} is not a plain number (lower binds sizes)")
        x = as_dtype(value, dt)[()]
        if dt is DType.bool:
            return self.bool_literals[bool(x)]
        if not dt.is_float:
            return f"{int(x)}" if dt is DType.i32 else self.int64_literal.format(int(x))
        if math.isnan(x):
            return self.nan if dt is DType.f64 else f"float({self.nan})"
        if math.isinf(x):
            sign = "-" if x < 0 else ""
            return sign + (self.inf if dt is DType.f64 else f"float({self.inf})")
        text = str(np.float64(x)) if dt is DType.f64 else str(np.float32(x))
        if "." not in text and "e" not in text:
            text += ".0"
        return text + self.float_suffix[dt]

    # -- the walk -----------------------------------------------------------------------------
    def walk(self, k: Kernel) -> Walk:
        if any(s.op in ROW for s in k.stmts):
            return self.row_walk(k)
        w = Walk(k)
        reads = {a.value: a for a in k.reads}
        values = _values(k)
        used = _used(k)
        local: set[int] = set()  # value ids with a variable in scope (prologue or loop)
        outs = {s.out.id for s in k.stmts}
        for vid in [v for v in used if v in reads]:
            self._read(w, reads[vid], values[vid], local)
        tables = {s.args[0].id for s in k.stmts if s.op == "take"}
        for vid in sorted(v for v in used if v not in reads and v not in outs):
            if vid in tables and vid in k.scalars:  # read whole, at each element's id
                self._buffer(w, vid, values[vid].type.dtype)
                local.add(vid)
                continue
            if values[vid].type.rank != 0 or vid not in k.scalars:
                raise RenderError(
                    f"kernel {k.name}: value %{vid} is neither computed, read nor a scalar argument"
                )
            self._buffer(w, vid, values[vid].type.dtype)
            w.prologue.append(
                self._decl(values[vid], self.load(f"b{vid}", "0", values[vid].type.dtype))
            )
            local.add(vid)
        for s in k.stmts:
            self._stmt(w, s, reads, local)
        for vid, buf in list(k.scalar_outs) + [
            (v, b) for v, b in k.writes if values[v].type.rank == 0
        ]:
            dt = values[vid].type.dtype
            self._buffer(w, buf, dt)
            w.scalar_stores.append(self.store(f"b{buf}", "0", f"v{vid}", dt))
        for vid, buf in k.writes:
            if values[vid].type.rank != 0:
                dt = values[vid].type.dtype
                self._buffer(w, buf, dt)
                w.stores.append(self.store(f"b{buf}", "e", f"v{vid}", dt))
                w.loop_writes.append((vid, buf, dt))
        return w

    def row_walk(self, k: Kernel) -> Walk:
        """A row kernel's walk: `body` is one row's lines, in the row `cc_row` of length
        `cc_len`, starting at element `cc_r` (see the module doc)."""
        if len(k.stmts) != 1 or not k.loop:
            raise RenderError(f"kernel {k.name}: a row op is a kernel of its own statement")
        (s,) = k.stmts
        rule = self.code_for_row.get(s.op)
        if rule is None:
            raise RenderError(f"kernel {k.name}: {s}: render rule for {s.op} not implemented")
        x, dt = s.args[0], s.out.type.dtype
        a = next((a for a in k.reads if a.value == x.id), None)
        if a is None or not a.is_contiguous(k.loop):
            raise RenderError(f"kernel {k.name}: {s}: a row op reads its operand contiguously")
        w = Walk(k, row=k.loop[-1])
        self._buffer(w, a.buffer, x.type.dtype)
        ro = self._rank_term(w, a)
        at = "cc_r + j" + (f" + {ro}" if ro else "")
        load = self.load(f"b{a.buffer}", at, x.type.dtype)
        out = dict(k.writes).get(s.out.id)
        if out is not None:
            self._buffer(w, out, dt)

        def y(j: str, value: str) -> str:
            if out is None:
                return "{}"  # the result is not needed (nothing reads it)
            value = value if dt is DType.f64 else f"static_cast<{self.compute_type[dt]}>({value})"
            at = f"cc_r + {j}"
            return f"if ({at} >= begin && {at} < end) {self.store(f'b{out}', at, value, dt)}"

        w.body = rule(lambda j: f"static_cast<double>({load})", y, w.row, self, s)
        return w

    def _buffer(self, w: Walk, buf: int, dt: DType) -> None:
        if w.buffers.setdefault(buf, dt) is not dt:
            raise RenderError(
                f"kernel {w.kernel.name}: buffer {buf} is used as {w.buffers[buf]} and {dt}"
            )

    def _decl(self, v: Value, expr: str) -> str:
        return f"const {self.compute_type[v.type.dtype]} v{v.id} = {expr};"

    def _read(self, w: Walk, a: Access, v: Value, local: set[int]) -> None:
        dt = v.type.dtype
        self._buffer(w, a.buffer, dt)
        if not any(a.strides):  # loop-invariant: load once
            w.prologue.append(
                self._decl(v, self.load(f"b{a.buffer}", self._rank_term(w, a) or "0", dt))
            )
        else:
            index = self.index_expr(w, a)
            w.loads.append(self._decl(v, self.load(f"b{a.buffer}", index, dt)))
            w.loop_reads.append(
                LoopRead(
                    v, a.buffer, index, dt, a.is_contiguous(w.kernel.loop), self._rank_term(w, a)
                )
            )
        local.add(v.id)

    def _rank_term(self, w: Walk, a: Access) -> str:
        if not a.rank_stride:
            return ""
        return w.rank_offsets.setdefault(a.rank_stride, f"ro{a.rank_stride}")

    def index_expr(self, w: Walk, a: Access) -> str:
        """The element index of access `a` at loop element e (see `codegen.plan`)."""
        terms = []
        if a.is_contiguous(w.kernel.loop):
            terms.append("e")
        else:
            for d, s in enumerate(a.strides):
                if s:
                    terms.append(self._dim(w, d) + ("" if s == 1 else f" * {s}"))
        rank = self._rank_term(w, a)
        return " + ".join(terms + ([rank] if rank else [])) or "0"

    def _dim(self, w: Walk, d: int) -> str:
        """The loop's multi-index i_d at e, declared once per iteration."""
        if d not in w.index:
            L = w.kernel.loop
            inner = math.prod(L[d + 1 :])
            e, u = "e", ""
            pow2 = all(n & (n - 1) == 0 for n in (inner, L[d]))  # shifts and masks vectorise
            if self.narrow_index and math.prod(L) <= 2**32 and not pow2:  # e fits in 32 bits
                e, u = f"static_cast<{self.narrow_index}>(e)", "u"
            expr = "e" if inner == 1 else f"{e} / {inner}{u}"
            if d > 0:
                expr = f"{e} % {L[d]}{u}" if inner == 1 else f"({expr}) % {L[d]}{u}"
            w.index[d] = f"const {self.index_type} i{d} = {expr};"
        return f"i{d}"

    def _stmt(self, w: Walk, s: Stmt, reads: dict[int, Access], local: set[int]) -> None:
        k, dt = w.kernel, s.out.type.dtype
        rule = self.code_for_op.get(s.op)
        if rule is None:
            raise RenderError(f"kernel {k.name}: {s}: render rule for {s.op} not implemented")
        cdt = s.values[0].type.dtype if s.op in ("lt", "le", "gt", "ge", "eq", "ne") else dt
        args = [self.const(a.value, cdt) if isinstance(a, Const) else f"v{a.id}" for a in s.args]
        for i, a in enumerate(s.args):
            if isinstance(a, Value) and a.id not in local and not (s.op == "update" and i == 0):
                raise RenderError(
                    f"kernel {k.name}: {s}: operand %{a.id} is used before it is "
                    "computed, read or passed as a scalar"
                )
        if s.op == "sum":
            if s.values[0].type.rank > len(k.loop):
                raise RenderError(
                    f"kernel {k.name}: {s}: sums a rank-{s.values[0].type.rank} "
                    f"tensor over a loop of shape {k.loop}"
                )
            acc = f"acc{s.out.id}"
            kind = "float" if s.values[0].type.dtype.is_float else "int"
            buf = dict(k.reduces).get(s.out.id)
            if buf is None:
                raise RenderError(f"kernel {k.name}: {s}: a sum that is not in kernel.reduces")
            self._buffer(w, buf, dt)
            total = f"{self.load(f'b{buf}', '0', dt)} + static_cast<{self.compute_type[dt]}>({acc})"
            w.accs.append((self.acc_type[kind], acc, self.store(f"b{buf}", "0", total, dt)))
            w.body.append(rule(acc, f"static_cast<{self.acc_type[kind]}>({args[0]})", dt))
            return
        if s.op == "segment_sum":
            self._segment_sum(w, s, args)
            return
        if s.op == "take":
            nseg = int(s.args[0].type.shape[0].value({}))
            read = self.load(f"b{s.args[0].id}", f"{args[1]}", dt)
            args = [read, args[1], str(nseg)]
        elif s.op == "update":
            args[0] = ""  # the target's old contents are not read
        elif s.op == "dropout":
            args = self._dropout(w, s, args[0])
        elif s.op == "cast":
            args = [args[0], self.compute_type[dt]]
        elif s.op == "gelu":
            args = [args[0], s.attr("approximate", "none")]
        expr = rule(*args, dt)
        if s.op == "cast":
            expr = self.round_to(expr, dt)
        line = f"{self._decl(s.out, expr)}  // {s.out.name}"
        (w.prologue if s.out.type.rank == 0 else w.body).append(line)
        local.add(s.out.id)

    def _segment_sum(self, w: Walk, s: Stmt, args: list[str]) -> None:
        """Accumulate x into its segment's private (double) slot; the epilogue adds each slot to
        the [nseg] buffer (zeroed by the caller before the first chunk), as `sum` does."""
        k, dt = w.kernel, s.out.type.dtype
        buf = dict(k.reduces).get(s.out.id)
        if buf is None:
            raise RenderError(f"kernel {k.name}: {s}: a segment_sum not in kernel.reduces")
        self._buffer(w, buf, dt)
        nseg, acc = s.attr("nseg"), f"acc{s.out.id}"
        total = f"{self.load(f'b{buf}', 'j', dt)} + static_cast<{self.compute_type[dt]}>({acc}[j])"
        final = [f"for (int64_t j = 0; j < {nseg}; ++j) {self.store(f'b{buf}', 'j', total, dt)}"]
        w.seg_accs.append(("double", acc, nseg, final))
        x = f"static_cast<double>({args[0]})"
        w.body.append(self.code_for_op["segment_sum"](acc, args[1], nseg, x, dt))

    def _dropout(self, w: Walk, s: Stmt, x: str) -> list[str]:
        acc = dict(w.kernel.dropout_index).get(s.out.id)
        if acc is None:
            raise RenderError(f"kernel {w.kernel.name}: {s}: no dropout_index for %{s.out.id}")
        p, dt = float(s.attr("p")), s.out.type.dtype
        seed = int(mix32(np.uint32((int(s.attr("seed")) & 0xFFFFFFFF) ^ _GOLDEN)))
        threshold = int(np.ceil(p * 2.0**24))
        index = f"static_cast<uint64_t>({self.index_expr(w, acc)})"
        return [x, index, f"0x{seed:08x}", str(threshold), self.const(1.0 / (1.0 - p), dt)]


def _values(k: Kernel) -> dict[int, Value]:
    out: dict[int, Value] = {}
    for s in k.stmts:
        for a in s.values:
            out.setdefault(a.id, a)
        out[s.out.id] = s.out
    return out


def _used(k: Kernel) -> list[int]:
    """Value ids the statements use, in first-use order (an update's target is not used)."""
    seen: dict[int, None] = {}
    for s in k.stmts:
        for i, a in enumerate(s.args):
            if isinstance(a, Value) and not (s.op == "update" and i == 0):
                seen.setdefault(a.id, None)
    return list(seen)
