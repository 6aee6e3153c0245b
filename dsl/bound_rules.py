"""The error rules of `dsl.bounds`, one per op kind (`ERROR`): how an op propagates its operands'
error bounds and adds its own rounding. `gamma(n, dtype)` is a sum's relative bound.

Rules (one per op kind in `ERROR`, `U = eps(dtype)`, twice the unit roundoff: an op may be one
ulp off; exp, pow and rsqrt, library functions, 4 U (`ULPS`)):
- a pointwise op propagates its operands' errors by the op's derivative bound (add: ea + eb; mul:
  |a| eb + |b| ea + ea eb; div, sqrt, rsqrt, exp, pow: exact bounds of the function over the
  interval the operand may lie in) and adds `U * (|result| + propagated)` for its own rounding
  (times `ULPS[op]`);
  a constant operand, or a hyper-parameter left to its default, carries |c - fl(c)|, its
  rounding to the dtype (a run may use it rounded or in double precision).
- a sum of n terms t_k (reductions: n elements; matmul: n = K products x_ik w_kj; a collective
  reduction: n = P ranks; two ranks' one addition rounds as a pointwise add) adds
  `gamma(n) * sum_k |t_k|` with, u = U / 2 the unit roundoff,
  `gamma(n) = min((n - 1) * u / (1 - (n - 1) * u), LAMBDA * sqrt(n) * u)`. The first is the
  worst case (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1); the second the
  probabilistic bound of Higham and Mary (SIAM J. Sci. Comput. 2019, Thm 3.1), which holds for
  any order with probability at least 1 - 2n exp(-LAMBDA^2 / 2) when rounding errors are
  independent and mean zero (LAMBDA = 8: 2.5e-14 n per element). It grows as sqrt(n), not n:
  a matmul with K = 4096 gets 512 u sum_k |x_ik||w_kj| where the worst case gives 4095 u.
- tanh and erf (increasing): the exact spread of the function over [a - ea, a + ea]; gelu:
  1.13 ea (its derivative lies in [-0.17, 1.13]; the tanh form's too) plus the rounding of its
  argument, amplified where the result is small: U |r| x^2 for x < 0 (erfc's), U |r| 4 |2u| (the
  tanh form's exp), and underflow: (2 + |x|) subnormal spacings, all of |r| where the tanh
  form's exp(-2u) overflows; tanh and erf are 4 U library functions, gelu 8 U.
- row ops compute in float64 (`UA`) and round once (twice for f16/bf16) to the dtype. softmax:
  softmax(x + d)_i / softmax(x)_i lies within exp(+-(ea_i + max_j ea_j)), so the propagated
  error is |r| expm1(ea_i + max ea) plus float64's roundings. layer_norm: the centred value
  x_i - mean is off by ed_i = ea_i + mean(ea) (+ roundings); the variance by
  ev = mean(2 |d| ed + ed^2) (+ the sum's gamma); with s in [sqrt(var + eps - ev),
  sqrt(var + eps + ev)] = [lo, hi], |y' - y| <= ed / lo + |d| (1 / lo - 1 / hi) (inf if lo <= 0).
- attention: the two products and the softmax between them, bounded as above per (batch, head)
  (`dsl.attention`'s doc), then its own rounding.
- max, min, neg, copies and the data movement of collectives do not round: errors move with
  the data (max of errors for a max-reduction).
- comparisons may flip where |a - b| <= ea + eb; `where` with such a condition takes the larger
  operand error plus |a - b| there; a cast to an integer may be off by ceil(e) + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .attention import attention_error
from .interpret import (
    _ERF,
    EVAL,
    GELU_TANH_2U,
    GELU_TANH_CUBE,
    Group,
    matmul2d,
    segment_mask,
)
from .ir import Stmt
from .ops import COMPARE
from .types import DType

LAMBDA = 8.0  # the probabilistic bound's confidence parameter (see the module docstring)


@dataclass(frozen=True)
class Bound:
    """An element-wise exact value and a bound on how far a computed run may be from it."""

    value: np.ndarray
    error: np.ndarray


def gamma(n: int, dtype: DType) -> float:
    """The relative error bound of a sum of n terms in `dtype`, in units of sum |terms|."""
    return gamma_u(n, dtype.eps)


def gamma_u(n: int, U: float) -> float:
    """`gamma(n)` for a dtype whose eps is U (unit roundoff u = U / 2)."""
    u = U / 2
    if n <= 1 or u == 0:
        return 0.0
    worst = (n - 1) * u / (1 - (n - 1) * u) if (n - 1) * u < 1 else math.inf
    return min(worst, LAMBDA * math.sqrt(n) * u)


# -- pointwise rules: (stmt, operand values, operand errors, result, U) -> propagated error -----
PwRule = Callable[[Stmt, list, list, np.ndarray, float], np.ndarray]


def _add(s, v, e, r, U):
    return e[0] + e[1]


def _mul(s, v, e, r, U):
    return np.abs(v[0]) * e[1] + np.abs(v[1]) * e[0] + e[0] * e[1]


def _div(s, v, e, r, U):
    a, b = v
    if np.issubdtype(np.asarray(r).dtype, np.integer):  # truncation may move by one more
        return _int_div(a, b, e)
    room = np.abs(b) - e[1]
    with np.errstate(all="ignore"):
        out = (e[0] + np.abs(r) * e[1]) / room
    return np.where(room > 0, out, np.where((e[0] == 0) & (e[1] == 0), 0.0, np.inf))


def _int_div(a, b, e):
    spread = e[0] + e[1]
    return np.where(spread == 0, 0.0, np.inf)  # integer operands carry errors only after a cast


def _pow(s, v, e, r, U):
    a, b = np.abs(v[0]), np.abs(v[1])
    with np.errstate(all="ignore"):
        rel = np.where(e[0] == 0, 0.0, e[0] / a)
        log_a = np.where(e[1] == 0, 0.0, np.abs(np.log(a)))
        t = b * rel / (1 - rel) + e[1] * (log_a + rel / (1 - rel))
        out = np.abs(r) * np.expm1(t)
    return np.where(rel < 0.5, np.where(t == 0, 0.0, out), np.inf)


def _nonexpansive(s, v, e, r, U):
    return np.maximum(e[0], e[1]) if len(e) > 1 else e[0]


def _sqrt(s, v, e, r, U):
    a, ea = v[0], e[0]
    with np.errstate(all="ignore"):
        inside = ea / (np.sqrt(np.maximum(a, 0)) + np.sqrt(np.maximum(a - ea, 0)))
        edge = np.sqrt(np.maximum(a, 0) + ea)
    return np.where(ea == 0, 0.0, np.where(a > ea, inside, edge))


def _rsqrt(s, v, e, r, U):
    rel = np.where(e[0] == 0, 0.0, e[0] / np.abs(v[0]))
    with np.errstate(all="ignore"):
        out = np.abs(r) * ((1 - rel) ** -0.5 - 1)
    return np.where(rel == 0, 0.0, np.where(rel < 1, out, np.inf))


def _exp(s, v, e, r, U):
    with np.errstate(over="ignore"):
        return np.abs(r) * np.expm1(e[0])


# The spacing of a dtype's subnormals (by its eps): a result rounded into them is off by up to
# half of it, not by U |r|; the rules of ops whose results may be tiny add it.
SUBNORMAL = {
    DType.f16.eps: 2.0**-24,
    DType.bf16.eps: 2.0**-133,
    DType.f32.eps: 2.0**-149,
    DType.f64.eps: 2.0**-1074,
}


def _monotone(f: Callable[[np.ndarray], np.ndarray]) -> PwRule:
    """An increasing function's exact spread over [a - ea, a + ea] (plus underflow)."""

    def rule(s, v, e, r, U):
        a, ea = v[0], e[0]
        out = np.maximum(np.abs(f(a + ea) - r), np.abs(r - f(a - ea)))
        return np.where(ea == 0, 0.0, out) + SUBNORMAL.get(U, 0.0)

    return rule


GELU_LIPSCHITZ = 1.13  # max |gelu'(x)| = 1.1289 (at x = 1.41); the tanh form's: 1.1296


def _gelu(s, v, e, r, U):
    x = v[0]
    if s.attr("approximate", "none") == "tanh":
        two_u = GELU_TANH_2U * (x + GELU_TANH_CUBE * x * x * x)
        arg = 4 * np.abs(two_u)
        # exp(-2u) overflows the compute type (f32 for f16/bf16/f32) and the result is 0
        lost = np.where(-two_u > (709.0 if U == DType.f64.eps else 88.0), np.abs(r), 0.0)
    else:
        arg, lost = np.where(x < 0, x * x, 0.0), 0.0
    under = (2 + np.abs(x)) * SUBNORMAL.get(U, 0.0)  # 0.5 x erfc(t), erfc(t) subnormal
    return GELU_LIPSCHITZ * e[0] + U * np.abs(r) * arg + under + lost


# -- row ops (over the last axis, computed in float64) ------------------------------------------
UA = DType.f64.eps


def _rows(v: list, e: list) -> tuple[np.ndarray, np.ndarray, int]:
    x = v[0]
    return x, np.broadcast_to(e[0], x.shape), x.shape[-1]


def _softmax(s, v, e, r, U):
    x, ex, n = _rows(v, e)
    own = (np.abs(x - x.max(axis=-1, keepdims=True)) + 4) * UA  # x - max rounded; exp
    rel = np.expm1(ex + ex.max(axis=-1, keepdims=True)) + own + own.max(axis=-1, keepdims=True)
    rel = rel + gamma_u(n, UA) + 2 * UA  # the sum; the division
    return np.abs(r) * rel * (1 + rel) + SUBNORMAL.get(U, 0.0)


def _layer_norm(s, v, e, r, U):
    x, ex, n = _rows(v, e)
    g, eps = gamma_u(n, UA), float(s.attr("eps", 1e-5))
    mean = x.sum(axis=-1, keepdims=True) / n
    d = x - mean
    var = (d * d).sum(axis=-1, keepdims=True) / n
    em = ex.mean(axis=-1, keepdims=True) + g * (np.abs(x) + ex).mean(axis=-1, keepdims=True)
    em = em + 2 * UA * np.abs(mean)
    ed = ex + em + UA * (np.abs(d) + ex + em)  # x_i - mean, rounded
    ev = (2 * np.abs(d) * ed + ed * ed).mean(axis=-1, keepdims=True)
    ev = ev + (g + UA) * ((np.abs(d) + ed) ** 2).mean(axis=-1, keepdims=True)
    ev = ev + 3 * UA * (var + eps + ev)  # the division by n, + eps
    lo, hi = np.sqrt(np.maximum(var + eps - ev, 0)), np.sqrt(var + eps + ev)
    out = ed / lo + np.abs(d) * (1 / lo - 1 / hi)
    out = out + 4 * UA * (np.abs(r) + out)  # sqrt, 1 / sqrt, the product
    return np.where(lo > 0, out + SUBNORMAL.get(U, 0.0), np.inf)


ROW_ERROR: dict[str, PwRule] = {"softmax": _softmax, "layer_norm": _layer_norm}


def _compare(s, v, e, r, U):
    a, b = np.broadcast_arrays(v[0], v[1])
    slack = e[0] + e[1]
    return ((slack > 0) & (np.abs(a - b) <= slack)).astype(np.float64)


def _where(s, v, e, r, U):
    c, a, b = v
    flip = e[0] > 0
    inner = np.where(c, e[1], e[2])
    return np.where(flip, np.maximum(e[1], e[2]) + np.abs(a - b), inner)


def _cast(s, v, e, r, U):
    to, x, ex = s.attr("dtype"), v[0], e[0]
    if to is DType.bool:
        return ((ex > 0) & (np.abs(x) <= ex)).astype(np.float64)
    if not to.is_float and np.asarray(x).dtype.kind == "f":
        return np.where(ex > 0, np.ceil(ex) + 1, 0.0)
    return ex  # the rounding to `to` is added as for every op that rounds


def _dropout(s, v, e, r, U):
    p = float(s.attr("p"))
    keep = (r != 0) | (v[0] == 0)
    return np.where(keep, e[0] / (1 - p), 0.0)


def _take(s, v, e, r, U):
    """Exact: each element carries its segment's error (0 outside every segment)."""
    seg = np.asarray(v[1]).astype(np.int64)
    k = segment_mask(seg, np.shape(e[0])[0])
    return np.where(k, e[0][np.where(k, seg, 0)], 0.0)


ROUNDS = ("add", "sub", "mul", "div", "pow", "sqrt", "rsqrt", "exp", "cast", "dropout")
ROUNDS += ("tanh", "erf", "gelu", "softmax", "layer_norm")
ULPS = {"exp": 4, "pow": 4, "rsqrt": 4, "tanh": 4, "erf": 4, "gelu": 8}
# library functions: vectorised exp/pow (numpy's f32 pow measured 2.6 eps), rsqrt as 1/sqrt or
# CUDA's rsqrtf (2 ulp), tanhf/erff (CUDA: 2 ulp), gelu's erfcf (CUDA: 4 ulp) and its products;
# IEEE ops are correctly rounded
POINTWISE_ERROR: dict[str, PwRule] = {
    "add": _add,
    "sub": _add,
    "mul": _mul,
    "div": _div,
    "pow": _pow,
    "maximum": _nonexpansive,
    "minimum": _nonexpansive,
    "neg": _nonexpansive,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "exp": _exp,
    "tanh": _monotone(np.tanh),
    "erf": _monotone(lambda x: _ERF(x).astype(np.float64)),
    "gelu": _gelu,
    "where": _where,
    "cast": _cast,
    "dropout": _dropout,
    "take": _take,
    **{k: _compare for k in COMPARE},
}


# -- reductions and matmul: (stmt, operand values, operand errors, result, U) -> error ----------
def _sum_error(x, e, U):
    n = max(int(np.size(x)), 1)
    prop = float(np.sum(e))
    return prop + gamma_u(n, U) * (float(np.sum(np.abs(x))) + prop)


def _sum(s, v, e, r, U):
    return np.asarray(_sum_error(v[0], e[0], U))


def _mean(s, v, e, r, U):
    return np.asarray(_sum_error(v[0], e[0], U) / max(int(np.size(v[0])), 1))


def _norm(s, v, e, r, U):
    x, ex = np.abs(v[0]), e[0]
    n = max(int(np.size(x)), 1)
    sq = float(np.sum(x * x))
    prop = float(np.sum(2 * x * ex + ex * ex))
    es = prop + gamma_u(n, U) * (sq + prop)
    return _sqrt(s, [np.asarray(sq)], [np.asarray(es)], r, U)


def _segment_sum(s, v, e, r, U):
    """Each segment's `sum` bound, over its own elements (ids outside [0, nseg) in none)."""
    (x, seg), ex, nseg = v, e[0], s.attr("nseg")
    seg = np.asarray(seg).astype(np.int64)
    return np.array([_sum_error(x[seg == k], ex[seg == k], U) for k in range(nseg)])


def _matmul(s, v, e, r, U):
    a, b = np.abs(v[0]), np.abs(v[1])
    ea, eb = e
    g = gamma_u(a.shape[-1], U)
    if not ea.any() and not eb.any():
        return g * matmul2d(a, b)  # the |x| @ |w| pass
    prop = matmul2d(a, eb) + matmul2d(ea, b) + matmul2d(ea, eb)
    return prop + g * matmul2d(a + ea, b + eb)


def _attention(s, v, e, r, U):
    """`dsl.attention.attention_error`: matmul, softmax and matmul bounded as above."""
    d, causal = s.attr("head_dim"), s.attr("mask", "none") == "causal"
    return attention_error(v, e, r, U, d, causal, gamma_u, SUBNORMAL.get(U, 0.0))


REDUCE_ERROR: dict[str, PwRule] = {
    "sum": _sum,
    "mean": _mean,
    "norm": _norm,
    "segment_sum": _segment_sum,
    "matmul": _matmul,
    "attention": _attention,
}


# -- communication and data movement: (stmt, values per rank, errors per rank, group) -> errors --
CommRule = Callable[[Stmt, list[list], list[list], Group], list[np.ndarray]]


def _moves(s, vals, errs, g):
    """Data movement: errors go where the data goes."""
    return EVAL[s.op](s, errs, g)


def _with_op(s: Stmt, op: str) -> Stmt:
    return Stmt(
        s.out,
        s.op,
        s.args,
        tuple((k, op if k == "op" else v) for k, v in s.attrs)
        + (() if s.attr("op") is not None else (("op", op),)),
    )


def _reduces(s, vals, errs, g):
    """A reduction over the group (all_reduce, reduce_scatter, reduce) in any order."""
    op = s.attr("op", "sum")
    if op in ("max", "min"):
        return EVAL[s.op](_with_op(s, "max"), errs, g)
    U = s.out.type.dtype.eps
    wide = [[np.abs(v[0]) + e[0]] for v, e in zip(vals, errs)]
    if op == "prod":
        exact = [[np.abs(v[0])] for v in vals]
        hi, lo = EVAL[s.op](s, wide, g), EVAL[s.op](s, exact, g)
        return [h - low + gamma_u(g.P, U) * h for h, low in zip(hi, lo)]
    moved = EVAL[s.op](s, errs, g)
    if g.P == 2:  # one addition: rounded relative to its result, as a pointwise add
        sums = EVAL[s.op](s, vals, g)
        return [m + U * (np.abs(r) + m) for m, r in zip(moved, sums)]
    mags = EVAL[s.op](s, wide, g)
    return [m + gamma_u(g.P, U) * w for m, w in zip(moved, mags)]


COMM_ERROR: dict[str, CommRule] = {
    "slice": _moves,
    "update": _moves,
    "all_gather": _moves,
    "broadcast": _moves,
    "all_to_all": _moves,
    "p2p": _moves,
    "all_reduce": _reduces,
    "reduce_scatter": _reduces,
    "reduce": _reduces,
}
ERROR = {**POINTWISE_ERROR, **REDUCE_ERROR, **ROW_ERROR, **COMM_ERROR}
