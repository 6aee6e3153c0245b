"""Every schedule of every experiment, lowered to a Plan, run on gloo ranks with compiled kernels,
equals `dsl.interpret` of the same schedule on the same inputs (2 ranks; the model-parallel layer
also on 4, the pipeline also on 4 = 2 stages x 2).

Agreement: `dsl.runs_agree`, each element within twice its `dsl.error_bounds` bound (reduction
order differs between the ring and numpy).
"""

import numpy as np
import pytest

import dsl
import experiments
from codegen.lower import lower
from codegen.runtime.execute import PlanRunner, tp_groups
from codegen.runtime.launch import launch

build = pytest.importorskip("codegen.build").build


def _cases(world: int):
    cases = []
    for name in experiments.PROGRAMS:
        mod = experiments.load(name)
        for sched_name, prog in mod.schedules().items():
            if world % prog.stages:
                continue
            P = world // prog.stages
            b = dict(mod.verify_bindings("smoke")[0])
            if "N" in b:
                b["N"] = 64 * P
            plan = lower(prog, b, world, fused_chunks=2)
            rng = np.random.default_rng(7)
            inputs = dsl.random_inputs(prog, world, b, rng)
            expect = dsl.interpret(prog, inputs, world, b)
            cases.append((f"{name}:{sched_name}", plan, inputs, expect,
                          dsl.error_bounds(prog, inputs, world, b)))
    return cases


def _rank(rank, world, plans, inputs, kernel_list):
    kernels = build(kernel_list)
    outs = []
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, kernels, tp_groups(plan))
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs


@pytest.mark.parametrize("world", [2, 4])
def test_plans_match_interpreter(world):
    cases = _cases(world)
    if world == 4:  # 4 ranks on 2 cores: the layer experiments (the optimizers are 2-rank)
        cases = [c for c in cases if c[0].startswith(("pipeline", "model"))]
    kernel_list = [k for _, plan, _, _, _ in cases for k in plan.kernels()]
    build(kernel_list)  # compile once in the parent; ranks load from the cache
    results = launch(_rank, world, args=([c[1] for c in cases], [c[2] for c in cases],
                                         kernel_list), timeout_s=240)
    for k, (label, _, _, expect, bounds) in enumerate(cases):
        for rank in range(world):
            got = results[rank][k]
            assert set(got) == set(expect[rank]), label
            assert dsl.runs_agree(got, expect[rank], bounds[rank]), (label, rank)
