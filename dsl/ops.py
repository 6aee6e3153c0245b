"""Op kinds and their shape, dtype and layout inference rules (one rule per kind, in `INFER`).

Arguments reach a rule as `TensorType` (a tensor) or `Const` (a scalar literal, weakly typed: it
takes the dtype of the tensors it meets). Rules raise `ShapeError`, `LayoutError` or `DTypeError`
with the rule that is broken; the caller prefixes the statement's printed form.

Layout rules (the paper's):
- pointwise: all the same layout -> that layout; Sliced(d) with Replicated -> Sliced(d) (the
  replicated operand is read as its slice, when it has that dimension); Local with Replicated ->
  Local; Sliced with Local, or Sliced along different dimensions -> LayoutError.
- matmul [.., K] x [K, H]: Sliced(row) x Replicated -> Sliced(row); Replicated x Sliced(1) ->
  Sliced(last); both sliced along K -> Local (partial sums); Local/Replicated mixes -> Local/Replicated.
- attention(q, k, v, head_dim=d, mask="none"|"causal") (the builder's causal=True) on [S, B, E] activations (sequence first, E =
  heads x d): softmax(q_h k_h^T / sqrt d) v_h per batch b and head h, as torch's
  scaled_dot_product_attention. q, k, v of one type; Replicated, Sliced(1) (batches) or Sliced(2)
  (heads: each rank its E/P columns, so heads = E_local / d on the rank) -> that type; Sliced(0)
  -> LayoutError (attention reads the whole sequence: all_gather first); Local -> LayoutError
  (all_reduce first). Float only; d must divide E (checked when sizes are bound).
- row ops (softmax, layer_norm) over the LAST dimension: the input's type; the last dimension
  must not be Sliced (LayoutError: all_gather it first). Float only; layer_norm's eps > 0.
- reductions to a scalar: Replicated -> Replicated, Local -> Local, Sliced -> Local (the partial
  reduction of the rank's slice).
- all_reduce(Local) -> Replicated; reduce_scatter(Local) -> Sliced(dim); all_gather(Sliced(d)) ->
  Replicated; broadcast(Local|Replicated) -> Replicated; reduce(Local) -> Local (the root holds the
  reduction, the other ranks zeros); all_to_all(Local) -> Local, all_to_all(Sliced(c)) with
  concat_dim=c -> Sliced(split_dim); p2p moves a tensor from one pipeline stage to another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence, Union

from .errors import DTypeError, LayoutError, ShapeError
from .ir import Const
from .sizes import P, Size
from .types import DType, Local, Replicated, Sliced, TensorType

ArgT = Union[TensorType, Const]

BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
UNARY = ("neg", "sqrt", "rsqrt", "exp")
SPECIAL = ("tanh", "erf", "gelu")  # float functions the interpreter evaluates in float64
REDUCE = ("sum", "mean", "norm")
ROW = ("softmax", "layer_norm")  # over the last dimension, row by row
# segment_sum(x, seg)[nseg]: one sum per segment of a 1-d x (element j in segment seg[j]; ids
# outside [0, nseg) belong to none); take(table, seg): table[seg[j]] per element (0 outside)
SEGMENT = ("segment_sum", "take")
POINTWISE = BINARY + COMPARE + UNARY + SPECIAL + ("where", "cast", "dropout")
LIBRARY = ("matmul", "attention")  # run by a library call (a Plan step of its own), never fused
COMPUTE = POINTWISE + REDUCE + ROW + SEGMENT + LIBRARY + ("slice", "update")
GELU_APPROXIMATE = ("none", "tanh")
ATTENTION_MASKS = ("none", "causal")
COLLECTIVE = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
COMM = COLLECTIVE + ("p2p",)
REDUCE_OPS = ("sum", "max", "min", "prod")


@dataclass(frozen=True)
class Ctx:
    stages: int = 1


# -- helpers -----------------------------------------------------------------------------------
def _tensors(args: Sequence[ArgT]) -> list[TensorType]:
    return [a for a in args if isinstance(a, TensorType)]


def _stage(args: Sequence[ArgT]) -> Optional[int]:
    stages = {a.stage for a in _tensors(args) if a.stage is not None}
    if len(stages) > 1:
        raise LayoutError(
            f"operands live on different pipeline stages {sorted(stages)}; send first"
        )
    return stages.pop() if stages else None


def _dtype(args: Sequence[ArgT]) -> DType:
    dts = {a.dtype for a in _tensors(args)}
    if not dts:
        raise DTypeError("an op needs at least one tensor operand")
    if len(dts) > 1:
        raise DTypeError(f"operand dtypes differ ({', '.join(sorted(map(str, dts)))}); cast first")
    return dts.pop()


def _join_layout(ts: Sequence[TensorType], rank: int):
    """(layout of the result, output dim that is sliced or None) for pointwise operands."""
    sliced = {t.layout.dim + rank - t.rank for t in ts if isinstance(t.layout, Sliced)}
    if len(sliced) > 1:
        raise LayoutError(
            "operands are sliced along different dimensions; all_to_all or gather first"
        )
    if sliced:
        if any(isinstance(t.layout, Local) for t in ts):
            raise LayoutError(
                "a Sliced operand cannot meet a Local one; reduce_scatter the Local one first"
            )
        od = sliced.pop()
        return Sliced(od), od
    if any(isinstance(t.layout, Local) for t in ts):
        return Local(), None
    return Replicated(), None


def _broadcast(ts: Sequence[TensorType], rank: int, sliced_od: Optional[int]) -> tuple[Size, ...]:
    out: list[Size] = []
    for od in range(rank):
        sizes = []
        for t in ts:
            ad = od - (rank - t.rank)
            if ad < 0:
                continue
            s = t.shape[ad]
            if od == sliced_od and isinstance(t.layout, Replicated) and s != Size.of(1):
                s = s / P  # the replicated operand is read as its slice
            sizes.append(s)
        real = {s for s in sizes if s != Size.of(1)}
        if len(real) > 1:
            raise ShapeError(
                f"shapes do not broadcast at dim {od}: sizes {', '.join(map(str, real))}"
            )
        out.append(real.pop() if real else Size.of(1))
    return tuple(out)


def pointwise(args: Sequence[ArgT], dtype: Optional[DType] = None) -> TensorType:
    ts = _tensors(args)
    rank = max(t.rank for t in ts)
    layout, od = _join_layout(ts, rank)
    shape = _broadcast(ts, rank, od)
    return TensorType(dtype or _dtype(args), shape, layout, _stage(args))


def _float(t: TensorType, what: str) -> None:
    if not t.dtype.is_float:
        raise DTypeError(f"{what} needs a floating-point operand, got {t.dtype}")


def _dim(t: TensorType, dim: object) -> int:
    if not isinstance(dim, int) or not 0 <= dim < t.rank:
        raise ShapeError(f"dim {dim!r} is out of range for a tensor of rank {t.rank}")
    return dim


def _with_dim(shape: tuple[Size, ...], dim: int, size: Size) -> tuple[Size, ...]:
    return shape[:dim] + (size,) + shape[dim + 1 :]


def _need(t: TensorType, layouts: tuple[type, ...], op: str) -> None:
    if not isinstance(t.layout, layouts):
        names = " or ".join(c.__name__ for c in layouts)
        raise LayoutError(f"{op} needs a {names} tensor, got {t.layout}")


# -- rules --------------------------------------------------------------------------------------
def _binary(args, attrs, ctx):
    for t in _tensors(args):
        if t.dtype is DType.bool:
            raise DTypeError("arithmetic on bool; use where")
    return pointwise(args)


def _compare(args, attrs, ctx):
    _dtype(args)
    return pointwise(args, DType.bool)


def _unary(args, attrs, ctx):
    return pointwise(args)


def _unary_float(args, attrs, ctx):
    _float(args[0], "this op")
    return pointwise(args)


def _gelu(args, attrs, ctx):
    if attrs.get("approximate", "none") not in GELU_APPROXIMATE:
        raise ShapeError(
            f"gelu approximate must be 'none' or 'tanh', got {attrs.get('approximate')!r}"
        )
    return _unary_float(args, attrs, ctx)


def _row(args, attrs, ctx):
    """softmax over the last dimension: the input's type."""
    (t,) = args
    if not isinstance(t, TensorType) or t.rank == 0:
        raise ShapeError("a row op needs a tensor of rank >= 1 (it works on the last dimension)")
    _float(t, "a row op")
    if isinstance(t.layout, Sliced) and t.layout.dim == t.rank - 1:
        raise LayoutError(
            f"the last dimension is {t.layout}: a row op needs whole rows; all_gather first"
        )
    return t


def _layer_norm(args, attrs, ctx):
    eps = attrs.get("eps", 1e-5)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < float("inf"):
        raise ShapeError(f"layer_norm eps must be a finite number > 0, got {eps!r}")
    return _row(args, attrs, ctx)


def _where(args, attrs, ctx):
    cond, a, b = args
    if not isinstance(cond, TensorType) or cond.dtype is not DType.bool:
        raise DTypeError("where needs a bool condition (a comparison)")
    return pointwise(args, _dtype([a, b]))


def _cast(args, attrs, ctx):
    to = attrs.get("dtype")
    if not isinstance(to, DType):
        raise DTypeError(f"cast needs a dtype, got {to!r}")
    return replace(args[0], dtype=to)


def _dropout(args, attrs, ctx):
    p = attrs.get("p")
    if not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ShapeError(f"dropout probability must be in [0, 1), got {p!r}")
    if not isinstance(attrs.get("seed"), int):
        raise ShapeError("dropout needs an integer seed")
    _float(args[0], "dropout")
    return args[0]


def _reduce(args, attrs, ctx):
    (t,) = args
    layout = Replicated() if isinstance(t.layout, Replicated) else Local()
    return TensorType(t.dtype, (), layout, t.stage)


def _segment_ids(x: ArgT, seg: ArgT, op: str) -> None:
    if not isinstance(x, TensorType) or not isinstance(seg, TensorType):
        raise ShapeError(f"{op} takes tensors, not constants")
    if seg.dtype not in (DType.i32, DType.i64):
        raise DTypeError(f"{op} needs integer segment ids, got {seg.dtype}")


def _segment_sum(args, attrs, ctx):
    """[n] x [n] ids -> [nseg]: Replicated -> Replicated, Local or Sliced -> Local (partials)."""
    x, seg = args
    _segment_ids(x, seg, "segment_sum")
    nseg = attrs.get("nseg")
    if not isinstance(nseg, int) or isinstance(nseg, bool) or nseg < 1:
        raise ShapeError(f"segment_sum needs nseg >= 1, got {nseg!r}")
    if x.dtype not in (DType.f32, DType.f64):
        raise DTypeError(f"segment_sum sums f32 or f64, got {x.dtype}")
    if x.rank != 1 or (x.shape, x.layout) != (seg.shape, seg.layout):
        raise ShapeError(f"segment_sum needs a 1-d tensor and ids of its type, got {x}, {seg}")
    layout = Replicated() if isinstance(x.layout, Replicated) else Local()
    return TensorType(x.dtype, (Size.of(nseg),), layout, _stage(args))


def _take(args, attrs, ctx):
    """[nseg] table (not Sliced) x ids -> the ids' shape and layout, the table's dtype."""
    table, seg = args
    _segment_ids(table, seg, "take")
    if table.rank != 1 or isinstance(table.layout, Sliced):
        raise LayoutError(f"take reads a whole 1-d table, got {table}")
    if isinstance(table.layout, Local) and isinstance(seg.layout, Sliced):
        raise LayoutError("take of a Local table at Sliced ids; all_reduce the table first")
    layout = Local() if isinstance(table.layout, Local) else seg.layout
    return TensorType(table.dtype, seg.shape, layout, _stage(args))


def is_combine(s) -> bool:
    """A statement that is the all_reduce combining the per-rank partials of a sliced reduction
    (0-d, or a segment_sum's, marked `partial`): a barrier inside a fused step, not its head."""
    return s.op == "all_reduce" and (s.out.type.rank == 0 or bool(s.attr("partial", False)))


def _matmul(args, attrs, ctx):
    a, b = args
    if a.rank < 2 or b.rank != 2:
        raise ShapeError(f"matmul needs [..,K] x [K,H], got rank {a.rank} x rank {b.rank}")
    la, lb = a.layout, b.layout
    last = a.rank - 1
    if isinstance(la, Sliced) and la.dim == last and isinstance(lb, Sliced) and lb.dim == 0:
        layout = Local()  # both sliced along the contracted dimension: partial sums
    elif isinstance(la, Sliced) and la.dim != last and isinstance(lb, Replicated):
        layout = la
    elif isinstance(la, Replicated) and isinstance(lb, Sliced) and lb.dim == 1:
        layout = Sliced(last)
    elif isinstance(la, Sliced) or isinstance(lb, Sliced):
        raise LayoutError(
            f"matmul of {la} x {lb}: no rule (row-sliced x replicated, replicated x "
            "column-sliced, or both sliced along K)"
        )
    else:
        layout = Local() if Local() in (la, lb) else Replicated()
    if a.shape[-1] != b.shape[0]:
        raise ShapeError(f"matmul contracted sizes differ: {a.shape[-1]} vs {b.shape[0]}")
    return TensorType(_dtype(args), a.shape[:-1] + b.shape[1:], layout, _stage(args))


def _attention(args, attrs, ctx):
    """[S, B, E] x 3 -> q's type (see the module doc)."""
    if not all(isinstance(t, TensorType) for t in args):
        raise ShapeError("attention takes tensors q, k, v, not constants")
    q, k, v = args
    if q.rank != 3 or len({(t.shape, t.layout) for t in args}) != 1:
        raise ShapeError(f"attention needs q, k, v of one [S, B, E] type, got {q}, {k}, {v}")
    _dtype(args)
    _float(q, "attention")
    d = attrs.get("head_dim")
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise ShapeError(f"attention needs an integer head_dim >= 1, got {d!r}")
    if attrs.get("mask", "none") not in ATTENTION_MASKS:
        raise ShapeError(f"attention's mask must be 'none' or 'causal', got {attrs.get('mask')!r}")
    if isinstance(q.layout, Sliced) and q.layout.dim == 0:
        raise LayoutError("attention reads the whole sequence, got it Sliced(0); all_gather first")
    _need(q, (Replicated, Sliced), "attention")
    return replace(q, stage=_stage(args))


def _slice(args, attrs, ctx):
    (t,) = args
    _need(t, (Replicated,), "slice")
    d = _dim(t, attrs.get("dim", 0))
    return TensorType(t.dtype, _with_dim(t.shape, d, t.shape[d] / P), Sliced(d), t.stage)


def _update(args, attrs, ctx):
    target, value = args
    if (target.dtype, target.shape, target.layout) != (value.dtype, value.shape, value.layout):
        raise LayoutError(
            f"update writes {value} into {target}: dtype, shape and layout must match"
            " (all_gather a sliced value first, or as_slice the input)"
        )
    if value.stage != target.stage and target.stage is not None:
        raise LayoutError("update writes a value from another pipeline stage")
    return value


def _op_attr(attrs):
    if attrs.get("op", "sum") not in REDUCE_OPS:
        raise ShapeError(
            f"reduction op must be one of {', '.join(REDUCE_OPS)}, got {attrs.get('op')!r}"
        )


def _all_reduce(args, attrs, ctx):
    (t,) = args
    _op_attr(attrs)
    _need(t, (Local,), "all_reduce")
    return replace(t, layout=Replicated())


def _reduce_scatter(args, attrs, ctx):
    (t,) = args
    _op_attr(attrs)
    _need(t, (Local,), "reduce_scatter")
    d = _dim(t, attrs.get("dim", 0))
    return replace(t, shape=_with_dim(t.shape, d, t.shape[d] / P), layout=Sliced(d))


def _all_gather(args, attrs, ctx):
    (t,) = args
    _need(t, (Sliced,), "all_gather")
    d = t.layout.dim
    return replace(t, shape=_with_dim(t.shape, d, t.shape[d] * P), layout=Replicated())


def _root(attrs):
    root = attrs.get("root", 0)
    if not isinstance(root, int) or root < 0:
        raise ShapeError(f"root must be a rank index >= 0, got {root!r}")


def _broadcast_rule(args, attrs, ctx):
    _root(attrs)
    _need(args[0], (Local, Replicated), "broadcast")
    return replace(args[0], layout=Replicated())


def _reduce_rule(args, attrs, ctx):
    _root(attrs)
    _op_attr(attrs)
    _need(args[0], (Local,), "reduce")
    return args[0]


def _all_to_all(args, attrs, ctx):
    (t,) = args
    s, c = _dim(t, attrs.get("split_dim")), _dim(t, attrs.get("concat_dim"))
    if s == c:
        raise ShapeError("all_to_all needs split_dim != concat_dim")
    shape = _with_dim(_with_dim(t.shape, s, t.shape[s] / P), c, t.shape[c] * P)
    if isinstance(t.layout, Local):
        return replace(t, shape=shape)
    if isinstance(t.layout, Sliced) and t.layout.dim == c:
        return replace(t, shape=shape, layout=Sliced(s))
    raise LayoutError(
        f"all_to_all needs a Local tensor or one sliced along concat_dim={c}, got {t.layout}"
    )


def _p2p(args, attrs, ctx):
    (t,) = args
    dst = attrs.get("dst")
    if t.stage is None:
        raise LayoutError(
            "p2p sends a tensor that lives on one stage; this one lives on every stage"
        )
    if not isinstance(dst, int) or not 0 <= dst < ctx.stages or dst == t.stage:
        raise LayoutError(
            f"p2p destination stage {dst!r} must differ from {t.stage} and be in [0, {ctx.stages})"
        )
    return replace(t, stage=dst)


Rule = Callable[[Sequence[ArgT], Mapping[str, object], Ctx], TensorType]
INFER: dict[str, Rule] = {
    **{k: _binary for k in BINARY},
    **{k: _compare for k in COMPARE},
    "neg": _unary,
    "sqrt": _unary_float,
    "rsqrt": _unary_float,
    "exp": _unary_float,
    "tanh": _unary_float,
    "erf": _unary_float,
    "gelu": _gelu,
    "where": _where,
    "cast": _cast,
    "dropout": _dropout,
    **{k: _reduce for k in REDUCE},
    "segment_sum": _segment_sum,
    "take": _take,
    "softmax": _row,
    "layer_norm": _layer_norm,
    "matmul": _matmul,
    "attention": _attention,
    "slice": _slice,
    "update": _update,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "broadcast": _broadcast_rule,
    "reduce": _reduce_rule,
    "all_to_all": _all_to_all,
    "p2p": _p2p,
}
ALL_OPS = COMPUTE + COMM
ARITY = {**{k: 2 for k in BINARY + COMPARE + SEGMENT + ("matmul", "update")}}
ARITY.update(where=3, attention=3)


def infer(op: str, args: Sequence[ArgT], attrs: Mapping[str, object], ctx: Ctx) -> TensorType:
    """The type of `op[attrs](args)`, or a DSLError naming the rule broken."""
    if op not in INFER:
        raise ShapeError(f"unknown op {op!r}")
    want = ARITY.get(op, 1)
    if len(args) != want:
        raise ShapeError(f"{op} takes {want} operand(s), got {len(args)}")
    if not _tensors(args):
        raise DTypeError(f"{op} needs at least one tensor operand")
    return INFER[op](args, attrs, ctx)
