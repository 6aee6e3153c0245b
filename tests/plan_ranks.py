"""A rank's function for `codegen.runtime.launch.launch`: run Plans on this rank with the CPU
backend over the communicator `comm` (ring, library or shm), each from its inputs; this rank's
outputs of each Plan, in order. The Plans' generated kernels are built here (from the build cache
when the caller built them first, as it should: one compile, not one a rank)."""

from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner


def run_plans(rank, world, comm, plans, inputs):
    backend, outs = CpuBackend(comm=comm), []
    kernels = list({k.name: k for plan in plans for k in plan.kernels()}.values())
    built = backend.build(kernels) if kernels else {}
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, built, backend.groups(plan.stages), backend)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs
