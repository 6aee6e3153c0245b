"""Every schedule of every experiment, lowered to a Plan, run by the one PlanRunner on gloo ranks,
equals `dsl.interpret` of the same schedule on the same inputs (2 ranks; the model-parallel layer
also on 4, the pipeline also on 4 = 2 stages x 2), through both communicator paths:

- `ring`: the CPU backend as it measures (C++/OpenMP kernels, chunked rings over gloo P2P);
- `library`: the CUDA backend's path without a GPU: the generated CUDA kernels emulated on the CPU
  (tests/cuda_emulation.py) and torch.distributed's own collectives issued chunk by chunk
  (`LibraryComm`, NCCL on GPUs, gloo here). This covers the CUDA kernels, the chunking of the fused
  all-reduce (packing, per-chunk reduce-scatter and all-gather placement), the overlapped matmul
  and send as the NCCL path issues them; not the concurrency of CuPy streams and events, nor NCCL.

Also: a bf16 program (split, reorder, fuse: a fused reduce-scatter, bf16 kernels, all-gather) runs
on the CPU runner, its bf16 outputs read back as float32; the runner has a rule for every Plan step
type and every collective kind, and names a step it has none for.
Agreement: `dsl.runs_agree`, each element within twice its `dsl.error_bounds` bound (reduction
order differs between the ring and numpy).
"""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dsl
import experiments
from coconet.programs import adam_program, sliced_schedule
from codegen.lower import lower
from codegen.runtime.backend import CpuBackend, Groups
from codegen.runtime.comm import Group
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch
from dsl import Builder, Local, Replicated, bf16, sym
from dsl.transforms import fuse, reorder, split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulation import EmulatedModule  # noqa: E402
from plan_ranks import run_built  # noqa: E402


def _case(label, prog, world, b):
    plan = lower(prog, b, world, fused_chunks=2)
    inputs = dsl.random_inputs(prog, world, b, np.random.default_rng(7))
    expect = dsl.interpret(prog, inputs, world, b)
    return (label, plan, inputs, expect, dsl.error_bounds(prog, inputs, world, b))


def _cases(world: int):
    cases = []
    for name in [e.name for e in experiments.registry.program_experiments()]:
        mod = experiments.get(name)
        for sched_name, prog in mod.schedules().items():
            if world % prog.stages:
                continue
            b = dict(mod.verify_bindings("smoke")[0])
            if "N" in b:
                b["N"] = 64 * (world // prog.stages)
            cases.append(_case(f"{name}:{sched_name}", prog, world, b))
    return cases


def _kernels(comm: str, kernel_list, workdir):
    if comm == "library":
        return EmulatedModule(kernel_list, Path(workdir)).functions()
    return CpuBackend().build(kernel_list)


def _rank(rank, world, comm, plans, inputs, kernel_list, workdir):
    kernels = _kernels(comm, kernel_list, workdir)
    return run_built(rank, CpuBackend(comm=comm), kernels, plans, inputs)


def _check(cases, comm, world, workdir):
    kernel_list = list({k.name: k for c in cases for k in c[1].kernels()}.values())
    _kernels(comm, kernel_list, workdir)  # compile once in the parent; ranks load from the cache
    results = launch(
        _rank,
        world,
        args=(comm, [c[1] for c in cases], [c[2] for c in cases], kernel_list, str(workdir)),
        timeout_s=240,
    )
    for k, (label, _, _, expect, bounds) in enumerate(cases):
        for rank in range(world):
            got = results[rank][k]
            assert set(got) == set(expect[rank]), label
            assert dsl.runs_agree(got, expect[rank], bounds[rank]), (label, comm, rank)


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["ring", "library", "shm"])
@pytest.mark.parametrize("world", [2, 4])
def test_plans_match_interpreter(world, comm, tmp_path):
    if comm == "library" and shutil.which("g++") is None:
        pytest.skip("no g++ to emulate the CUDA kernels with")
    cases = _cases(world)
    if world == 4:  # 4 ranks on 2 cores: the layer experiments (the optimizers are 2-rank)
        cases = [c for c in cases if c[0].startswith(("pipeline", "model"))]
        if comm == "library":  # the pipeline's stages: the CUDA path's P2P between them
            cases = [c for c in cases if c[1].stages > 1]
    _check(cases, comm, world, tmp_path)


def bf16_program() -> dsl.Program:
    """A bf16 gradient all-reduced and scaled into bf16 weights (momentum SGD)."""
    b = Builder("sgd_bf16")
    N = sym("N")
    g = b.input("g", bf16, [N], Local())
    w = b.input("w", bf16, [N], Replicated())
    m = b.input("m", bf16, [N], Replicated())
    g = b.all_reduce(g)
    m2 = m * 0.9 + g
    b.update(m, m2)
    b.update(w, w - 0.01 * m2)
    return b.build()


@pytest.mark.slow
def test_bf16_program_runs_on_the_cpu_runner(tmp_path):
    prog = bf16_program()
    fused = fuse(reorder(split(prog)))
    cases = [
        _case(f"bf16:{name}", p, 2, {"N": 256})
        for name, p in (("AR-C", prog), ("fuse(RS-C-AG)", fused))
    ]
    assert {b.dtype for b in cases[1][1].buffers} == {bf16}
    _check(cases, "ring", 2, tmp_path)


def test_every_plan_step_and_collective_has_a_runner_rule():
    import typing

    from codegen.plan import Step
    from codegen.runtime.execute import COLLECTIVES, RULES
    from dsl.ops import COLLECTIVE

    steps = {t if isinstance(t, type) else t.__forward_arg__ for t in typing.get_args(Step)}
    assert {t.__name__ if isinstance(t, type) else t for t in steps} == {t.__name__ for t in RULES}
    assert set(COLLECTIVE) == set(COLLECTIVES)


def test_a_step_without_a_rule_is_named():
    class Unknown:
        pass

    runner = PlanRunner.__new__(PlanRunner)
    with pytest.raises(NotImplementedError, match="rule for Unknown not implemented"):
        runner.step(Unknown())


def test_the_runner_aliases_the_callers_tensors():
    """`tensors=` / `bind`: the caller's tensor IS the input's buffer (never allocated, no copy);
    a tensor of another shape, dtype or layout is refused with the input's name."""
    plan = lower(sliced_schedule(adam_program()), {"N": 48}, 2, fused_chunks=2)
    solo = Group(None, (0, 1), 1.0)  # never used: nothing runs
    w, m = torch.zeros(48), torch.zeros(24)
    runner = PlanRunner(
        plan, 0, {}, Groups(solo, (solo,)), tensors={"w": w, "m": m, "lr": torch.tensor(0.5)}
    )
    assert runner.input("w") is w and runner.input("m") is m
    assert float(runner.input("lr")) == 0.5 and float(runner.input("eps")) == pytest.approx(1e-8)
    v = torch.ones(24)
    runner.bind("v", v)
    assert runner.input("v") is v
    runner.load({"w": np.arange(48, dtype=np.float32)})
    assert w[47] == 47  # load writes into the caller's tensor
    for bad, why in (
        (torch.zeros(47), r"shape \[48\]"),
        (torch.zeros(48, dtype=torch.float64), "got torch.float64"),
        (torch.zeros(96)[::2], "not contiguous"),
    ):
        with pytest.raises(ValueError, match=why):
            runner.bind("w", bad)
    with pytest.raises(ValueError, match="no input 'x'"):
        runner.bind("x", w)


def test_load_names_a_misspelled_input_and_the_slice_an_as_sliced_input_takes():
    """`load`: a name the plan has no input of is an error naming it and the inputs there are
    (not silently ignored); a whole array for an as_slice'd input names the input and the slice
    shape it takes (not a bare reshape error); nothing is half-loaded by a misspelled name."""
    plan = lower(sliced_schedule(adam_program()), {"N": 48}, 2, fused_chunks=2)
    solo = Group(None, (0, 1), 1.0)
    runner = PlanRunner(plan, 1, {}, Groups(solo, (solo,)))
    with pytest.raises(ValueError, match=r"no input 'mm'; inputs: g, w, m, v, lr"):
        runner.load({"w": np.ones(48, np.float32), "mm": np.zeros(24, np.float32)})
    assert float(runner.input("w").sum()) == 0.0
    with pytest.raises(ValueError) as err:
        runner.load({"m": np.zeros(48, np.float32)})
    msg = str(err.value)
    assert "input 'm' takes an array of shape [24]" in msg and "slice along dim 0" in msg
    assert "got [48] (the whole array?)" in msg and "\n" not in msg
    with pytest.raises(ValueError, match=r"input 'w' takes an array of shape \[48\], got \[24\]"):
        runner.load({"w": np.zeros(24, np.float32)})
    runner.load({"m": np.arange(24, dtype=np.float32), "lr": np.float32(0.25)})
    assert float(runner.input("m")[23]) == 23.0 and float(runner.input("lr")) == 0.25
