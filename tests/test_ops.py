"""Every compute op, built with `dsl.Builder` and interpreted, against a direct numpy computation."""

import numpy as np
import pytest

import dsl
from dsl import Builder, Local, P, Replicated, bf16, f16, f32, f64, i32, i64, interpret, sym
from dsl.interpret import EVAL, as_dtype, dropout_keep, mix32, round_bf16

N, B = sym("N"), sym("B")
RNG = np.random.default_rng(1234)


def _id(v):
    return v if isinstance(v, str) else ""


def run(build, inputs, world=1, **bindings):
    """Build a one-output program with `build(b)`, run it on `world` ranks with the same inputs."""
    b = Builder("t")
    b.output("y", build(b))
    outs = interpret(b.build(), [inputs] * world, world, bindings)
    return [o["y"] for o in outs]


def data(dtype, shape, positive=False):
    if dtype.is_float:
        x = RNG.uniform(0.5, 2.0, shape) if positive else RNG.standard_normal(shape)
    else:
        x = RNG.integers(-8, 9, shape)
    return x.astype(dtype.numpy)


# -- binary and unary pointwise ops --------------------------------------------------------------
BINARY = [
    ("add", lambda x, y: x + y, np.add),
    ("sub", lambda x, y: x - y, np.subtract),
    ("mul", lambda x, y: x * y, np.multiply),
    ("div", lambda x, y: x / y, np.divide),
    ("maximum", lambda x, y: x.b.maximum(x, y), np.maximum),
    ("minimum", lambda x, y: x.b.minimum(x, y), np.minimum),
]


@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
@pytest.mark.parametrize("name,op,ref", BINARY + [("pow", lambda x, y: x**y, np.power)], ids=_id)
def test_binary_float(name, op, ref, dtype):
    x, y = data(dtype, (4, 6), positive=True), data(dtype, (4, 6))
    (got,) = run(
        lambda b: op(b.input("x", dtype, [B, N], Local()), b.input("y", dtype, [B, N], Local())),
        {"x": x, "y": y},
        B=4,
        N=6,
    )
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got, ref(x, y))


@pytest.mark.parametrize("dtype", [i32, i64], ids=str)
@pytest.mark.parametrize("name,op,ref", BINARY[:3] + BINARY[4:], ids=_id)
def test_binary_int(name, op, ref, dtype):
    x, y = data(dtype, (5,)), data(dtype, (5,))
    (got,) = run(
        lambda b: op(b.input("x", dtype, [N], Local()), b.input("y", dtype, [N], Local())),
        {"x": x, "y": y},
        N=5,
    )
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got, ref(x, y))


def test_int_division_truncates_toward_zero_and_by_zero_is_zero():
    x, y = np.array([7, -7, 7, -7, 3, 0], np.int32), np.array([2, 2, -2, -2, 0, 5], np.int32)
    (got,) = run(
        lambda b: b.input("x", i32, [N], Local()) / b.input("y", i32, [N], Local()),
        {"x": x, "y": y},
        N=6,
    )
    np.testing.assert_array_equal(got, [3, -3, -3, 3, 0, 0])


UNARY = [
    ("neg", lambda b, x: -x, np.negative),
    ("sqrt", lambda b, x: b.sqrt(x), np.sqrt),
    ("rsqrt", lambda b, x: b.rsqrt(x), lambda x: np.reciprocal(np.sqrt(x))),
    ("exp", lambda b, x: b.exp(x), np.exp),
]


@pytest.mark.parametrize("dtype", [f32, f64, f16], ids=str)
@pytest.mark.parametrize("name,op,ref", UNARY, ids=_id)
def test_unary(name, op, ref, dtype):
    x = data(dtype, (3, 4), positive=True)
    (got,) = run(lambda b: op(b, b.input("x", dtype, [B, N], Replicated())), {"x": x}, B=3, N=4)
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got, ref(x))


def test_broadcasting_right_aligned_and_size_one():
    x, y, z = data(f32, (3, 4)), data(f32, (4,)), data(f32, (3, 1))
    (got,) = run(
        lambda b: (
            b.input("x", f32, [B, N], Local()) * b.input("y", f32, [N], Local())
            + b.input("z", f32, [B, 1], Local())
        ),
        {"x": x, "y": y, "z": z},
        B=3,
        N=4,
    )
    np.testing.assert_array_equal(got, x * y + z)


@pytest.mark.parametrize("dtype", [f32, f64, f16, i32], ids=str)
def test_const_operands_take_the_tensor_dtype(dtype):
    x = data(dtype, (6,))
    (got,) = run(lambda b: 3 - b.input("x", dtype, [N], Local()) * 2, {"x": x}, N=6)
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got, (3 - x * np.asarray(2, dtype.numpy)).astype(dtype.numpy))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_symbolic_const_one_over_p(world):
    x = data(f32, (8,))
    outs = run(lambda b: b.input("x", f32, [N], Replicated()) * (1 / P), {"x": x}, world, N=8)
    for got in outs:
        np.testing.assert_array_equal(got, x * np.float32(1 / world))


def test_symbolic_const_with_a_size_symbol():
    x = data(f64, (8,))
    (got,) = run(lambda b: b.input("x", f64, [N], Local()) / N, {"x": x}, N=8)
    np.testing.assert_array_equal(got, x / 8.0)


# -- comparisons, where, cast ---------------------------------------------------------------------
COMPARE = [
    ("lt", lambda x, y: x < y, np.less),
    ("le", lambda x, y: x <= y, np.less_equal),
    ("gt", lambda x, y: x > y, np.greater),
    ("ge", lambda x, y: x >= y, np.greater_equal),
    ("eq", lambda x, y: x.b.eq(x, y), np.equal),
    ("ne", lambda x, y: x.b.ne(x, y), np.not_equal),
]


@pytest.mark.parametrize("dtype", [f32, i64], ids=str)
@pytest.mark.parametrize("name,op,ref", COMPARE, ids=_id)
def test_comparisons_give_bool(name, op, ref, dtype):
    x = data(dtype, (12,))
    y = x.copy()
    y[::2] = data(dtype, (6,))  # some equal, some not
    (got,) = run(
        lambda b: op(b.input("x", dtype, [N], Local()), b.input("y", dtype, [N], Local())),
        {"x": x, "y": y},
        N=12,
    )
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref(x, y))


def test_where_with_a_comparison_and_a_const():
    x, y = data(f32, (10,)), data(f32, (10,))

    def build(b):
        u, v = b.input("x", f32, [N], Local()), b.input("y", f32, [N], Local())
        return b.where(u > v, u, 0.5)

    (got,) = run(build, {"x": x, "y": y}, N=10)
    np.testing.assert_array_equal(got, np.where(x > y, x, np.float32(0.5)))


@pytest.mark.parametrize(
    "src,dst,x,want",
    [
        (f32, i32, [1.7, -1.7, 0.2], [1, -1, 0]),
        (f64, f16, [1 / 3, 65504.0, 1e-8], np.array([1 / 3, 65504.0, 1e-8]).astype(np.float16)),
        (f64, bf16, [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-9)], [1.0, 1 + 2**-6, -1.0]),
        (i64, f32, [3, -8, 0], [3.0, -8.0, 0.0]),
        (f32, dsl.DType.bool, [0.0, -2.0, 0.5], [False, True, True]),
    ],
    ids=lambda v: str(v) if isinstance(v, dsl.DType) else "",
)
def test_cast(src, dst, x, want):
    (got,) = run(lambda b: b.cast(b.input("x", src, [N], Local()), dst), {"x": np.array(x)}, N=3)
    assert got.dtype == dst.numpy
    np.testing.assert_array_equal(got, np.asarray(want, dst.numpy))


def test_f16_spot_check_computes_in_float16():
    x, y = data(f16, (64,)), data(f16, (64,))
    (got,) = run(
        lambda b: b.input("x", f16, [N], Local()) * b.input("y", f16, [N], Local()) + 1.0,
        {"x": x, "y": y},
        N=64,
    )
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, x * y + np.float16(1.0))


def test_bf16_rounds_after_every_op():
    x, y = data(f32, (256,)), data(f32, (256,))
    (got,) = run(
        lambda b: b.input("x", bf16, [N], Local()) * b.input("y", bf16, [N], Local()),
        {"x": x, "y": y},
        N=256,
    )
    assert got.dtype == np.float32
    assert not np.any(got.view(np.uint32) & 0xFFFF), "results must be bf16-representable"
    np.testing.assert_array_equal(got, round_bf16(round_bf16(x) * round_bf16(y)))
    np.testing.assert_allclose(got, x * y, rtol=2**-7, atol=2**-7)


@pytest.mark.parametrize(
    "value,want",
    [
        (1 + 2**-8, 1.0),
        (1 + 3 * 2**-8, 1 + 2**-6),
        (1 + 2**-8 + 2**-20, 1 + 2**-7),
        (np.inf, np.inf),
        (-0.0, -0.0),
        (3.4e38, np.inf),
        (3.3895e38, 3.3895313892515355e38),
    ],
)
def test_round_bf16_ties_to_even(value, want):
    assert round_bf16(np.float32(value)) == np.float32(want)
    assert np.isnan(round_bf16(np.float32(np.nan)))


# -- reductions, matmul, slice, update ------------------------------------------------------------
REDUCE = [
    ("sum", lambda b, x: b.sum(x), lambda x: x.astype(np.float64).sum()),
    ("mean", lambda b, x: b.mean(x), lambda x: x.astype(np.float64).sum() / x.size),
    ("norm", lambda b, x: b.norm(x), lambda x: np.sqrt((x.astype(np.float64) ** 2).sum())),
]


@pytest.mark.parametrize("dtype", [f32, f64, f16, bf16], ids=str)
@pytest.mark.parametrize("name,op,ref", REDUCE, ids=_id)
def test_reductions_accumulate_in_float64(name, op, ref, dtype):
    x = as_dtype(data(f32, (4, 25)), dtype)
    (got,) = run(lambda b: op(b, b.input("x", dtype, [B, N], Local())), {"x": x}, B=4, N=25)
    assert got.shape == () and got.dtype == dtype.numpy
    assert got == as_dtype(np.float32(ref(x)) if dtype is bf16 else ref(x), dtype)


def test_reduction_of_a_sliced_tensor_is_the_local_partial():
    x = data(f64, (8,))

    def build(b):
        return b.sum(b.slice(b.input("x", f64, [N], Replicated())))

    outs = run(build, {"x": x}, 4, N=8)
    np.testing.assert_array_equal(outs, [x[2 * i : 2 * i + 2].sum() for i in range(4)])


def test_integer_sum_is_exact():
    x = np.full(1000, 2**21, np.int64)
    (got,) = run(lambda b: b.sum(b.input("x", i64, [N], Local())), {"x": x}, N=1000)
    assert got == 1000 * 2**21 and got.dtype == np.int64


@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_matmul_bsk_by_kh(dtype):
    S, K, H = sym("S"), sym("K"), sym("H")
    a, w = data(dtype, (2, 3, 5)), data(dtype, (5, 4))

    def build(b):
        return b.input("a", dtype, [B, S, K], Replicated()) @ b.input(
            "w", dtype, [K, H], Replicated()
        )

    (got,) = run(build, {"a": a, "w": w}, B=2, S=3, K=5, H=4)
    assert got.shape == (2, 3, 4) and got.dtype == dtype.numpy
    want = np.matmul(a.astype(np.float64), w.astype(np.float64)).astype(dtype.numpy)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_slice_takes_the_tp_index_piece(dim, world):
    x = data(f32, (8, 4))
    outs = run(
        lambda b: b.slice(b.input("x", f32, [B, N], Replicated()), dim), {"x": x}, world, B=8, N=4
    )
    np.testing.assert_array_equal(np.concatenate(outs, axis=dim), x)
    assert outs[-1].shape[dim] == x.shape[dim] // world


def test_update_outputs_the_value_under_the_target_name():
    w, g = data(f32, (6,)), data(f32, (6,))
    b = Builder("u")
    wt = b.input("w", f32, [N], Replicated())
    b.update(wt, wt - 0.5 * b.input("g", f32, [N], Replicated()))
    (out,) = interpret(b.build(), [{"w": w, "g": g}], 1, {"N": 6})
    assert set(out) == {"w"}
    np.testing.assert_array_equal(out["w"], w - np.float32(0.5) * g)


# -- dropout --------------------------------------------------------------------------------------
def _mix32_py(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_dropout_hash_matches_an_independent_integer_implementation():
    idx = [0, 1, 2, 12345, 2**32 - 1, 2**32, 2**32 + 7, 2**40 + 99, 2**63 + 5]
    for seed in (0, 1, 42, 2**31 + 3):
        want = []
        for i in idx:
            h = _mix32_py((i & 0xFFFFFFFF) ^ _mix32_py((i >> 32) ^ _mix32_py(seed ^ 0x9E3779B9)))
            want.append((h >> 8) * 2.0**-24 >= 0.37)
        got = dropout_keep(seed, np.array(idx, np.uint64), 0.37)
        np.testing.assert_array_equal(got, want)
    assert [int(v) for v in mix32(np.array([0, 1, 0xDEADBEEF], np.uint32))] == [
        _mix32_py(0),
        _mix32_py(1),
        _mix32_py(0xDEADBEEF),
    ]


def _dropout_program(layout_dim=None, p=0.25, seed=7):
    b = Builder("d")
    x = b.input("x", f32, [B, N], Replicated())
    if layout_dim is not None:
        x = b.slice(x, layout_dim)
    b.output("y", b.dropout(x, p=p, seed=seed))
    return b.build()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_about_one_minus_p_and_scales(p):
    x = data(f32, (64, 1024), positive=True)
    (y,) = [o["y"] for o in interpret(_dropout_program(p=p), [{"x": x}], 1, {"B": 64, "N": 1024})]
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_array_equal(y[kept], (x * np.float32(1 / (1 - p)))[kept])


def test_dropout_is_deterministic_and_depends_on_the_seed():
    x = data(f32, (8, 64))
    runs = [
        interpret(_dropout_program(seed=s), [{"x": x}], 1, {"B": 8, "N": 64})[0]["y"]
        for s in (3, 3, 4)
    ]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert np.any((runs[0] != 0) != (runs[2] != 0))


def test_dropout_p_zero_is_the_identity():
    x = data(f32, (4, 8))
    (out,) = interpret(_dropout_program(p=0.0), [{"x": x}], 1, {"B": 4, "N": 8})
    np.testing.assert_array_equal(out["y"], x)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("world", [2, 4])
def test_dropout_mask_is_the_same_on_a_sliced_tensor(dim, world):
    x = data(f32, (8, 16))
    bind = {"B": 8, "N": 16}
    (full,) = interpret(_dropout_program(), [{"x": x}], 1, bind)
    outs = interpret(_dropout_program(dim), [{"x": x}] * world, world, bind)
    np.testing.assert_array_equal(np.concatenate([o["y"] for o in outs], axis=dim), full["y"])


# -- the rule table -------------------------------------------------------------------------------
def test_every_op_kind_has_an_interpret_rule_an_inference_rule_and_an_error_rule():
    assert set(EVAL) == set(dsl.ops.ALL_OPS) == set(dsl.ops.INFER) == set(dsl.bounds.ERROR)
