"""`compile(program, schedule, bindings, group=...)`: a DSL program and a schedule as a callable
distributed step over torch tensors, in the caller's process group.

    import coconet
    from coconet.programs import adam_program, sliced_schedule
    step = coconet.compile(adam_program(), sliced_schedule, {"N": n}, group=None)  # every rank
    out = step(g=grad, w=weights, m=m_slice, v=v_slice, lr=1e-3, step=1.0)     # every rank

Contract
- Collective: every member of `group` (a torch.distributed ProcessGroup; None = every rank, with
  torch.distributed initialised) calls `compile` with the same arguments, and then every step in
  the same order. `schedule` is a `Program -> Program` function of `dsl.transforms` (None: the
  program as given). The scheduled program is lowered at `bindings` (sizes, P = the group's size)
  into a Plan, its kernels are built for `backend` ("cpu": C++/OpenMP and gloo; "cuda": CUDA
  through CuPy and NCCL; or a `codegen.runtime.backend.Backend`), once per module source and then
  from the build cache, and a `PlanRunner` runs it.
- `step(**tensors)` takes, by input name: tensors of the input's local shape (a `Sliced` input
  holds this rank's slice: N/P elements), dtype and device, contiguous: they are used in place
  (aliased: the step reads them where they are and writes the program's updates into them; no
  copy); or, for a 0-d input (a hyper-parameter), a Python number. An input not given keeps what
  the previous call left in it (its default before the first call). Returns the outputs by name:
  the tensors holding them (the caller's own tensor where it gave one), valid until the next call.
- Bad input (an unknown name, a wrong shape, dtype or device) is a ValueError naming the input.
- `step.plan` is the Plan (for the cost model: `cost_model` predicts the same steps);
  `step.compute_ms` the host time spent in kernels so far.
Only single-stage programs (no pipeline stages) are compiled for a caller's group.
"""

from __future__ import annotations

from numbers import Number
from typing import Callable, Mapping, Optional, Union

import torch
import torch.distributed as dist

from codegen.lower import lower
from codegen.plan import Plan
from codegen.runtime import backend as backends
from codegen.runtime.comm import Group
from codegen.runtime.execute import PlanRunner
from dsl import Program

Schedule = Optional[Callable[[Program], Program]]


class Step:
    """A compiled distributed step (see the module doc)."""

    def __init__(self, plan: Plan, runner: PlanRunner):
        self.plan, self.runner = plan, runner
        self._zero_d = {name for name, bid in plan.inputs if plan.buffer(bid).shape == ()}

    def __call__(self, **tensors: Union[torch.Tensor, Number]) -> dict[str, torch.Tensor]:
        for name, value in tensors.items():
            if isinstance(value, torch.Tensor):
                if self.runner.bufs.get(dict(self.plan.inputs).get(name)) is not value:
                    self.runner.bind(name, value)
            elif name in self._zero_d and isinstance(value, Number):
                self.runner.input(name).fill_(value)
            else:
                raise ValueError(
                    f"{self.plan.name}: input {name!r} takes a tensor"
                    + (" or a number" if name in self._zero_d else "")
                    + f", got {type(value).__name__}"
                )
        self.runner.run()
        return {name: self.runner.bufs[bid] for name, bid in self.plan.outputs}

    @property
    def compute_ms(self) -> float:
        return self.runner.compute_ms


def compile(
    program: Program,
    schedule: Schedule,
    bindings: Mapping[str, int],
    *,
    group=None,
    backend: Union[str, backends.Backend] = "cpu",
    chunks: int = 4,
    tensors: Optional[Mapping[str, torch.Tensor]] = None,
) -> Step:
    """Lower, build and set up `schedule(program)` on this rank of `group` (collective);
    `tensors`: inputs bound (aliased) from the start, so their buffers are never allocated."""
    return compile_many(
        [(program, schedule, bindings, tensors)], group=group, backend=backend, chunks=chunks
    )[0]


def compile_many(
    items, *, group=None, backend: Union[str, backends.Backend] = "cpu", chunks: int = 4
) -> list[Step]:
    """`compile` of several (program, schedule, bindings[, tensors]) at once, their kernels built
    into one module (one compile, not one per item; identical kernels once)."""
    if not dist.is_initialized():
        raise ValueError(
            "coconet.compile: torch.distributed is not initialised "
            "(call torch.distributed.init_process_group first)"
        )
    members = Group.world() if group is None else Group.of(group)
    target = backends.get(backend) if isinstance(backend, str) else backend
    plans, bound = [], []
    for program, schedule, bindings, *tensors in items:
        bound.append(tensors[0] if tensors else None)
        scheduled = schedule(program) if schedule is not None else program
        if scheduled.stages != 1:
            raise ValueError(
                f"coconet.compile: {scheduled.name} has {scheduled.stages} pipeline "
                "stages; only single-stage programs run in a caller's group"
            )
        plans.append(lower(scheduled, dict(bindings), members.size, fused_chunks=chunks))
    unique = list({k.name: k for plan in plans for k in plan.kernels()}.values())
    kernels = target.build(unique, plans[0].name if plans else None)
    groups = backends.Groups(members, (members,))
    return [
        Step(plan, PlanRunner(plan, members.me, kernels, groups, target, tensors=t))
        for plan, t in zip(plans, bound)
    ]
