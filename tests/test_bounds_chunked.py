"""`dsl.bounds_chunked`: the bounds of `dsl.error_bounds`, chunk by chunk, in bounded memory."""

import tracemalloc

import numpy as np
import pytest

import dsl
import experiments
from coconet.programs import adam_program, lamb_program
from dsl import Builder, Replicated, f32, sym
from dsl.bounds_chunked import chunk_symbol, chunked_error_bounds, chunked_errors
from dsl.equivalence import distribute, global_inputs

PROGRAMS = {"adam": adam_program, "lamb": lamb_program}


def _inputs(program, n, seed=0):
    b = {"N": n}
    return distribute(program, global_inputs(program, 2, b, np.random.default_rng(seed)), 2, b)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("n,chunk", [(1000, 333), (4096, 4096), (5000, 1 << 20)])
def test_chunked_bounds_equal_the_whole_bounds(name, n, chunk):
    program = PROGRAMS[name]()
    ins = _inputs(program, n)
    step = np.random.default_rng(1)
    errors = [{k: np.abs(step.standard_normal(n)) * 1e-7 for k in ("w", "m", "v")}] * 2
    whole = dsl.error_bounds(program, ins, 2, {"N": n}, errors=errors)
    chunked = chunked_error_bounds(program, ins, 2, {"N": n}, errors=errors, chunk=chunk)
    for r in range(2):
        assert set(whole[r]) == set(chunked[r]) == {"w", "m", "v"}
        for k, bd in whole[r].items():
            np.testing.assert_allclose(chunked[r][k].value, bd.value, rtol=1e-12)
            np.testing.assert_allclose(chunked[r][k].error, bd.error, rtol=1e-9)


def test_float32_errors_are_never_below_the_float64_bound():
    program = lamb_program()
    ins = _inputs(program, 3000)
    exact = dsl.error_bounds(program, ins, 2, {"N": 3000})[1]
    low = chunked_errors(program, ins, 2, {"N": 3000}, 1, chunk=1024)
    for k, e in low.items():
        assert e.dtype == np.float32
        assert np.all(e.astype(np.float64) >= exact[k].error)
        assert np.all(e.astype(np.float64) <= exact[k].error * (1 + 2**-22))


def test_lamb_needs_its_norms_before_the_update_and_they_span_every_chunk():
    # a chunk's own norm would give another trust ratio: w would differ far beyond its bound
    program = lamb_program()
    ins = _inputs(program, 4000)
    whole = dsl.error_bounds(program, ins, 2, {"N": 4000})[0]["w"].value
    first = chunked_error_bounds(
        program,
        [{k: (x[:1000] if np.ndim(x) else x) for k, x in r.items()} for r in ins],
        2,
        {"N": 1000},
    )[0]["w"].value
    chunked = chunked_error_bounds(program, ins, 2, {"N": 4000}, chunk=1000)[0]["w"].value
    assert not np.allclose(first, whole[:1000], rtol=1e-9)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12)


def test_memory_grows_with_the_outputs_not_with_the_intermediates():
    program, n = lamb_program(), 1 << 20
    ins = _inputs(program, n)
    tracemalloc.start()
    try:
        chunked_errors(program, ins, 2, {"N": n}, 0, chunk=1 << 15)
        _, peak_chunked = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        dsl.error_bounds(program, ins, 2, {"N": n})
        _, peak_whole = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    outputs = 3 * 4 * n  # w, m, v in float32
    assert peak_chunked < outputs + (16 << 20), peak_chunked
    assert peak_whole > 4 * peak_chunked  # what the chunks save


def test_programs_that_are_not_elementwise_are_refused_with_the_reason():
    mp = experiments.get("model_parallel").program()
    S, why = chunk_symbol(mp)
    assert S is None and why
    with pytest.raises(dsl.DSLError, match="elementwise"):
        chunked_errors(mp, [{}, {}], 2, {}, 0)
    b = Builder("drop")
    x = b.input("x", f32, [sym("N")], Replicated())
    b.output("y", b.dropout(x, 0.1, seed=1))
    assert chunk_symbol(b.build()) == (None, "dropout depends on the element's position")
    assert chunk_symbol(adam_program()) == ("N", "")
