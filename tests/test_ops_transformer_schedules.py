"""A tensor-parallel block with the transformer ops through schedules, bounds and the CPU runtime.

    y = all_reduce(x) + bias            (x: the partial sums of a row-parallel matmul)
    out = softmax(gelu(layer_norm(y) * w + bias))

Its split (RS-AG-C), reordered (RS-C-AG: everything on the rank's rows, the row ops too, as
sequence parallelism does) and fused (fuse(RS-C): the bias add on each reduced chunk, the row ops
after it) schedules are equivalent to it (`check_equivalent`, with the error bounds of
`dsl.bounds`), and each runs on 2 ranks of the CPU runtime (gloo, ring collectives) within its
error bounds of the interpreter (`dsl.runs_agree`). A row op stays after a gather of its last
dimension.
"""

from __future__ import annotations

import numpy as np
import pytest
from plan_ranks import run_plans

import dsl
from codegen.lower import lower
from codegen.plan import Compute, FusedCollective
from codegen.runtime.backend import CpuBackend
from codegen.runtime.launch import launch
from dsl import Builder, Local, P, Replicated, Sliced, check_equivalent, f32, sym
from dsl.errors import TransformError
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
    add = next(s for s in rs_c_ag.body if s.op == "add")
    return {
        "AR-C": p,
        "RS-AG-C": split(p),
        "RS-C-AG": rs_c_ag,
        "fuse(RS-C)-AG": fuse(rs_c_ag, first=rs.out, last=add.out),
    }


@pytest.mark.parametrize("name", ["RS-AG-C", "RS-C-AG", "fuse(RS-C)-AG"])
@pytest.mark.parametrize("world", [2, 4])
def test_schedules_are_equivalent(name, world):
    p = schedules()
    worst = check_equivalent(p["AR-C"], p[name], world, trials=2, bindings=BINDINGS)
    assert set(worst) == {"out"}


def test_the_reorder_moves_the_row_ops_onto_the_ranks_rows():
    q = schedules()["RS-C-AG"]
    ops = [s.op for s in q.body]
    assert ops == ["reduce_scatter", "add", "layer_norm", "mul", "add", "gelu", "softmax"] + [
        "all_gather"
    ]
    assert all(str(s.out.type).endswith("@sliced(0)") for s in q.body[:-1])


def test_a_row_op_stays_after_a_gather_of_its_last_dimension():
    b = Builder("cols")
    x = b.input("x", f32, [M, K / P], Sliced(1))
    g = b.all_gather(x)
    b.output("y", b.softmax(g * 2))
    q = reorder(b.build())
    assert [s.op for s in q.body] == ["mul", "all_gather", "softmax"]
    check_equivalent(b.build(), q, 2, bindings=BINDINGS)


def test_fuse_stops_at_the_row_op():
    with pytest.raises(TransformError, match="layer_norm works on whole rows"):
        fuse(schedules()["RS-C-AG"])


def test_the_fused_plan_keeps_the_row_ops_outside_the_fused_collective():
    plan = lower(schedules()["fuse(RS-C)-AG"], BINDINGS, 2, fused_chunks=2)
    fused = [s for s in plan.steps if isinstance(s, FusedCollective)]
    assert len(fused) == 1
    inside = {st.kernel.stmts[0].op for st in fused[0].steps if isinstance(st, Compute)}
    assert not inside & {"layer_norm", "softmax"}
    rows = [s.kernel.stmts[0].op for s in plan.steps if isinstance(s, Compute)]
    assert "layer_norm" in rows and "softmax" in rows


# -- the CPU runtime, 2 ranks ------------------------------------------------------------------------
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
    results = launch(run_plans, world, args=("ring", plans, inputs), timeout_s=240)
    for k, (name, _, _, expect, bounds) in enumerate(cases):
        for rank in range(world):
            got = results[rank][k]
            assert dsl.runs_agree(got, expect[rank], bounds[rank]), (name, rank)
