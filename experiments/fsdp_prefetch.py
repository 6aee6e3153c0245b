"""FSDP's layer-ahead all-gather beyond the paper: the next layer's weights gathered while this
layer computes (`prefetch`), in a fully sharded data-parallel MLP.

The program (ZeRO-3 / FSDP: each rank holds 1/P of every weight and its own micro-batch):

    w1f = all_gather(w1)        [H/P, F] -> [H, F]
    h   = matmul(x, w1f)        x: [T, H], this rank's tokens (Local)
    a   = gelu(h)
    w2f = all_gather(w2)        [F/P, H] -> [F, H]
    y   = matmul(a, w2f)

Schedules: `AG-MM-C-AG-MM` (the program: each gather just before the matmul that needs it, as
FSDP without prefetching runs) and `AG-pf(AG,MM)-C-MM` (the second gather started before the
first matmul and run at once with it, as FSDP's forward prefetch does).

Baseline (`LibraryFSDP`): the library all-gathers and torch's matmuls and GeLU, one after the
other (gloo's on the CPU, NCCL's on GPUs), FSDP without prefetch. Predicted on dgx_h100 and
dgx_b200 for one MLP of Llama 3 70B (H 8192, F 28672, bf16) with 8192 tokens a rank, 8 ranks.
"""

from __future__ import annotations

import numpy as np
import torch

from codegen.runtime.backend import NO_STREAMS
from dsl import Builder, Local, P, Program, Sliced, f32, sym
from dsl.transforms import prefetch

from .api import BaselineContext, TimedCalls
from .kinds import Experiment
from .registry import register
from .tensor_parallel import one_node

T, H, F = sym("T"), sym("H"), sym("F")


def program(dtype=f32) -> Program:
    b = Builder("fsdp_mlp")
    x = b.input("x", dtype, [T, H], Local())
    w1 = b.input("w1", dtype, [H / P, F], Sliced(0), init="fan_in")
    w2 = b.input("w2", dtype, [F / P, H], Sliced(0), init="fan_in")
    h = b.matmul(x, b.all_gather(w1, name="w1f"), name="h")
    a = b.gelu(h, name="a")
    b.output("y", b.matmul(a, b.all_gather(w2, name="w2f"), name="y"))
    return b.build(schedule="AG-MM-C-AG-MM")


def schedules(dtype=f32) -> dict[str, Program]:
    p = program(dtype)
    ahead = prefetch(p, "w2f", behind="h")
    return {q.schedule: q for q in (p, ahead)}


def verify_bindings(scale: str) -> list[dict[str, int]]:
    small = [{"T": 6, "H": 8, "F": 16}]
    return small if scale == "smoke" else small + [{"T": 32, "H": 32, "F": 64}]


def points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Measured sizes (f32, CPU ranks): (T, H, F), T*H at most `max_elements`."""
    shapes = {
        "smoke": [(32, 64, 128)],
        "default": [(256, 1024, 2048), (1024, 1024, 4096)],
        "paper": [(2048, 2048, 8192)],
    }[scale]
    return [{"T": t, "H": h, "F": f} for t, h, f in shapes if t * h <= max_elements]


class LibraryFSDP(TimedCalls):
    """See the module doc. `compute_ms`: the matmuls and GeLU; `library_ms`: the GeLU alone."""

    def __init__(self, ctx: BaselineContext):
        self.t = ctx.tensors()
        self.comm = ctx.backend.communicator(ctx.group, NO_STREAMS)
        w1, w2 = self.t["w1"], self.t["w2"]
        self.w1f = w1.new_empty((w1.shape[0] * ctx.P, w1.shape[1]))
        self.w2f = w2.new_empty((w2.shape[0] * ctx.P, w2.shape[1]))
        self.compute_ms = self.library_ms = 0.0
        self.y = None

    def step(self) -> None:
        t = self.t
        self.comm.all_gather(t["w1"].view(-1), self.w1f.view(-1))
        h = self.timed(lambda: torch.matmul(t["x"], self.w1f), False)
        a = self.timed(lambda: torch.nn.functional.gelu(h), True)
        self.comm.all_gather(t["w2"].view(-1), self.w2f.view(-1))
        self.y = self.timed(lambda: torch.matmul(a, self.w2f), False)

    def outputs(self) -> dict[str, np.ndarray]:
        return {"y": self.y.float().cpu().numpy().copy()}


_POINTS = [{"T": 8192, "H": 8192, "F": 28672}]  # Llama 3 70B's MLP, 8192 tokens a rank
PAPER = one_node(_POINTS)

EXPERIMENT = register(
    Experiment(
        name="fsdp_prefetch",
        figure="beyond the paper",
        program=program,
        schedules=schedules,
        verify_bindings=verify_bindings,
        points=points,
        baseline=LibraryFSDP,
        principal=("T", "H"),
        paper=PAPER,
        check_bindings=verify_bindings("smoke")[0],
    )
)
