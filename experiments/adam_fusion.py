"""Data-parallel Adam step: all-reduce of gradients fused with the optimizer (paper Fig. 10a)."""
from ._optim import adam_program, optimizer_bindings, optimizer_schedules

NAME = "adam_fusion"
FIGURE = "Fig. 10a"
program = adam_program


def schedules():
    return optimizer_schedules(program())


verify_bindings = optimizer_bindings
