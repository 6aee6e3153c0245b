"""`interpret`: the reference semantics of every op, on numpy, one simulated rank per list entry.

    outs = interpret(program, inputs, world_size, bindings={"N": 1024})

Contract
- `world_size` is the total number of ranks, `program.stages * P`; rank r is in pipeline stage
  `r // P` with tensor-parallel (tp) index `r % P`. `bindings` maps size symbols to ints; `P` is
  added (a different `P` in `bindings` is a `BindError`).
- `inputs[r]` maps input names to rank r's LOCAL data: the input type's shape evaluated with the
  bindings (a Sliced tensor's type shape is already the per-rank shape). A rank needs the inputs
  whose stage is None or its own; inputs with a `default` (hyper-parameters) may be left out.
  Values are converted to the input's dtype. Replicated inputs must be identical on all the ranks
  of a tp group. Violations raise `BindError` naming the input and the rank; a size that does
  not divide (N/P with N=6, P=4) raises the `ShapeError` of `Size.evaluate`, on one line.
- The result has one dict per rank, output name -> array, holding the outputs whose value lives on
  that rank's stage (stage None: every rank). Arrays are fresh copies.
- `program.fused` and `program.overlaps` do not change the semantics and are ignored.

Numerics
- Pointwise ops compute in the dtype's numpy type: f16 is numpy's float16; bf16 is stored as
  float32 and rounded to bf16 (round to nearest even on the bit pattern) after every op.
- Reductions (sum, mean, norm, the reduction of every collective) and matmul accumulate in
  float64 (int64 for integer and bool tensors) and are then cast to the dtype (bf16: float64 ->
  float32 -> bf16, as generated code does). Integer division truncates toward zero, and an
  integer x/0 is 0.
- tanh, erf and gelu are computed in float64 and rounded once to the dtype (numpy has no erf;
  exact gelu is 0.5 x erfc(-x / sqrt 2), approximate="tanh" is x / (1 + exp(-2u)) with
  u = sqrt(2/pi) (x + 0.044715 x^3), the same functions as torch's, written without the
  cancellation of 1 + erf(x) for negative x).
- attention is computed in float64 (`dsl.attention.attention64`) and rounded once to the dtype.
- Row ops work on the last dimension in float64, then round to float32 and then to the dtype
  (as generated code does): softmax(x) = exp(x - max) / sum exp(x - max); layer_norm(x) =
  (x - mean) * (1 / sqrt(var + eps)), var the biased mean of (x - mean)^2, both sums in float64.
- A `Const` operand (a number, or a `Size` such as 1/P evaluated as a fraction) takes the dtype of
  the tensor operands it meets.
- dropout keeps an element iff `dropout_keep(seed, global flat index, p)`, a hash of the seed and
  the element's index in the GLOBAL tensor, so a sliced and an unsliced run drop the same elements.

Communication runs within the tp group of the value's stage (ranks `stage*P .. stage*P+P-1`; each
stage's group separately for stage None); see `EVAL` for each op's rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from .attention import attention64
from .errors import BindError, DSLError, ShapeError
from .ir import Const, Program, Stmt, Value
from .ops import POINTWISE
from .printer import format_stmt
from .sizes import Size
from .types import DType, Replicated, Sliced, TensorType

# -- dtypes -------------------------------------------------------------------------------------


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.reshape(-1).view(np.uint32)
    odd = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + odd) & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = np.where(nan, (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), rounded)
    return rounded.astype(np.uint32).view(np.float32).reshape(x.shape)


def as_dtype(x, dtype: DType) -> np.ndarray:
    """`x` as an array of `dtype`'s storage type (bf16 rounded)."""
    with np.errstate(all="ignore"):
        arr = np.asarray(x).astype(dtype.numpy, copy=False)
    return round_bf16(arr) if dtype is DType.bf16 else arr


def _acc_of(x: np.ndarray) -> type:
    """The accumulation type of reductions and matmul: float64, or int64 for ints and bools."""
    return np.float64 if x.dtype.kind == "f" else np.int64


def evaluate_shape(t: TensorType, bindings: Mapping[str, int]) -> tuple[int, ...]:
    """The per-rank shape of `t` (raises ShapeError when a size does not divide)."""
    return tuple(s.evaluate(bindings) for s in t.shape)


# -- dropout's hash (reimplemented exactly by the C++ and CUDA generators) ----------------------
_GOLDEN = 0x9E3779B9


def mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit integer finaliser, in wrapping uint32 arithmetic:

    x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    """
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        x = x ^ (x >> np.uint32(16))
    return x


def dropout_keep(seed: int, index: np.ndarray, p: float) -> np.ndarray:
    """Whether dropout with probability `p` keeps the elements at global flat indices `index`.

    lo = idx & 0xffffffff;  hi = idx >> 32                       (idx: uint64)
    h  = mix32(lo ^ mix32(hi ^ mix32(seed ^ 0x9E3779B9)))        (uint32, wrapping)
    u  = (h >> 8) * 2^-24                                         (exact, in [0, 1))
    keep = u >= p,  i.e. (h >> 8) >= ceil(p * 2^24)              (integer comparison)
    """
    idx = np.asarray(index, dtype=np.uint64)
    lo = (idx & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (idx >> np.uint64(32)).astype(np.uint32)
    s = mix32(np.uint32((int(seed) & 0xFFFFFFFF) ^ _GOLDEN))
    h = mix32(lo ^ mix32(hi ^ s))
    threshold = int(np.ceil(float(p) * 2.0**24))
    return (h >> np.uint32(8)).astype(np.int64) >= threshold


def global_flat_index(local_shape: Sequence[int], layout, P: int, i: int) -> np.ndarray:
    """Row-major flat index, in the GLOBAL tensor, of every element of tp index i's local array.

    Sliced(d): the global shape is the local one with dim d times P, and local index j along d is
    global index j + i * local[d]. Local and Replicated: the global tensor is the local one.
    """
    shape = list(local_shape)
    offset = [0] * len(shape)
    glob = list(shape)
    if isinstance(layout, Sliced):
        d = layout.dim
        glob[d], offset[d] = shape[d] * P, i * shape[d]
    flat = np.zeros(tuple(shape), dtype=np.uint64)
    stride = 1
    for k in reversed(range(len(shape))):
        ax = (np.arange(shape[k], dtype=np.uint64) + np.uint64(offset[k])) * np.uint64(stride)
        flat = flat + ax.reshape((-1,) + (1,) * (len(shape) - k - 1))
        stride *= glob[k]
    return flat


# -- rules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """What a rule knows about the tp group it runs on."""

    P: int
    bindings: Mapping[str, int]


# A rule maps the operands of each rank of a tp group (args[i]: tp index i's operands, arrays for
# Values and `Const`s as they are) to each rank's result. Results are cast to the dtype after.
Rule = Callable[[Stmt, list[list], Group], list[np.ndarray]]


def piece(x: np.ndarray, dim: int, P: int, i: int) -> np.ndarray:
    """Piece i of P equal contiguous pieces of x along dim."""
    n = x.shape[dim] // P
    return np.take(x, np.arange(i * n, (i + 1) * n), axis=dim)


def _const_dtype(s: Stmt) -> DType:
    if s.op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return s.values[0].type.dtype
    return s.out.type.dtype


def _operands(s: Stmt, args: list, g: Group, i: int) -> list[np.ndarray]:
    """Rank i's operands as arrays: constants in the op's dtype, replicated ones read as slices."""
    out_t = s.out.type
    sliced = out_t.layout.dim if isinstance(out_t.layout, Sliced) and s.op in POINTWISE else None
    res = []
    for a, x in zip(s.args, args):
        if isinstance(a, Const):
            v = float(a.value.value(g.bindings)) if isinstance(a.value, Size) else a.value
            res.append(as_dtype(v, _const_dtype(s)))
            continue
        ad = None if sliced is None else sliced - (out_t.rank - a.type.rank)
        if (
            isinstance(a.type.layout, Replicated)
            and ad is not None
            and ad >= 0
            and a.type.shape[ad] != Size.of(1)
        ):
            x = piece(x, ad, g.P, i)  # pointwise with a Sliced operand: read the replicated slice
        res.append(x)
    return res


def _per_rank(fn: Callable[[Stmt, list[np.ndarray], Group, int], np.ndarray]) -> Rule:
    def rule(s, args, g):
        return [fn(s, _operands(s, a, g, i), g, i) for i, a in enumerate(args)]

    return rule


def _pw(f: Callable[..., np.ndarray]) -> Rule:
    """A pointwise op computed by numpy in the operands' dtype."""
    return _per_rank(lambda s, xs, g, i: f(*xs))


def _div(a, b):
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    a, b = np.broadcast_arrays(a, b)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)  # truncate toward zero
    return np.where(b == 0, 0, q)


def _cast(s, xs, g, i):
    return as_dtype(xs[0], s.attr("dtype"))


def _dropout(s, xs, g, i):
    (x,) = xs
    p = float(s.attr("p"))
    index = global_flat_index(x.shape, s.values[0].type.layout, g.P, i)
    keep = dropout_keep(s.attr("seed"), index, p)
    scale = as_dtype(1.0 / (1.0 - p), s.out.type.dtype)
    return np.where(keep, x * scale, np.zeros((), x.dtype))


_ERF = np.frompyfunc(math.erf, 1, 1)
_ERFC = np.frompyfunc(math.erfc, 1, 1)
GELU_TANH_2U = 2 * math.sqrt(2 / math.pi)  # 2u = GELU_TANH_2U * (x + GELU_TANH_CUBE * x^3)
GELU_TANH_CUBE = 0.044715


def _f64(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """f computed in float64 (the result is rounded to the dtype after, as every op's)."""
    return lambda x: np.asarray(f(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def gelu64(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GeLU in float64: 0.5 x erfc(-x / sqrt 2), or x / (1 + exp(-2u)) for approximate="tanh"."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        return x / (1 + np.exp(-GELU_TANH_2U * (x + GELU_TANH_CUBE * x * x * x)))
    return 0.5 * x * _ERFC(-x * math.sqrt(0.5)).astype(np.float64)


def _gelu(s, xs, g, i):
    return gelu64(xs[0], s.attr("approximate", "none"))


def _row_result(y: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A row op's float64 result, rounded to float32 first where the dtype is narrower."""
    return y.astype(np.float32) if like.dtype.itemsize < 8 else y


def _softmax(s, xs, g, i):
    x = xs[0].astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return _row_result(e / e.sum(axis=-1, keepdims=True), xs[0])


def _layer_norm(s, xs, g, i):
    x = xs[0].astype(np.float64)
    d = x - x.sum(axis=-1, keepdims=True) / x.shape[-1]
    var = (d * d).sum(axis=-1, keepdims=True) / x.shape[-1]
    return _row_result(d * (1 / np.sqrt(var + float(s.attr("eps", 1e-5)))), xs[0])


def _sum(x):
    return x.astype(_acc_of(x)).sum()


def _mean(x):
    return _sum(x) / x.size


def _norm(x):
    x64 = x.astype(np.float64)
    return np.sqrt((x64 * x64).sum())


def segment_mask(seg: np.ndarray, nseg: int) -> np.ndarray:
    """Where the ids name a segment (in [0, nseg)); other elements belong to none."""
    return (seg >= 0) & (seg < nseg)


def _segment_sum(s, xs, g, i):
    """Each segment's sum, accumulated in f64 and rounded to x's dtype (as `sum`)."""
    x, seg = xs
    k = segment_mask(seg, s.attr("nseg"))
    out = np.bincount(seg[k], weights=x[k].astype(np.float64), minlength=s.attr("nseg"))
    return out.astype(x.dtype)


def _take(s, xs, g, i):
    table, seg = xs
    k = segment_mask(seg, table.shape[0])
    return np.where(k, table[np.where(k, seg, 0)], table.dtype.type(0))


def matmul2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[.., K] x [K, H] as one 2-d product (numpy's stacked matmul would run row by row)."""
    return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[1:])


def _matmul(s, xs, g, i):
    a, b = xs
    return matmul2d(a.astype(_acc_of(a)), b.astype(_acc_of(b)))


def _attention(s, xs, g, i):
    return attention64(*xs, s.attr("head_dim"), s.attr("mask", "none") == "causal")


def _update(s, xs, g, i):
    return np.copy(xs[1])  # the target's new contents are the value's


def _slice(s, xs, g, i):
    return piece(xs[0], s.attr("dim", 0), g.P, i)


_REDUCERS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _reduced(s: Stmt, args: list[list]) -> np.ndarray:
    """The reduction (attr `op`) over the group of each rank's only operand, in the acc type."""
    xs = [a[0] for a in args]
    return _REDUCERS[s.attr("op", "sum")](np.stack([x.astype(_acc_of(x)) for x in xs]), axis=0)


def _root(s: Stmt, g: Group) -> int:
    root = s.attr("root", 0)
    if root >= g.P:
        raise BindError(f"root {root} is not a rank of a tp group of P={g.P}")
    return root


# Collectives: args[i] = [tp index i's operand]; the result list is indexed by tp index too.
def _all_reduce(s, args, g):
    """Everyone gets the reduction."""
    r = _reduced(s, args)
    return [r] * g.P


def _reduce_scatter(s, args, g):
    """Tp index i gets piece i (along `dim`) of the reduction."""
    r = _reduced(s, args)
    return [piece(r, s.attr("dim", 0), g.P, i) for i in range(g.P)]


def _all_gather(s, args, g):
    """Everyone gets the pieces concatenated in tp order along the operand's Sliced dim."""
    full = np.concatenate([a[0] for a in args], axis=s.values[0].type.layout.dim)
    return [full] * g.P


def _broadcast(s, args, g):
    """Everyone gets tp index root's array."""
    return [args[_root(s, g)][0]] * g.P


def _reduce(s, args, g):
    """Tp index root gets the reduction, the others zeros."""
    root, r = _root(s, g), _reduced(s, args)
    return [r if i == root else np.zeros_like(r) for i in range(g.P)]


def _all_to_all(s, args, g):
    """Tp index j gets piece j (along split_dim) of every rank i, concatenated in i order."""
    sd, cd = s.attr("split_dim"), s.attr("concat_dim")
    return [np.concatenate([piece(a[0], sd, g.P, j) for a in args], axis=cd) for j in range(g.P)]


def _p2p(s, args, g):
    return [a[0] for a in args]  # tp index i of the source stage -> tp index i of stage dst


EVAL: dict[str, Rule] = {
    "add": _pw(np.add),
    "sub": _pw(np.subtract),
    "mul": _pw(np.multiply),
    "div": _pw(_div),
    "pow": _pw(np.power),
    "maximum": _pw(np.maximum),
    "minimum": _pw(np.minimum),
    "lt": _pw(np.less),
    "le": _pw(np.less_equal),
    "gt": _pw(np.greater),
    "ge": _pw(np.greater_equal),
    "eq": _pw(np.equal),
    "ne": _pw(np.not_equal),
    "neg": _pw(np.negative),
    "sqrt": _pw(np.sqrt),
    "rsqrt": _pw(lambda x: np.reciprocal(np.sqrt(x))),
    "exp": _pw(np.exp),
    "tanh": _pw(_f64(np.tanh)),
    "erf": _pw(_f64(_ERF)),
    "gelu": _per_rank(_gelu),
    "where": _pw(np.where),
    "cast": _per_rank(_cast),
    "dropout": _per_rank(_dropout),
    "sum": _pw(_sum),
    "mean": _pw(_mean),
    "norm": _pw(_norm),
    "segment_sum": _per_rank(_segment_sum),
    "take": _per_rank(_take),
    "softmax": _per_rank(_softmax),
    "layer_norm": _per_rank(_layer_norm),
    "matmul": _per_rank(_matmul),
    "attention": _per_rank(_attention),
    "slice": _per_rank(_slice),
    "update": _per_rank(_update),
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_to_all": _all_to_all,
    "p2p": _p2p,
}


# -- the interpreter ------------------------------------------------------------------------------
def bind(
    program: Program, world_size: int, bindings: Optional[Mapping[str, int]]
) -> tuple[int, dict]:
    """(P, bindings with P) for `program` on `world_size` ranks."""
    if (
        not isinstance(world_size, (int, np.integer))
        or isinstance(world_size, bool)
        or world_size < 1
        or world_size % program.stages
    ):
        raise BindError(
            f"world size {world_size!r} is not a positive multiple of the "
            f"{program.stages} pipeline stage(s) of program {program.name}"
        )
    P = int(world_size) // program.stages
    bound = dict(bindings or {})
    if bound.get("P", P) != P:
        raise BindError(
            f"bindings give P={bound['P']} but world size {world_size} with "
            f"{program.stages} stage(s) gives P={P}"
        )
    for k, v in bound.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v < 1:
            raise BindError(
                f"size {k}={v!r} of program {program.name}: sizes bind to positive integers"
            )
    bound["P"] = P
    return P, bound


def _lives(stage: Optional[int], rank_stage: int) -> bool:
    return stage is None or stage == rank_stage


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _load(program: Program, inputs: Sequence[Mapping], P: int, bound: dict) -> list[dict]:
    world = P * program.stages
    if len(inputs) != world:
        raise BindError(f"{len(inputs)} input dicts given for a world size of {world}")
    names = {i.value.name for i in program.inputs}
    env: list[dict[int, np.ndarray]] = [{} for _ in range(world)]
    for r, given in enumerate(inputs):
        if set(given) - names:
            raise BindError(
                f"rank {r}: {sorted(set(given) - names)} are not inputs of {program.name}"
            )
        for inp in program.inputs:
            v = inp.value
            if not _lives(v.type.stage, r // P):
                continue
            try:
                shape = evaluate_shape(v.type, bound)
            except DSLError as e:
                raise type(e)(f"input {v.name} ({v.type}): {e}") from None
            if v.name in given:
                x = given[v.name]
            elif inp.default is not None:
                x = inp.default
            else:
                raise BindError(f"input {v.name} ({v.type}) is missing on rank {r}")
            if np.shape(x) != shape:
                raise BindError(
                    f"input {v.name} on rank {r} has shape {list(np.shape(x))}, "
                    f"expected {list(shape)} ({v.type})"
                )
            env[r][v.id] = as_dtype(x, v.type.dtype)
            first = (r // P) * P
            if isinstance(v.type.layout, Replicated) and not _same(env[first][v.id], env[r][v.id]):
                raise BindError(
                    f"replicated input {v.name} differs between rank {first} and rank {r}"
                )
    return env


def _run(s: Stmt, program: Program, P: int, bound: dict, env: list[dict]) -> None:
    rule = EVAL.get(s.op)
    if rule is None:
        raise DSLError(f"{format_stmt(s)}: interpret rule for {s.op} not implemented")
    try:
        shape = evaluate_shape(s.out.type, bound)
    except DSLError as e:
        raise type(e)(f"{format_stmt(s)}: {e}") from None
    src = s.values[0].type.stage if s.op == "p2p" else s.out.type.stage
    g = Group(P, bound)
    for stage in range(program.stages) if src is None else [src]:
        ranks = range(stage * P, stage * P + P)
        args = [[env[r][a.id] if isinstance(a, Value) else a for a in s.args] for r in ranks]
        try:
            outs = rule(s, args, g)
        except DSLError as e:
            raise type(e)(f"{format_stmt(s)}: {e}") from None
        dst = s.attr("dst") if s.op == "p2p" else stage
        for i, out in enumerate(outs):
            out = as_dtype(out, s.out.type.dtype)
            if out.shape != shape:
                raise ShapeError(
                    f"{format_stmt(s)}: computed shape {list(out.shape)} on tp index {i}"
                    f" differs from the type's {list(shape)}"
                )
            env[dst * P + i][s.out.id] = out


def interpret(
    program: Program,
    inputs: Sequence[Mapping[str, np.ndarray]],
    world_size: int,
    bindings: Optional[Mapping[str, int]] = None,
) -> list[dict[str, np.ndarray]]:
    """Run `program` on `world_size` simulated ranks; see the module docstring for the contract."""
    P, bound = bind(program, world_size, bindings)
    env = _load(program, inputs, P, bound)
    with np.errstate(all="ignore"):
        for s in program.body:
            _run(s, program, P, bound, env)
    return [
        {
            name: np.array(env[r][v.id], copy=True)
            for name, v in program.outputs
            if _lives(v.type.stage, r // P)
        }
        for r in range(world_size)
    ]


__all__ = [
    "interpret",
    "EVAL",
    "matmul2d",
    "gelu64",
    "Rule",
    "Group",
    "bind",
    "as_dtype",
    "round_bf16",
    "mix32",
    "dropout_keep",
    "global_flat_index",
    "piece",
    "evaluate_shape",
]
