"""Data-parallel Adam step: all-reduce of gradients fused with the optimizer (paper Fig. 10a).

Baseline: `dist.all_reduce` of the gradient, then `torch.optim.Adam(fused=True)`.
"""
from ._optim import (adam_program, optimizer_bindings, optimizer_measure, optimizer_schedules,
                     optimizer_sizes)

NAME = "adam_fusion"
FIGURE = "Fig. 10a"
program = adam_program
verify_bindings = optimizer_bindings
sizes = optimizer_sizes


def schedules():
    return optimizer_schedules(program())


def measure(settings):
    return optimizer_measure(NAME, "adam", program(), settings)
