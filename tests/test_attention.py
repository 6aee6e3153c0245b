"""The attention op end to end, and experiment=tp_attention's sequence-parallel attention block:

- the op: `dsl.interpret` and the runtime's library step (`Attention`) against torch's
  scaled_dot_product_attention, causal too, with `dsl.error_bounds` covering both; the layout and
  dtype rules; the rule tables;
- the block's schedules equivalent to the block (`dsl.check_equivalent`) at 2 and 4 ranks, and
  run on 2 gloo ranks (the ring communicator) within twice the error bounds of the interpreter;
- the cost model: the Attention step's flops and bytes, timed as a matmul, the closed form and
  the DES agreeing.
"""

import numpy as np
import pytest
import torch
from plan_ranks import run_plans

import dsl
from codegen.lower import lower
from codegen.plan import Attention, walk
from codegen.runtime.launch import launch
from cost_model.closed_form import plan_us, step_us
from cost_model.topology import load_topology
from cost_model.workload import simulate
from dsl import Builder, Local, P, Replicated, Sliced, bf16, f32, sym
from dsl.errors import DTypeError, LayoutError, ShapeError
from dsl.interpret import as_dtype
from experiments import tp_attention as ta

S, B, E = sym("S"), sym("B"), sym("E")
SIZES = {"S": 16, "B": 2, "E": 16}
D = 4  # head_dim: 4 heads of 4 on one rank


def attn(dtype=f32, layout=None, causal=False, shape=None, d=D) -> dsl.Program:
    b = Builder("attn")
    layout = layout or Replicated()
    shape = shape or [S, B, E]
    q, k, v = (b.input(n, dtype, shape, layout) for n in "qkv")
    b.output("o", b.attention(q, k, v, head_dim=d, causal=causal, name="o"))
    return b.build()


def sdpa(xs: dict, causal: bool, dtype=torch.float32) -> np.ndarray:
    """torch's SDPA on [S, B, E] arrays, heads of D."""
    t = [torch.from_numpy(np.asarray(xs[n], np.float32)).to(dtype) for n in "qkv"]
    Sn, Bn, En = t[0].shape
    q, k, v = (x.reshape(Sn, Bn, En // D, D).permute(1, 2, 0, 3) for x in t)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return o.permute(2, 0, 1, 3).reshape(Sn, Bn, En).float().numpy()


def _inputs(dtype=f32, seed=0):
    rng = np.random.default_rng(seed)
    xs = {n: rng.standard_normal((16, 2, 16)).astype(np.float32) for n in "qkv"}
    return {n: as_dtype(x, dtype) for n, x in xs.items()} if dtype is bf16 else xs


# -- the op ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [f32, bf16])
@pytest.mark.parametrize("causal", [False, True])
def test_the_op_is_torchs_sdpa_within_its_error_bound(dtype, causal):
    p, xs = attn(dtype, causal=causal), _inputs(dtype)
    (got,) = dsl.interpret(p, [xs], 1, SIZES)
    tdt = torch.float32 if dtype is f32 else torch.bfloat16
    ref = sdpa(xs, causal, tdt)
    (bound,) = dsl.error_bounds(p, [xs], 1, SIZES)
    exact = attention_ref = sdpa(xs, causal, torch.float64)
    assert np.allclose(bound["o"].value, attention_ref, rtol=1e-6, atol=1e-6)
    for run in (got["o"], ref):
        assert dsl.within(run, exact, bound["o"].error)[1] == 0
    if dtype is f32:
        np.testing.assert_allclose(got["o"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.multiprocess
def test_the_runtimes_library_step_computes_the_op():
    progs = [attn(causal=c) for c in (False, True)]
    plans = [lower(p, SIZES, 1) for p in progs]
    assert [(s.causal, s.head_dim) for p in plans for s in p.steps] == [(False, D), (True, D)]
    xs = _inputs()
    (outs,) = launch(run_plans, 1, args=("ring", plans, [[xs]] * 2), timeout_s=120)
    for p, out in zip(progs, outs):
        (expect,) = dsl.interpret(p, [xs], 1, SIZES)
        (bound,) = dsl.error_bounds(p, [xs], 1, SIZES)
        assert dsl.runs_agree(out, expect, bound)


def test_the_causal_mask_hides_later_keys():
    xs = _inputs()
    changed = {**xs, "k": xs["k"].copy(), "v": xs["v"].copy()}
    changed["k"][8:] += 1.0
    changed["v"][8:] -= 2.0
    (a,), (b,) = (dsl.interpret(attn(causal=True), [x], 1, SIZES) for x in (xs, changed))
    np.testing.assert_array_equal(a["o"][:8], b["o"][:8])
    assert not np.allclose(a["o"][8:], b["o"][8:])


def test_heads_split_across_ranks_give_the_whole_result():
    p, xs = attn(layout=Sliced(2), shape=[S, B, E / P]), _inputs()
    (whole,) = dsl.interpret(attn(), [xs], 1, SIZES)
    ranks = [{n: x[..., r * 8 : (r + 1) * 8] for n, x in xs.items()} for r in range(2)]
    outs = dsl.interpret(p, ranks, 2, SIZES)
    np.testing.assert_array_equal(np.concatenate([o["o"] for o in outs], axis=2), whole["o"])


@pytest.mark.parametrize(
    "make, err, why",
    [
        (lambda: attn(layout=Sliced(0), shape=[S / P, B, E]), LayoutError, "all_gather first"),
        (lambda: attn(layout=Local()), LayoutError, "Replicated or Sliced"),
        (lambda: attn(dtype=dsl.i32), DTypeError, "floating-point"),
        (lambda: attn(shape=[S, E]), ShapeError, r"one \[S, B, E\] type"),
        (lambda: attn(d=0), ShapeError, "head_dim >= 1"),
    ],
)
def test_the_layout_and_dtype_rules(make, err, why):
    with pytest.raises(err, match=why):
        make()


def test_mixed_operand_types_and_a_head_dim_that_does_not_divide_are_refused():
    b = Builder("mixed")
    q = b.input("q", f32, [S, B, E], Replicated())
    k = b.input("k", f32, [S, B, E / P], Sliced(2))
    with pytest.raises(ShapeError, match="one"):
        b.attention(q, k, k, head_dim=D)
    with pytest.raises(ShapeError, match="does not divide"):
        dsl.interpret(attn(d=3), [_inputs()], 1, SIZES)


def test_the_op_has_every_rule():
    from dsl.bounds import ERROR
    from dsl.interpret import EVAL
    from dsl.ops import INFER, LIBRARY

    assert "attention" in LIBRARY and all("attention" in t for t in (INFER, EVAL, ERROR))


# -- the block ------------------------------------------------------------------------------------
BLOCK = {"S": 16, "B": 2, "H": 1024}


@pytest.mark.parametrize("world", [2, 4])
def test_the_blocks_schedules_are_equivalent_to_the_block(world):
    block = ta.program()
    scheds = ta.schedules()
    assert list(scheds) == [
        "AG-MM-ATT-MM-RS",
        "ol(AG,MM)-ATT-MM-RS",
        "AG-MM-ATT-ol(MM,RS)",
        "ol(AG,MM)-ATT-ol(MM,RS)",
    ]
    for sched in scheds.values():
        dsl.check_equivalent(block, sched, world, trials=1, bindings=BLOCK)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_schedules_run_on_gloo_ranks_and_match_the_interpreter():
    world = 2
    progs = list(ta.schedules().values())
    plans = [lower(p, BLOCK, world) for p in progs]
    assert sum(isinstance(s, Attention) for s in walk(plans[0].steps)) == 1
    inputs = [dsl.random_inputs(p, world, BLOCK, np.random.default_rng(5)) for p in progs]
    got = launch(run_plans, world, args=("ring", plans, inputs), timeout_s=240)
    for k, p in enumerate(progs):
        expect = dsl.interpret(p, inputs[k], world, BLOCK)
        bounds = dsl.error_bounds(p, inputs[k], world, BLOCK)
        for rank in range(world):
            assert dsl.runs_agree(got[rank][k], expect[rank], bounds[rank]), (p.schedule, rank)


# -- the cost model -------------------------------------------------------------------------------
def test_the_cost_model_times_the_attention_step():
    topo = load_topology("dgx_h100")
    sizes = {"S": 2048, "B": 1, "H": 12288}
    plans = {name: lower(p, sizes, 8) for name, p in ta.schedules(bf16).items()}
    block = plans["AG-MM-ATT-MM-RS"]
    (att,) = [s for s in block.steps if isinstance(s, Attention)]
    Sn, Bn, En = 2048, 1, 12288 // 8
    assert (att.s, att.b, att.e, att.head_dim) == (Sn, Bn, En, 128)
    assert att.flops == 4 * Sn * Sn * Bn * En + 5 * Sn * Sn * Bn * (En // 128)
    assert att.nbytes == 4 * Sn * Bn * En * 2
    us = step_us(block, att, topo)
    assert us == topo.device.matmul_us(att.nbytes, att.flops, "bf16") > 0
    for plan in plans.values():
        assert plan_us(plan, topo) == pytest.approx(simulate(plan, topo).time_us, rel=0.05)
