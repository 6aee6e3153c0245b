"""coconet: the suite as a library for users' own training loops.

    import coconet
    step = coconet.compile(program, schedule, {"N": n}, group=pg)   # a DSL program + schedule
    out = step(g=grad, w=weights, m=m_slice, v=v_slice, lr=1e-3, step=1.0)
    opt = coconet.FusedAdam(model.parameters(), lr=1e-3)           # or coconet.FusedLAMB

`compile` / `compile_many` (`coconet.step`): a scheduled program lowered, built and run by the
one PlanRunner, on the caller's tensors, in the caller's process group, for the cpu and cuda
backends. `FusedAdam`, `FusedAdamW`, `FusedLAMB` (`coconet.optimizers`, on
`coconet.optim.FusedOptimizer`, which also wraps a user's own optimizer program): drop-in
`torch.optim.Optimizer`s running the generated `fuse(RS-C-AG)+as_slice` step (reduce-scatter,
update of this rank's slice with the state sliced, all-gather), for data-parallel training
without DDP. The optimizer programs and
schedules are in `coconet.programs` (the experiments use them too).

Layering: suite -> experiments -> coconet -> cost_model -> codegen -> dsl (coconet imports
codegen and dsl only).
"""

from .optim import FusedOptimizer
from .optimizers import FusedAdam, FusedAdamW, FusedLAMB
from .precision import LossScaler
from .step import Step, compile, compile_many

__all__ = [
    "FusedAdam",
    "FusedAdamW",
    "FusedLAMB",
    "FusedOptimizer",
    "LossScaler",
    "Step",
    "compile",
    "compile_many",
]
