"""Data-parallel LAMB step: all-reduce of gradients fused with the optimizer and its two norms
(paper Fig. 10b).

Baseline: `dist.all_reduce` of the gradient, then a vectorised torch LAMB (torch has none;
`experiments.optimizers.LambBaseline`).
"""

from .kinds import Experiment
from .optimizers import (
    LambBaseline,
    lamb_program,
    optimizer_bindings,
    optimizer_points,
    optimizer_schedules,
    paper_setting,
)
from .registry import register


def schedules(dtype=None):
    return optimizer_schedules(lamb_program())


EXPERIMENT = register(
    Experiment(
        name="lamb_fusion",
        figure="Fig. 10b",
        program=lamb_program,
        schedules=schedules,
        verify_bindings=optimizer_bindings,
        points=optimizer_points,
        baseline=LambBaseline,
        principal=("N",),
        paper=paper_setting(lamb_program),
    )
)
