"""`check_equivalent` accepts hand-built equivalent rewrites and names the output of a wrong one."""

import math

import numpy as np
import pytest

from dsl import (
    BindError,
    Builder,
    EquivalenceError,
    Local,
    P,
    Replicated,
    Sliced,
    bf16,
    check_equivalent,
    default_bindings,
    f16,
    f32,
    f64,
    i64,
    random_inputs,
    sym,
)
from dsl.bounds import gamma
from dsl.equivalence import distribute, global_inputs

N, B, K, H = sym("N"), sym("B"), sym("K"), sym("H")
WORLDS = range(1, 9)


# -- data parallel: AR-C and its rewrites ---------------------------------------------------------
def ar_c(dtype=f32, scale=1 / P, op="sum"):
    """w -= lr * all_reduce(g) / P"""
    b = Builder("AR-C")
    g, w = b.input("g", dtype, [N], Local()), b.input("w", dtype, [N], Replicated())
    b.update(w, w - b.param("lr", 0.1, dtype) * b.all_reduce(g, op=op) * scale)
    return b.build()


def rs_c_ag(dtype=f32, scale=1 / P):
    """the same update on each rank's slice, then all-gathered"""
    b = Builder("RS-C-AG")
    g, w = b.input("g", dtype, [N], Local()), b.input("w", dtype, [N], Replicated())
    new = b.slice(w) - b.param("lr", 0.1, dtype) * b.reduce_scatter(g) * scale
    b.update(w, b.all_gather(new))
    return b.build()


def rs_c_sliced(dtype=f32, scale=1 / P):
    """as_slice(w): w is kept Sliced, so the all-gather is gone"""
    b = Builder("RS-C")
    g, w = b.input("g", dtype, [N], Local()), b.input("w", dtype, [N / P], Sliced(0))
    b.update(w, w - b.param("lr", 0.1, dtype) * b.reduce_scatter(g) * scale)
    return b.build()


def scaled_first(dtype=f32):
    """the division by P moved before the all-reduce (rounds differently)"""
    b = Builder("C-AR")
    g, w = b.input("g", dtype, [N], Local()), b.input("w", dtype, [N], Replicated())
    b.update(w, w - b.param("lr", 0.1, dtype) * b.all_reduce(g * (1 / P)))
    return b.build()


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("after", [rs_c_ag, rs_c_sliced, scaled_first], ids=lambda f: f.__name__)
def test_data_parallel_rewrites_are_equivalent(after, world):
    errors = check_equivalent(ar_c(), after(), world, trials=2)
    assert set(errors) == {"w"} and errors["w"] <= 1e-5


@pytest.mark.parametrize("dtype", [f16, bf16, f64], ids=str)
@pytest.mark.parametrize("world", [3, 8])
def test_low_precision_reorderings_fit_the_tolerance(dtype, world):
    check_equivalent(ar_c(dtype), scaled_first(dtype), world)
    check_equivalent(ar_c(dtype), rs_c_sliced(dtype), world)


WRONG = [  # (after, world): each changes the update of w
    (lambda: rs_c_ag(scale=1.0), 2),
    (lambda: rs_c_sliced(scale=1 / (2 * P)), 4),
    (lambda: ar_c(op="max"), 3),
    (lambda: ar_c(scale=1.001 / 8), 8),  # 0.1% off
]


@pytest.mark.parametrize("after,world", WRONG)
def test_a_wrong_rewrite_raises_naming_the_output(after, world):
    with pytest.raises(EquivalenceError) as e:
        check_equivalent(ar_c(), after(), world)
    msg = str(e.value)
    for part in (
        "output w",
        "trial 0",
        f"world size {world}",
        "max abs error",
        "outside their bound",
    ):
        assert part in msg
    assert "\n" not in msg


# -- model parallel: MM-AR-C and MM-RS-C-AG with dropout ------------------------------------------
def mm_ar_c(p=0.1, seed=5, fused_rs=False):
    b = Builder("MM-RS-C-AG" if fused_rs else "MM-AR-C")
    x, w = b.input("x", f32, [B, K / P], Sliced(1)), b.input("w", f32, [K / P, H], Sliced(0))
    r = b.input("r", f32, [B, H], Replicated())
    partial = x @ w
    if fused_rs:
        out = b.all_gather(b.dropout(b.reduce_scatter(partial, 0), p=p, seed=seed) + r)
    else:
        out = b.dropout(b.all_reduce(partial), p=p, seed=seed) + r
    b.output("out", out)
    return b.build()


@pytest.mark.parametrize("world", WORLDS)
def test_model_parallel_rs_c_ag_is_equivalent_with_dropout(world):
    errors = check_equivalent(mm_ar_c(), mm_ar_c(fused_rs=True), world, trials=2)
    assert errors["out"] < 1e-4


def test_model_parallel_with_another_dropout_seed_is_not():
    with pytest.raises(EquivalenceError, match="output out differs in trial 0 at world size 2"):
        check_equivalent(mm_ar_c(), mm_ar_c(seed=6, fused_rs=True), 2)


# -- pipeline parallel: AR-P2P-C and RS-P2P-AG-C -----------------------------------------------------
def pipeline(split):
    b = Builder("RS-P2P-AG-C" if split else "AR-P2P-C", stages=2)
    x, h = b.input("x", f64, [N], Local(), stage=0), b.input("h", f64, [N], Replicated(), stage=1)
    y = (
        b.all_gather(b.send(b.reduce_scatter(x), dst=1))
        if split
        else b.send(b.all_reduce(x), dst=1)
    )
    b.output("y", y * 2 + h)
    b.output("h", b.norm(h))
    return b.build()


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_pipeline_rewrite_is_equivalent(world):
    assert check_equivalent(pipeline(False), pipeline(True), world)["y"] < 1e-12


def test_pipeline_stage_counts_must_agree():
    with pytest.raises(EquivalenceError, match="2 stage"):
        check_equivalent(pipeline(False), ar_c(), 2)


# -- mismatched signatures ------------------------------------------------------------------------
def renamed():
    b = Builder("renamed")
    g, w = b.input("g", f32, [N], Local()), b.input("w", f32, [N], Replicated())
    b.output("w2", w - b.all_reduce(g))
    return b.build()


@pytest.mark.parametrize(
    "after,pattern",
    [
        (renamed, r"outputs differ: \['w'\] in AR-C, \['w2'\] in renamed"),
        (lambda: ar_c(f64), "output w: f32.* in AR-C but f64"),
    ],
)
def test_outputs_must_have_the_same_names_dtypes_and_global_shapes(after, pattern):
    with pytest.raises(EquivalenceError, match=pattern):
        check_equivalent(ar_c(), after(), 2)


def test_integers_compare_exactly():
    def prog(extra):
        b = Builder("ints")
        b.output("s", b.all_reduce(b.input("x", i64, [N], Local())) + extra)
        return b.build()

    assert check_equivalent(prog(0), prog(0), 4) == {"s": 0.0}
    with pytest.raises(
        EquivalenceError,
        match=r"output s .* max abs error 1 at \d+ of \d+ element\(s\) outside their bound \(largest 0\)",
    ):
        check_equivalent(prog(0), prog(1), 4)


# -- inputs, bindings, tolerance ------------------------------------------------------------------
def layouts_program():
    b = Builder("inputs")
    b.input("loc", f32, [N], Local())
    b.input("rep", f32, [B, N], Replicated(), init="positive")
    b.input("sl", f32, [B, N / P], Sliced(1))
    b.input("ints", i64, [N], Local())
    b.input("flags", f32, [N], Local()) < 0
    b.param("lr", 0.5)
    return b.build()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_random_inputs_follow_the_layouts(world):
    p, bind = layouts_program(), {"N": 6, "B": 4}
    ranks = random_inputs(p, world, bind, np.random.default_rng(0))
    assert len(ranks) == world and all("lr" not in r for r in ranks)
    g = global_inputs(p, world, bind, np.random.default_rng(0))
    assert g["loc"].shape == (world, 6) and g["rep"].shape == (4, 6) and g["sl"].shape == (4, 6)
    np.testing.assert_array_equal(np.stack([r["loc"] for r in ranks]), g["loc"])
    np.testing.assert_array_equal(np.concatenate([r["sl"] for r in ranks], axis=1), g["sl"])
    for r in ranks:
        np.testing.assert_array_equal(r["rep"], g["rep"])
    assert g["rep"].min() >= 0.5 and g["rep"].max() < 1.5
    assert g["ints"].dtype == np.int64 and -8 <= g["ints"].min() and g["ints"].max() <= 8


def test_distribute_rejects_a_global_of_the_wrong_shape():
    g = global_inputs(layouts_program(), 2, {"N": 6, "B": 4}, np.random.default_rng(0))
    g["sl"] = g["sl"][:, :3]
    with pytest.raises(
        BindError, match=r"global input sl has shape \[4, 3\], inputs expects \[4, 6\]"
    ):
        distribute(layouts_program(), g, 2, {"N": 6, "B": 4})


@pytest.mark.parametrize("P_", [1, 2, 3])
def test_default_bindings_divide_by_p_twice(P_):
    n = 2 * P_ * P_
    assert default_bindings(mm_ar_c(), P_) == {"B": n, "H": n, "K": n, "P": P_}


def test_gamma_is_the_worst_case_for_few_terms_and_grows_as_sqrt_n_for_many():
    u = 2.0**-24
    assert gamma(1, f32) == 0 and gamma(10**6, i64) == 0
    assert math.isclose(gamma(4, f32), 3 * u / (1 - 3 * u))
    assert math.isclose(gamma(4096, f32), 8 * 64 * u)  # not 4095 u
    assert math.isclose(gamma(3, bf16), 2 * 2.0**-8 / (1 - 2 * 2.0**-8))
    assert gamma(10**8, f16) < math.inf


def test_explicit_bindings_are_used():
    check_equivalent(ar_c(), rs_c_sliced(), 4, bindings={"N": 4})
    with pytest.raises(Exception, match="N/P = 3/2"):
        check_equivalent(ar_c(), rs_c_sliced(), 4, bindings={"N": 6})


def test_random_inputs_bind_every_symbol_to_2_p_p_by_default():
    ranks = random_inputs(mm_ar_c(), 3, None, np.random.default_rng(0))
    assert ranks[0]["x"].shape == (18, 6) and ranks[2]["w"].shape == (6, 18)
