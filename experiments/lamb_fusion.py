"""Data-parallel LAMB step: all-reduce of gradients fused with the optimizer and its two norms
(paper Fig. 10b).

Baseline: `dist.all_reduce` of the gradient, then a vectorised torch LAMB (torch has none; see
`experiments._dp_measure.lamb_step`).
"""
from ._optim import (lamb_program, optimizer_bindings, optimizer_measure, optimizer_schedules,
                     optimizer_sizes)

NAME = "lamb_fusion"
FIGURE = "Fig. 10b"
program = lamb_program
verify_bindings = optimizer_bindings
sizes = optimizer_sizes


def schedules():
    return optimizer_schedules(program())


def measure(settings):
    return optimizer_measure(NAME, "lamb", program(), settings)
