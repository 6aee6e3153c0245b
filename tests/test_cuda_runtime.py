"""The CUDA Plan executor's logic without a GPU: `CudaPlanRunner(device=None)` runs every schedule
of every experiment on 2 gloo ranks (pipeline also on 4 = 2 stages x 2) with the generated CUDA
kernels emulated on the CPU (tests/cuda_emulation.py), and equals `dsl.interpret` of the same
schedule on the same inputs, within the CPU runtime tests' tolerance. This covers the chunking of
the fused all-reduce (packing, per-chunk reduce-scatter and all-gather placement), the overlapped
matmul and send, the collectives and P2P as the NCCL path issues them; what it cannot cover is the
concurrency of streams and events, and NCCL itself (tests/test_build_cuda.py runs those on a GPU).
"""
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulation import EmulatedModule  # noqa: E402
from suite.cuda import compare, make_cases, program_experiments  # noqa: E402

import experiments  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to emulate kernels with")


def _cases(world: int):
    out = []
    for name in program_experiments():
        mod = experiments.load(name)
        for sched, program in mod.schedules().items():
            if world % program.stages or (world == 4 and program.stages == 1):
                continue
            bindings = [dict(b) for b in mod.verify_bindings("smoke")]
            if "N" in bindings[0]:
                bindings = [{"N": 64 * world}]
            for case in make_cases(program, bindings, world, seed=7):
                out.append((f"{name}:{sched}",) + case)
    return out


def _rank(rank, world, plans, inputs, kernel_list, workdir):
    from codegen.runtime.cuda_execute import CudaPlanRunner, nccl_groups

    fns = EmulatedModule(kernel_list, Path(workdir)).functions()
    outs = []
    for plan, inp in zip(plans, inputs):
        runner = CudaPlanRunner(plan, rank, fns, nccl_groups(plan, "gloo"), device=None)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_through_the_cuda_executor_matches_the_interpreter(world, tmp_path):
    from codegen.runtime.launch import launch

    cases = _cases(world)
    kernels = list({k.name: k for c in cases for k in c[2].kernels()}.values())
    EmulatedModule(kernels, tmp_path)  # compile once; the ranks load it
    results = launch(_rank, world, args=([c[2] for c in cases], [c[3] for c in cases], kernels,
                                         str(tmp_path)), timeout_s=240)
    for k, (label, bindings, plan, _, expect, tol) in enumerate(cases):
        err, msg = compare([r[k] for r in results], expect, tol)
        assert err is not None, f"{label} at {bindings}: {msg}"


# -- suite.cuda's GPU verification, with the ranks faked ----------------------------------------------
def _cfg(world_sizes, world_size):
    from types import SimpleNamespace as NS
    return NS(verify=NS(world_sizes=world_sizes), world_size=world_size, seed=0,
              scale=NS(name="default"))


@pytest.mark.parametrize("stages, gpus, wanted, want", [(1, 1, [2, 4], [1]), (1, 8, [2, 4], [2, 4]),
                                                        (2, 1, [2, 4], []), (2, 3, [2, 4], [2]),
                                                        (2, 8, [3], [8])])
def test_gpu_worlds(stages, gpus, wanted, want):
    from types import SimpleNamespace as NS
    from suite.cuda import gpu_worlds
    assert gpu_worlds(_cfg(wanted, wanted[0]), NS(stages=stages), gpus) == want


def test_verify_on_gpus_launches_once_per_world_and_assigns_every_result(monkeypatch, capsys):
    import suite.cuda as sc

    launches = []

    def fake_run_cases(cases, world):
        launches.append((len(cases), world))
        return [(c[0], None, "boom") if i == 3 else (c[0], float(i), "") for i, c in enumerate(cases)]

    monkeypatch.setattr(sc, "run_cases", fake_run_cases)
    exp = experiments.load("adam_fusion")
    checks = sc.verify_on_gpus(_cfg([2], 2), exp, exp.schedules(), gpus=2)
    bindings = exp.verify_bindings("default")
    assert launches == [(len(bindings) * 5, 2)]
    assert [c.max_abs_error for c in checks] == [None if i == 3 else float(i) for i in range(10)]
    assert [c.bindings for c in checks[:2]] == bindings and checks[3].message == "boom"
    assert capsys.readouterr().out.count("FAILED") == 1
