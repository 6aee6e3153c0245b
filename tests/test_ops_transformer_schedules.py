"""A tensor-parallel block with the transformer ops through schedules, bounds and the CPU runtime.

    y = all_reduce(x) + bias            (x: the partial sums of a row-parallel matmul)
    out = softmax(gelu(layer_norm(y) * w + bias))

Its split (RS-C-AG), reordered (the bias add on slices) and fused (fuse(RS-C-AG), the row ops
after the fused collective) schedules are equivalent to it (`check_equivalent`, with the error
bounds of `dsl.bounds`), and each runs on 2 ranks of the CPU runtime (gloo, ring collectives)
within its error bounds of the interpreter (`dsl.runs_agree`).
"""

from __future__ import annotations

import numpy as np
import pytest

import dsl
from codegen.lower import lower
from codegen.plan import Compute, FusedCollective
from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch
from dsl import Builder, Local, Replicated, check_equivalent, f32, sym
from dsl.transforms import fuse, reorder, split

M, K = sym("M"), sym("K")
BINDINGS = {"M": 8, "K": 24}


def tp_block(dtype=f32) -> dsl.Program:
    b = Builder("tp_block")
    x = b.input("x", dtype, [M, K], Local())
    bias = b.input("bias", dtype, [K], Replicated())
    w = b.input("w", dtype, [K], Replicated(), init="positive")
    y = b.all_reduce(x) + bias
    h = b.layer_norm(y) * w + bias
    b.output("out", b.softmax(b.gelu(h)))
    return b.build()


def schedules() -> dict[str, dsl.Program]:
    p = tp_block()
    rs_c_ag = reorder(split(p))
    rs = next(s for s in rs_c_ag.body if s.op == "reduce_scatter")
    ag = next(s for s in rs_c_ag.body if s.op == "all_gather")
    return {
        "AR-C": p,
        "RS-AG-C": split(p),
        "RS-C-AG": rs_c_ag,
        "fuse(RS-C-AG)": fuse(rs_c_ag, first=rs.out, last=ag.out),
    }


@pytest.mark.parametrize("name", ["RS-AG-C", "RS-C-AG", "fuse(RS-C-AG)"])
@pytest.mark.parametrize("world", [2, 4])
def test_schedules_are_equivalent(name, world):
    p = schedules()
    worst = check_equivalent(p["AR-C"], p[name], world, trials=2, bindings=BINDINGS)
    assert set(worst) == {"out"}


def test_the_reorder_moves_the_bias_onto_slices_and_gathers_before_layer_norm():
    q = schedules()["RS-C-AG"]
    ops = [s.op for s in q.body]
    assert ops.index("reduce_scatter") < ops.index("add") < ops.index("all_gather")
    assert ops.index("all_gather") < ops.index("layer_norm")


def test_the_fused_plan_keeps_the_row_ops_outside_the_fused_collective():
    plan = lower(schedules()["fuse(RS-C-AG)"], BINDINGS, 2, fused_chunks=2)
    fused = [s for s in plan.steps if isinstance(s, FusedCollective)]
    assert len(fused) == 1
    inside = {st.kernel.stmts[0].op for st in fused[0].steps if isinstance(st, Compute)}
    assert not inside & {"layer_norm", "softmax"}
    rows = [s.kernel.stmts[0].op for s in plan.steps if isinstance(s, Compute)]
    assert "layer_norm" in rows and "softmax" in rows


# -- the CPU runtime, 2 ranks ------------------------------------------------------------------------
def _rank(rank, world, plans, inputs, kernel_list):
    backend = CpuBackend(comm="ring")
    kernels = backend.build(kernel_list)
    outs = []
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, kernels, backend.groups(plan.stages), backend)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs


@pytest.mark.slow
def test_every_schedule_runs_on_two_cpu_ranks_within_its_bounds():
    world, cases = 2, []
    for name, prog in schedules().items():
        plan = lower(prog, BINDINGS, world, fused_chunks=2)
        inputs = dsl.random_inputs(prog, world, BINDINGS, np.random.default_rng(7))
        expect = dsl.interpret(prog, inputs, world, BINDINGS)
        cases.append((name, plan, inputs, expect, dsl.error_bounds(prog, inputs, world, BINDINGS)))
    kernel_list = list({k.name: k for c in cases for k in c[1].kernels()}.values())
    CpuBackend().build(kernel_list)  # compile once here; the ranks load it from the cache
    plans, inputs = [c[1] for c in cases], [c[2] for c in cases]
    results = launch(_rank, world, args=(plans, inputs, kernel_list), timeout_s=240)
    for k, (name, _, _, expect, bounds) in enumerate(cases):
        for rank in range(world):
            got = results[rank][k]
            assert dsl.runs_agree(got, expect[rank], bounds[rank]), (name, rank)
