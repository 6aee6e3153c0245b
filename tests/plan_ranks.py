"""A rank's function for `codegen.runtime.launch.launch`: run Plans on this rank with the CPU
backend over the communicator `comm` (ring, library or shm), each from its inputs, the generated
kernels built on demand; this rank's outputs of each Plan, in order."""

from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner


def run_plans(rank, world, comm, plans, inputs):
    backend, outs = CpuBackend(comm=comm), []
    for plan, inp in zip(plans, inputs):
        runner = PlanRunner(plan, rank, {}, backend.groups(plan.stages), backend)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs
