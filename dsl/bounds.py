"""`error_bounds`: per element, how far a floating-point run of a program may be from its exact value.

    bounds = error_bounds(program, inputs, world_size, bindings)   # one dict per rank
    bounds[r]["out"].value, bounds[r]["out"].error                 # exact value, bound on |computed - value|

A run "computes" the program when every op rounds its result to the op's dtype, in any evaluation
order of its sums (a matmul's inner products in any blocking, a collective's reduction in any ring
order, a chunked reduce-scatter, a fused kernel with FMA). `value` is the exact result (float64
for float dtypes, exact for integers and bools, the inputs taken as given); `error` (float64,
>= 0; for bools 1 where the result may flip) bounds |computed - value| element by element. Two
runs of equivalent schedules then agree within `error_a + error_b` (`within` checks that).

The rules, one per op kind, are `dsl.bound_rules` (`ERROR`, `gamma`): its docstring states them.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from .bound_rules import (
    COMM_ERROR,
    ERROR,
    LAMBDA,
    POINTWISE_ERROR,
    REDUCE_ERROR,
    ROUNDS,
    ROW_ERROR,
    ULPS,
    Bound,
    gamma,
)
from .errors import BindError, DSLError
from .interpret import (
    EVAL,
    Group,
    _load,
    _operands,
    as_dtype,
    bind,
    evaluate_shape,
)
from .ir import Const, Program, Stmt, Value
from .ops import COMPARE
from .printer import format_stmt
from .sizes import Size
from .types import DType, Replicated


# -- the interpreter ------------------------------------------------------------------------------
def _exact(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" else x


def rounding_error(c: float, dtype: DType) -> np.ndarray:
    """|c - c rounded to dtype|: how far a constant is from the dtype's copy of it."""
    c = float(c)
    if not dtype.is_float or not math.isfinite(c):
        return np.asarray(0.0)
    return np.asarray(abs(c - float(as_dtype(c, dtype))))


def _const_error(a: Const, s: Stmt, g: Group) -> np.ndarray:
    dt = s.values[0].type.dtype if s.op in COMPARE else s.out.type.dtype
    return rounding_error(a.value.value(g.bindings) if isinstance(a.value, Size) else a.value, dt)


def _local(s: Stmt, vals: list, errs: list, g: Group, i: int) -> tuple[list, list]:
    """Rank i's operand values and errors as the op reads them (replicated ones sliced)."""
    v = _operands(s, vals, g, i)
    e = _operands(s, errs, g, i)
    e = [_const_error(a, s, g) if isinstance(a, Const) else x for a, x in zip(s.args, e)]
    return [_exact(x) for x in v], e


def _cast_value(s: Stmt, x: np.ndarray) -> np.ndarray:
    to = s.attr("dtype")
    return np.asarray(x, dtype=np.float64) if to.is_float else as_dtype(x, to)


def _compute(s: Stmt, vals: list[list], errs: list[list], g: Group) -> tuple[list, list]:
    """Each rank's exact result and its error bound, for one statement on one tp group."""
    if s.op in COMM_ERROR:
        return [_exact(x) for x in EVAL[s.op](s, vals, g)], COMM_ERROR[s.op](s, vals, errs, g)
    if isinstance(s.out.type.layout, Replicated) and g.P > 1:  # the same on every rank
        outs, errors = _compute(s, vals[:1], errs[:1], Group(1, g.bindings))
        return outs * g.P, errors * g.P
    U = s.out.type.dtype.eps
    rule = POINTWISE_ERROR.get(s.op) or REDUCE_ERROR.get(s.op) or ROW_ERROR[s.op]
    local = [_local(s, vals[i], errs[i], g, i) for i in range(g.P)]
    if s.op == "cast":
        outs = [_cast_value(s, v[0]) for v, _ in local]
    else:
        outs = [_exact(x) for x in EVAL[s.op](s, vals, g)]
    errors = []
    for r, (v, e) in zip(outs, local):
        with np.errstate(all="ignore"):
            err = np.asarray(rule(s, v, e, r, U), dtype=np.float64)
            if s.op in ROUNDS or s.op in REDUCE_ERROR:  # its own rounding to the dtype
                err = err + ULPS.get(s.op, 1) * U * (np.abs(r) + err)
        errors.append(np.broadcast_to(err, np.shape(r)))
    return outs, errors


def _start(
    program: Program,
    inputs: Sequence[Mapping],
    P: int,
    bound: dict,
    errors: Optional[Sequence[Mapping]],
) -> tuple[list[dict], list[dict]]:
    """Each rank's input values (as given: floats widened, not rounded) and input errors."""
    env = _load(program, inputs, P, bound)  # checks names, shapes and replication
    vals: list[dict] = [{} for _ in env]
    errs: list[dict] = [{} for _ in env]
    for r, given in enumerate(inputs):
        for inp in program.inputs:
            v = inp.value
            if v.id not in env[r]:
                continue
            x = env[r][v.id]
            if v.type.dtype.is_float and v.name in given:
                x = np.asarray(given[v.name], dtype=np.float64)
            vals[r][v.id] = _exact(x)
            hyper = inp.default is not None and v.name not in given
            errs[r][v.id] = (
                rounding_error(inp.default, v.type.dtype) if hyper else np.zeros(np.shape(x))
            )
            if errors is not None and v.name in errors[r]:
                e = np.asarray(errors[r][v.name], dtype=np.float64)
                if e.shape != np.shape(x) or not np.all(e >= 0):
                    raise BindError(
                        f"error bound of input {v.name} on rank {r} must be >= 0 with "
                        f"shape {list(np.shape(x))}, got shape {list(e.shape)}"
                    )
                errs[r][v.id] = e
    return vals, errs


def _last_uses(program: Program) -> dict[int, int]:
    """Value id -> index of the last statement reading it (outputs never expire)."""
    last = {a.id: k for k, s in enumerate(program.body) for a in s.values}
    for _, v in program.outputs:
        last[v.id] = len(program.body)
    return last


def error_bounds(
    program: Program,
    inputs: Sequence[Mapping[str, np.ndarray]],
    world_size: int,
    bindings: Optional[Mapping[str, int]] = None,
    errors: Optional[Sequence[Mapping[str, np.ndarray]]] = None,
) -> list[dict[str, Bound]]:
    """Per rank, output name -> `Bound` (exact value, error bound); see the module docstring.

    `inputs` are what `interpret` takes (float inputs may be given in float64: they are used as
    they are, not rounded); `errors[r]` optionally gives a bound on how far rank r's input may
    already be from its exact value (to chain steps). Hyper-parameters left to their default
    carry their rounding to the dtype, |default - fl(default)|.
    """
    P, bound = bind(program, world_size, bindings)
    vals, errs = _start(program, inputs, P, bound, errors)
    last = _last_uses(program)
    with np.errstate(all="ignore"):
        for k, s in enumerate(program.body):
            _step(s, program, P, bound, vals, errs)
            for a in {a.id for a in s.values if last.get(a.id, -1) == k}:
                for r in range(len(vals)):
                    vals[r].pop(a, None), errs[r].pop(a, None)
    return [
        {
            name: Bound(vals[r][v.id], errs[r][v.id])
            for name, v in program.outputs
            if v.id in vals[r]
        }
        for r in range(world_size)
    ]


def _step(s: Stmt, program: Program, P: int, bound: dict, vals: list, errs: list) -> None:
    if s.op not in ERROR:
        raise DSLError(f"{format_stmt(s)}: error rule for {s.op} not implemented")
    shape = evaluate_shape(s.out.type, bound)
    src = s.values[0].type.stage if s.op == "p2p" else s.out.type.stage
    g = Group(P, bound)
    for stage in range(program.stages) if src is None else [src]:
        ranks = range(stage * P, stage * P + P)
        v_args = [[vals[r][a.id] if isinstance(a, Value) else a for a in s.args] for r in ranks]
        e_args = [[errs[r][a.id] if isinstance(a, Value) else a for a in s.args] for r in ranks]
        try:
            outs, bounds = _compute(s, v_args, e_args, g)
        except DSLError as e:
            raise type(e)(f"{format_stmt(s)}: {e}") from None
        dst = s.attr("dst") if s.op == "p2p" else stage
        for i, (out, err) in enumerate(zip(outs, bounds)):
            vals[dst * P + i][s.out.id] = np.broadcast_to(out, shape)
            errs[dst * P + i][s.out.id] = np.broadcast_to(err, shape)


def within(got: np.ndarray, ref: np.ndarray, error: np.ndarray) -> tuple[float, int]:
    """(max |got - ref|, number of elements where |got - ref| > error).

    NaN equals NaN, infinities must match exactly unless the error is infinite; integers and
    bools compare in integer units (their error is 0 unless a cast may have moved them)."""
    g, r = np.asarray(got), np.asarray(ref)
    if g.dtype.kind in "biu" and r.dtype.kind in "biu":
        diff = np.abs(g.astype(np.int64) - r.astype(np.int64)).astype(np.float64)
    else:
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        same = (g64 == r64) | (np.isnan(g64) & np.isnan(r64))
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(g64 - r64))
        diff = np.where(np.isnan(diff), np.inf, diff)
    err = np.broadcast_to(np.asarray(error, dtype=np.float64), diff.shape)
    bad = (diff > err) & ~np.isinf(err)
    return float(diff.max(initial=0.0)), int(np.count_nonzero(bad))


def runs_agree(
    got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], bounds: Mapping[str, Bound]
) -> bool:
    """Two computed runs of one program (or of equivalent schedules) agree on one rank: the same
    output names, and every element within twice its error bound from `error_bounds` on the
    same inputs (each run is within the bound of the exact value)."""
    return set(got) == set(ref) <= set(bounds) and all(
        within(got[k], ref[k], 2 * bounds[k].error)[1] == 0 for k in ref
    )


__all__ = ["Bound", "ERROR", "LAMBDA", "error_bounds", "gamma", "runs_agree", "within"]
