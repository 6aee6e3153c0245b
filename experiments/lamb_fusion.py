"""Data-parallel LAMB step: all-reduce of gradients fused with the optimizer and its two norms
(paper Fig. 10b)."""
from ._optim import lamb_program, optimizer_bindings, optimizer_schedules

NAME = "lamb_fusion"
FIGURE = "Fig. 10b"
program = lamb_program


def schedules():
    return optimizer_schedules(program())


verify_bindings = optimizer_bindings
