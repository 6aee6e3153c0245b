"""`check_equivalent`: two programs compute the same outputs, by `interpret` on random inputs.

Inputs and outputs are compared in their GLOBAL view, so programs that lay the same tensor out
differently (a Replicated input in `before`, the same input Sliced in `after`, as `as_slice` does)
can be compared:
- Local: one array per tp index, stacked to `[P, *local]`;
- Replicated: the full tensor (every rank holds it);
- Sliced(d): the full tensor, whose dim d is `local[d] * P` (tp index i holds piece i).
A program with several pipeline stages has one global view per stage that holds the value.

`global_inputs` draws one global array per input (init "normal": standard normal; "positive":
uniform in [0.5, 1.5), or [1, 8] for integers; "fan_in": standard normal over the square root of
the global first dimension, a weight [K, N] as LeCun's initialisation draws it, so that a matmul
of a standard-normal input has outputs of unit variance (as a trained network's activations
are, rather than of K's: sqrt(K) times larger, far into a GeLU's underflow); integers otherwise
uniform in [-8, 8]; bools fair coins; inputs with a default are left out, so the default is used), `distribute` cuts them into
each rank's local inputs according to one program's layouts, and `random_inputs` does both.

Tolerance: a rewrite may change the order of sums (a reduce-scatter then an all-gather, a
chunked fused collective, a matmul computed in row chunks), so each element gets a bound derived
from its computation (`dsl.bounds.error_bounds`: for a matmul a multiple of
u * sum_k |x_ik||w_kj|, for a reduction of the sum of magnitudes and the number of terms, ...),
and floats compare with

    |after - before| <= error_before + error_after     (element by element)

on the same inputs; NaN equals NaN, infinities must match exactly; integers and bools compare
exactly.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from .bounds import error_bounds, within
from .errors import ArgumentError, BindError, DSLError
from .interpret import as_dtype, bind, evaluate_shape, interpret, piece
from .ir import Const, Input, Program
from .sizes import Size
from .types import DType, Local, Replicated, Sliced, TensorType


class EquivalenceError(DSLError):
    """Two programs that should compute the same outputs do not."""


# -- bindings -------------------------------------------------------------------------------------
def symbols(program: Program) -> set[str]:
    """Every size symbol in the program's types and symbolic constants."""
    out: set[str] = set()
    for v in program.values():
        for s in v.type.shape:
            out |= s.symbols()
    for st in program.body:
        out |= {
            x
            for a in st.args
            if isinstance(a, Const) and isinstance(a.value, Size)
            for x in a.value.symbols()
        }
    return out


def default_bindings(program: Program, P: int) -> dict[str, int]:
    """Every size symbol other than P bound to 2*P*P (divisible by P twice), plus P itself."""
    return {**{s: 2 * P * P for s in sorted(symbols(program) - {"P"})}, "P": P}


# -- global views ---------------------------------------------------------------------------------
def global_shape(t: TensorType, P: int, bindings: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of the global view of a tensor of type `t` on a tp group of P ranks."""
    local = evaluate_shape(t, bindings)
    if isinstance(t.layout, Local):
        return (P,) + local
    if isinstance(t.layout, Sliced):
        d = t.layout.dim
        return local[:d] + (local[d] * P,) + local[d + 1 :]
    return local


def local_part(g: np.ndarray, t: TensorType, P: int, i: int) -> np.ndarray:
    """Tp index i's local array of the global view `g` of a tensor of type `t`."""
    if isinstance(t.layout, Local):
        return g[i]
    if isinstance(t.layout, Sliced):
        return piece(g, t.layout.dim, P, i)
    return g


def _draw(inp: Input, P: int, bindings: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
    t = inp.value.type
    shape = global_shape(t, P, bindings)
    if inp.init not in ("normal", "positive", "fan_in"):
        raise BindError(
            f"input {inp.value.name}: unknown init {inp.init!r} (normal, positive or fan_in)"
        )
    positive = inp.init == "positive"
    if t.dtype is DType.bool:
        x = rng.random(shape) < 0.5
    elif not t.dtype.is_float:
        x = rng.integers(1 if positive else -8, 9, size=shape)
    else:
        x = rng.uniform(0.5, 1.5, size=shape) if positive else rng.standard_normal(shape)
        if inp.init == "fan_in" and shape:
            x = x / np.sqrt(shape[0])
    return as_dtype(x, t.dtype)


def global_inputs(
    program: Program, P: int, bindings: Mapping[str, int], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One random global array per input without a default, drawn in the order of the inputs."""
    bound = {**bindings, "P": P}
    return {i.value.name: _draw(i, P, bound, rng) for i in program.inputs if i.default is None}


def distribute(
    program: Program,
    globals_: Mapping[str, np.ndarray],
    world_size: int,
    bindings: Optional[Mapping[str, int]] = None,
) -> list[dict[str, np.ndarray]]:
    """Each rank's local inputs of `program`, cut from the global arrays by its layouts."""
    P, bound = bind(program, world_size, bindings)
    out: list[dict[str, np.ndarray]] = [{} for _ in range(world_size)]
    for inp in program.inputs:
        v = inp.value
        if v.name not in globals_:
            if inp.default is not None:
                continue
            raise BindError(f"no global value given for input {v.name} of {program.name}")
        g = np.asarray(globals_[v.name])
        want = global_shape(v.type, P, bound)
        if g.shape != want:
            raise BindError(
                f"global input {v.name} has shape {list(g.shape)}, {program.name} "
                f"expects {list(want)} for {v.type} with P={P}"
            )
        for r in range(world_size):
            if v.type.stage is None or v.type.stage == r // P:
                out[r][v.name] = local_part(g, v.type, P, r % P)
    return out


def random_inputs(
    program: Program,
    world_size: int,
    bindings: Optional[Mapping[str, int]],
    rng: np.random.Generator,
) -> list[dict[str, np.ndarray]]:
    """Random local inputs for every rank (global arrays drawn, then distributed).

    Without `bindings`, every size symbol but P is bound to 2*P*P (`default_bindings`).
    """
    P, bound = bind(program, world_size, None)
    P, bound = bind(
        program, world_size, default_bindings(program, P) if bindings is None else bindings
    )
    return distribute(program, global_inputs(program, P, bound, rng), world_size, bound)


def to_global(
    program: Program, outs: list[dict[str, np.ndarray]], P: int, same: bool = True
) -> dict[str, dict[int, np.ndarray]]:
    """Output name -> stage -> global view, from `interpret`'s per-rank outputs.

    A replicated output must be the same on every tp index; with `same=False` (error bounds) its
    view is the element-wise largest instead."""
    res: dict[str, dict[int, np.ndarray]] = {}
    for name, v in program.outputs:
        layout, views = v.type.layout, {}
        for st in range(program.stages) if v.type.stage is None else [v.type.stage]:
            parts = [outs[st * P + i][name] for i in range(P)]
            if isinstance(layout, Replicated) and not same:
                views[st] = np.maximum.reduce(parts)
            elif isinstance(layout, Replicated):
                bad = [
                    i for i in range(1, P) if not np.array_equal(parts[0], parts[i], equal_nan=True)
                ]
                if bad:
                    raise EquivalenceError(
                        f"{program.name}: replicated output {name} differs between"
                        f" tp index 0 and tp index {bad[0]} on stage {st}"
                    )
                views[st] = parts[0]
            elif isinstance(layout, Sliced):
                views[st] = np.concatenate(parts, axis=layout.dim)
            else:
                views[st] = np.stack(parts)
        res[name] = views
    return res


# -- comparison -----------------------------------------------------------------------------------
def _check_signatures(before: Program, after: Program, P: int, bound: Mapping[str, int]) -> None:
    if before.stages != after.stages:
        raise EquivalenceError(
            f"{before.name} has {before.stages} stage(s), {after.name} has {after.stages}"
        )
    names_b, names_a = {n for n, _ in before.outputs}, {n for n, _ in after.outputs}
    if names_b != names_a:
        raise EquivalenceError(
            f"outputs differ: {sorted(names_b)} in {before.name}, {sorted(names_a)} in {after.name}"
        )
    vb, va = dict(before.outputs), dict(after.outputs)
    for name in sorted(names_b):
        tb, ta = vb[name].type, va[name].type
        gb, ga = global_shape(tb, P, bound), global_shape(ta, P, bound)
        if (tb.dtype, gb) != (ta.dtype, ga):
            raise EquivalenceError(
                f"output {name}: {tb.dtype}{list(gb)} in {before.name} but "
                f"{ta.dtype}{list(ga)} in {after.name} (global views)"
            )
        if ta.stage is not None and ta.stage != tb.stage:
            raise EquivalenceError(
                f"output {name} lives on stage {tb.stage} in {before.name} "
                f"but on stage {ta.stage} in {after.name}"
            )


def _errors(
    program: Program, inputs: list[dict], world_size: int, P: int, bound: Mapping[str, int]
) -> dict[str, dict[int, np.ndarray]]:
    """Output name -> stage -> global view of the output's error bound."""
    bounds = error_bounds(program, inputs, world_size, bound)
    return to_global(program, [{k: b.error for k, b in r.items()} for r in bounds], P, same=False)


def _nans(values: np.ndarray) -> int:
    """NaN elements of an output (0 for integers and bools)."""
    if np.asarray(values).dtype.kind in "biu":
        return 0
    return int(np.count_nonzero(np.isnan(np.asarray(values, dtype=np.float64))))


def check_equivalent(
    before: Program,
    after: Program,
    world_size: int,
    trials: int = 3,
    bindings: Optional[Mapping[str, int]] = None,
    seed: int = 0,
) -> dict[str, float]:
    """Interpret both programs on the same random global inputs and compare their outputs.

    Each trial draws global inputs (those of `before`, then any only `after` has), distributes
    them to each program's own layouts, interprets both on `world_size` ranks and compares every
    output's global view: same names, dtypes and global shapes; floats element by element within
    `error_before + error_after`, each program's `dsl.bounds.error_bounds` on these inputs;
    integers and bools exactly. Without `bindings`, every size symbol but P is bound to 2*P*P.
    `trials` >= 1 and sizes bound to positive integers (`ArgumentError`, `BindError`: zero
    trials or an empty tensor would compare nothing). Raises `EquivalenceError` naming the output, the trial, the world size, the max abs error,
    the largest bound and the number of elements outside it, or a reference output that is NaN
    on the drawn (finite) inputs: NaN equals NaN, so such an output would verify nothing; returns
    output name -> max abs error over all trials.
    """
    if not isinstance(trials, (int, np.integer)) or isinstance(trials, bool) or trials < 1:
        raise ArgumentError(f"check_equivalent needs at least one trial, got trials={trials!r}")
    P, _ = bind(before, world_size, None)
    if bindings is None:
        bindings = {**default_bindings(before, P), **default_bindings(after, P)}
    P, bound = bind(before, world_size, bindings)
    _check_signatures(before, after, P, bound)
    rng = np.random.default_rng(seed)
    worst = {name: 0.0 for name, _ in before.outputs}
    for trial in range(trials):
        g = global_inputs(before, P, bound, rng)
        g.update(
            {
                i.value.name: _draw(i, P, bound, rng)
                for i in after.inputs
                if i.default is None and i.value.name not in g
            }
        )
        ins_b, ins_a = (
            distribute(before, g, world_size, bound),
            distribute(after, g, world_size, bound),
        )
        ref = to_global(before, interpret(before, ins_b, world_size, bound), P)
        new = to_global(after, interpret(after, ins_a, world_size, bound), P)
        err_b, err_a = (
            _errors(before, ins_b, world_size, P, bound),
            _errors(after, ins_a, world_size, P, bound),
        )
        for name, views in ref.items():
            for st, r in views.items():
                where = f" on stage {st}" if before.stages > 1 else ""
                nan = _nans(r)
                if nan:
                    raise EquivalenceError(
                        f"output {name}{where} of {before.name} is NaN at {nan} of {r.size}"
                        f" element(s) in trial {trial} on finite random inputs, and NaN = NaN"
                        " checks nothing: draw the inputs from the program's domain"
                        " (input(..., init='positive') for a sqrt or log of it)"
                    )
                allowed = err_b[name][st] + err_a[name][st]
                err, bad = within(new[name][st], r, allowed)
                worst[name] = max(worst[name], err)
                if bad:
                    raise EquivalenceError(
                        f"output {name}{where} differs in trial {trial} at world size {world_size}:"
                        f" max abs error {err:.3g} at {bad} of {r.size} element(s) outside their"
                        f" bound (largest {float(np.max(allowed, initial=0.0)):.3g})"
                        f" ({before.name} vs {after.name})"
                    )
    return worst


__all__ = [
    "EquivalenceError",
    "check_equivalent",
    "default_bindings",
    "distribute",
    "global_inputs",
    "global_shape",
    "local_part",
    "random_inputs",
    "symbols",
    "to_global",
]
