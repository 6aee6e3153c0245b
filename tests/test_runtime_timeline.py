"""The runner's timeline (`PlanRunner.marks`, `codegen.runtime.pipelined`'s marks).

- With the timeline on, every schedule of every experiment still equals `dsl.interpret` (2 ranks,
  through the rings and through shared memory: every composite path marks), its marks begin with
  the call, run forward in time, and name only the plan's own steps (`codegen.plan.label`).
- LAMB's fused step (a barrier between its two kernels) is timed as the pieces
  `fused_all_reduce` runs, in that order.
- Off by default: a runner keeps no timeline.
"""

import pytest
from test_runtime_plans import _cases  # every schedule of every experiment, on 2 ranks

import dsl
import experiments
from codegen.lower import lower
from codegen.plan import label, walk
from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch


def _marked(rank, world, comm, plans, inputs, kernel_list):
    backend = CpuBackend(comm=comm)
    kernels = backend.build(kernel_list)
    out = []
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, kernels, backend.groups(plan.stages), backend)
        default = runner.marks
        runner.load(inp[rank])
        runner.marks = []
        runner.run()
        out.append((runner.outputs(), runner.marks, default))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["ring", "shm"])
def test_timeline_keeps_results_and_names_the_plans_steps(comm):
    cases = _cases(2)
    kernel_list = list({k.name: k for c in cases for k in c[1].kernels()}.values())
    CpuBackend().build(kernel_list)
    got = launch(
        _marked,
        2,
        args=(comm, [c[1] for c in cases], [c[2] for c in cases], kernel_list),
        timeout_s=240,
    )
    for k, (name, plan, _, expect, bounds) in enumerate(cases):
        steps = {label(s) for s in walk(plan.steps)}
        for rank in range(2):
            outputs, marks, default = got[rank][k]
            assert default is None, name
            assert dsl.runs_agree(outputs, expect[rank], bounds[rank]), (name, comm, rank)
            assert marks[0][0] == "" and len(marks) >= 2, name
            times = [t for _, t in marks]
            assert times == sorted(times), name
            for segment, _ in marks[1:]:
                assert any(segment == s or segment.startswith(s + " ") for s in steps), (
                    name,
                    segment,
                )


def _lamb_labels(rank, world, kernel_list, plan):
    backend = CpuBackend()
    r = PlanRunner(plan, rank, backend.build(kernel_list), backend.groups(plan.stages), backend)
    runs = []
    for _ in range(2):
        r.marks = []
        r.run()
        runs.append([m[0] for m in r.marks[1:]])
    return runs


@pytest.mark.slow
def test_lamb_fused_step_segments_in_the_order_it_runs():
    exp = experiments.get("lamb_fusion")
    plan = lower(exp.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 4096}, 2, fused_chunks=4)
    CpuBackend().build(plan.kernels())
    got = launch(_lamb_labels, 2, args=(plan.kernels(), plan), timeout_s=120)
    rs, k1, norm_w, norm_u, k4, ag = (label(s) for s in plan.steps[0].steps)
    want = (
        [f"{rs} start"]
        + [x for c in range(4) for x in (f"{rs} wait c{c}", f"{k1} c{c}")]
        + [norm_w, norm_u]
        + [x for c in range(4) for x in (f"{k4} c{c}", f"{ag} send c{c}")]
        + [f"{rs} wait", f"{ag} wait"]
    )
    assert got == [[want, want], [want, want]]
