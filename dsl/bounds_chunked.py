"""`error_bounds` of an elementwise program, evaluated a chunk of its elements at a time.

    bounds = chunked_error_bounds(program, inputs, world_size, bindings)   # as `error_bounds`
    errors = chunked_errors(program, inputs, world_size, bindings, rank)   # {output: f32 bound}

The same bounds as `dsl.error_bounds` (same rules, same inputs and `errors=` to chain steps), in
memory that does not grow with the program's intermediates: `error_bounds` holds every live
intermediate of every rank as whole float64 arrays (a data-parallel optimizer step at 2^25
elements: several GB per step), these hold one chunk of `chunk` elements of them at a time, plus
the outputs asked for.

A program qualifies (`chunk_symbol` names why not) when it has one pipeline stage, every tensor
it computes is 0-d or 1-d with the same length `[S]` for one size symbol S (the elements), no
constant is S, and no op depends on an element's position (dropout). Then an element's bound
depends on that element on every rank and on 0-d values alone; the 0-d values that reduce a 1-d
one (sum, mean, norm) are accumulated over the chunks in one pass and finished as `error_bounds`
finishes them (the same terms: n, sum |x|, sum of the errors), and the next pass uses them
(LAMB's two norms: two passes; Adam: one). Chunks bind S to the chunk's length.

`chunked_errors` keeps one rank's output errors only, in float32 rounded up (never below the
float64 bound): 4 bytes per element per output, what a measured point's check holds.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from .bound_rules import ULPS, Bound, _sqrt, gamma_u
from .bounds import _last_uses, _start, _step
from .errors import DSLError
from .interpret import bind
from .ir import Const, Program, Value
from .ops import LIBRARY, ROW
from .sizes import Size

CHUNK = 1 << 20  # elements per chunk: a few float64 arrays of 8 MB per live intermediate
ACCUMULATED = ("sum", "mean", "norm")  # reductions of the 1-d elements to 0-d


def chunk_symbol(program: Program) -> tuple[Optional[str], str]:
    """(S, "") where the program qualifies for chunked bounds (see the module), else (None,
    why not)."""
    if program.stages != 1:
        return None, f"{program.stages} pipeline stages"
    lengths = {v.type.shape for v in _values(program) if v.type.shape}
    one = next(iter(lengths)) if len(lengths) == 1 else None
    if (
        one is None
        or len(one) != 1
        or len(Size.of(one[0]).powers) != 1
        or Size.of(one[0]).powers[0][1] != 1
        or Size.of(one[0]).coeff != 1
    ):
        return None, f"tensors of shapes {sorted(map(str, lengths))}, not one [S]"
    S = Size.of(one[0]).powers[0][0]
    for s in program.body:
        if s.op == "dropout":
            return None, "dropout depends on the element's position"
        if s.op in ROW:
            return None, f"{s.op} reads whole rows"
        if any(
            isinstance(a, Const) and isinstance(a.value, Size) and S in a.value.symbols()
            for a in s.args
        ):
            return None, f"a constant of size {S}"
        if s.op in LIBRARY or (
            s.values
            and not s.out.type.shape
            and s.op not in ACCUMULATED
            and any(a.type.shape for a in s.values)
        ):
            return None, f"{s.op} of the elements"
    return S, ""


def _values(program: Program) -> list[Value]:
    return [i.value for i in program.inputs] + [s.out for s in program.body]


def chunked_error_bounds(
    program: Program,
    inputs: Sequence[Mapping[str, np.ndarray]],
    world_size: int,
    bindings: Optional[Mapping[str, int]] = None,
    errors: Optional[Sequence[Mapping[str, np.ndarray]]] = None,
    chunk: int = CHUNK,
) -> list[dict[str, Bound]]:
    """`error_bounds(program, inputs, world_size, bindings, errors)`, chunk by chunk."""
    out = _run(
        program, inputs, world_size, bindings, errors, chunk, range(world_size), True, np.float64
    )
    return [{k: Bound(v, e) for k, (v, e) in rank.items()} for rank in out]


def chunked_errors(
    program: Program,
    inputs: Sequence[Mapping[str, np.ndarray]],
    world_size: int,
    bindings: Optional[Mapping[str, int]],
    rank: int,
    errors: Optional[Sequence[Mapping[str, np.ndarray]]] = None,
    chunk: int = CHUNK,
) -> dict[str, np.ndarray]:
    """Rank `rank`'s output name -> error bound (float32, rounded up), chunk by chunk."""
    out = _run(program, inputs, world_size, bindings, errors, chunk, [rank], False, np.float32)
    return {k: e for k, (_, e) in out[0].items()}


def _run(program, inputs, world_size, bindings, errors, chunk, ranks, keep_values, err_dtype):
    S, why = chunk_symbol(program)
    if S is None:
        raise DSLError(
            f"program {program.name}: chunked error bounds need an elementwise program ({why})"
        )
    P, bound = bind(program, world_size, bindings)
    if S not in bound:
        raise DSLError(f"program {program.name}: size symbol {S} is not bound")
    n, chunk = int(bound[S]), max(1, int(chunk))
    known: dict[int, list] = {}  # reduction's value id -> per rank (value, error), finished
    outs = _outputs(program, ranks, n, keep_values, err_dtype)
    while True:
        acc: dict[int, list] = {}
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            vals, errs = _chunk_start(program, inputs, errors, P, {**bound, S: hi - lo}, lo, hi)
            _evaluate(program, P, {**bound, S: hi - lo}, vals, errs, known, acc)
            if not acc:  # the last pass: every output is there
                _collect(program, vals, errs, outs, ranks, lo, hi, err_dtype)
        if not acc:
            return outs
        for vid, parts in acc.items():
            known[vid] = [_finish(*part) for part in parts]


def _chunk_start(program, inputs, errors, P, bound, lo, hi):
    """Each rank's inputs and input errors on elements lo..hi (0-d ones whole)."""

    def cut(d):
        return {k: (x[lo:hi] if np.ndim(x) else x) for k, x in d.items()}

    ins = [cut(d) for d in inputs]
    errs = None if errors is None else [cut(d) for d in errors]
    return _start(program, ins, P, bound, errs)


def _evaluate(program, P, bound, vals, errs, known, acc) -> None:
    """The statements on one chunk: a reduction of the elements takes its finished value where
    one is known, else adds the chunk to its accumulator; what depends on an unfinished
    reduction waits for the next pass."""
    waiting: set[int] = set()
    last = _last_uses(program)
    for k, s in enumerate(program.body):
        _evaluate_one(s, program, P, bound, vals, errs, known, acc, waiting)
        for a in {a.id for a in s.values if last.get(a.id, -1) == k}:
            for r in range(len(vals)):
                vals[r].pop(a, None), errs[r].pop(a, None)


def _evaluate_one(s, program, P, bound, vals, errs, known, acc, waiting) -> None:
    if any(a.id in waiting for a in s.values):
        waiting.add(s.out.id)
        return
    if s.op in ACCUMULATED and s.values[0].type.shape:
        if s.out.id in known:
            for r, (v, e) in enumerate(known[s.out.id]):
                vals[r][s.out.id], errs[r][s.out.id] = v, e
        else:
            parts = acc.setdefault(s.out.id, [None] * len(vals))
            for r in range(len(vals)):
                parts[r] = _accumulate(
                    s, parts[r], vals[r][s.values[0].id], errs[r][s.values[0].id]
                )
            waiting.add(s.out.id)
        return
    _step(s, program, P, bound, vals, errs)


def _accumulate(s, part, x, e):
    """A reduction's running terms over the chunks: (stmt, n, sum x, sum |x|, sum x^2, sum e,
    sum 2|x|e + e^2)."""
    ax, e = np.abs(x), np.broadcast_to(e, np.shape(x))
    add = (
        x.size,
        float(np.sum(x)),
        float(np.sum(ax)),
        float(np.sum(ax * ax)),
        float(np.sum(e)),
        float(np.sum(2 * ax * e + e * e)),
    )
    if part is None:
        return (s, *add)
    return (s, *(a + b for a, b in zip(part[1:], add)))


def _finish(s, n, total, mags, squares, err, sq_err):
    """(value, error) of a reduction from its terms, as `dsl.bounds` computes it whole."""
    U = s.out.type.dtype.eps
    g = gamma_u(max(n, 1), U)
    if s.op == "norm":
        value = np.sqrt(squares)
        es = sq_err + g * (squares + sq_err)
        with np.errstate(all="ignore"):
            e = float(_sqrt(s, [np.asarray(squares)], [np.asarray(es)], value, U))
    else:
        e = err + g * (mags + err)
        value = total
        if s.op == "mean":
            value, e = total / max(n, 1), e / max(n, 1)
    e = e + ULPS.get(s.op, 1) * U * (abs(value) + e)
    return np.asarray(value, dtype=np.float64), np.asarray(e, dtype=np.float64)


def _outputs(program, ranks, n, keep_values, err_dtype) -> list[dict]:
    """Per kept rank, output name -> (value array or None, error array), to fill chunk by chunk."""

    def arrays(v):
        shape = (n,) if v.type.shape else ()
        return (np.empty(shape) if keep_values else None, np.empty(shape, dtype=err_dtype))

    return [{name: arrays(v) for name, v in program.outputs} for _ in ranks]


def _collect(program, vals, errs, outs, ranks, lo, hi, err_dtype) -> None:
    for out, r in zip(outs, ranks):
        for name, v in program.outputs:
            value, error = out[name]
            where = slice(lo, hi) if v.type.shape else ()
            if value is not None:
                value[where] = vals[r][v.id]
            error[where] = _round_up(np.asarray(errs[r][v.id], dtype=np.float64), err_dtype)


def _round_up(e: np.ndarray, dtype) -> np.ndarray:
    """e in `dtype`, never below e (float32: the next float up where the cast rounded down)."""
    if dtype == np.float64:
        return e
    low = e.astype(dtype)
    with np.errstate(over="ignore"):
        return np.where(low.astype(np.float64) < e, np.nextafter(low, dtype(np.inf)), low)


__all__ = ["CHUNK", "chunk_symbol", "chunked_error_bounds", "chunked_errors"]
