"""Data-parallel Adam step: all-reduce of gradients fused with the optimizer (paper Fig. 10a).

Baseline: `dist.all_reduce` of the gradient, then `torch.optim.Adam(fused=True)`
(`experiments.optimizers.AdamBaseline`).
"""

from .kinds import Experiment
from .optimizers import (
    AdamBaseline,
    adam_program,
    optimizer_bindings,
    optimizer_points,
    optimizer_schedules,
    paper_setting,
)
from .registry import register


def schedules(dtype=None):
    return optimizer_schedules(adam_program())


EXPERIMENT = register(
    Experiment(
        name="adam_fusion",
        figure="Fig. 10a",
        program=adam_program,
        schedules=schedules,
        verify_bindings=optimizer_bindings,
        points=optimizer_points,
        baseline=AdamBaseline,
        principal=("N",),
        paper=paper_setting(adam_program),
    )
)
