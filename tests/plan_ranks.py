"""Rank functions for `codegen.runtime.launch.launch` that run Plans with the CPU backend.

`run_plans(rank, world, comm, plans, inputs)`: over the communicator `comm` (ring, library or
shm), each Plan from its inputs; this rank's outputs of each Plan, in order. The Plans' generated
kernels are built here (from the build cache when the caller built them first, as it should: one
compile, not one a rank). `run_built(rank, backend, built, plans, inputs)`: the same with kernels
the caller built (`built`: name -> kernel)."""

from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner


def run_plans(rank, world, comm, plans, inputs):
    backend = CpuBackend(comm=comm)
    kernels = list({k.name: k for plan in plans for k in plan.kernels()}.values())
    return run_built(rank, backend, backend.build(kernels) if kernels else {}, plans, inputs)


def run_built(rank, backend, built, plans, inputs):
    """The Plans on this rank with kernels already built (`built`: name -> kernel), in order."""
    outs = []
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, built, backend.groups(plan.stages), backend)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs
