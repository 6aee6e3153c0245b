"""Tensor-parallel overlap beyond the paper: the sequence-parallel attention block (the MLP block's
companion, `experiments.tensor_parallel`), its all-gather + matmul and matmul + reduce-scatter
decomposed and overlapped.

The block (Megatron-LM's sequence parallelism; activations [S, B, H], sequence first, each rank
holding S/P rows of the sequence between blocks, H/P columns = heads/P heads of `HEAD_DIM` inside):

    xg      = all_gather(x)             [S/P, B, H] -> [S, B, H]        (x sliced along S)
    q, k, v = xg @ wq, xg @ wk, xg @ wv [S, B, H] x [H, H/P]            (column-parallel: heads)
    o       = attention(q, k, v)        [S, B, H/P], this rank's heads  (`dsl.ops`: per head)
    y       = matmul(o, wo)             [S, B, H/P] x [H/P, H] -> partial sums
    z       = reduce_scatter(y, dim=0)  -> [S/P, B, H]                  (row-parallel)

Schedules: `AG-MM-ATT-MM-RS` (the program, every step whole), `ol(AG,MM)-..` (the q projection
computes each rank's block of the gathered rows as it arrives, its own block first; k and v read
the gathered tensor after it), `..-ol(MM,RS)` (the output projection in row chunks, each chunk
reduce-scattered while the next is computed), and both. `CHUNKS` chunks of each rank's rows.

Baseline (`LibraryAttention`): the library all-gather, three torch matmuls, torch's
scaled_dot_product_attention, torch matmul, the library reduce-scatter, one after the other.

Sizes: measured on CPU ranks at small shapes (heads of 128, as published); predicted at GPT-3 175B (S 2048,
H 12288, 96 heads of 128) and Llama 3 70B (S 8192, H 8192, 64 heads of 128) with TP 8, bf16.
Llama's grouped-query attention (8 key/value heads) is ignored: k and v are projected to all 64
heads, as multi-head attention does, so its k and v matmuls are 8x GQA's.
"""

from __future__ import annotations

import numpy as np
import torch

from codegen.runtime.backend import NO_STREAMS
from codegen.runtime.execute import heads
from dsl import Builder, P, Program, Sliced, f32, sym
from dsl.transforms import overlap

from .api import BaselineContext, TimedCalls
from .kinds import Experiment
from .registry import register
from .tensor_parallel import one_node

S, B, H = sym("S"), sym("B"), sym("H")
CHUNKS = 4
HEAD_DIM = 128  # the published sizes' (GPT-3, Llama 3), and the measured points'


def program(dtype=f32, head_dim: int = HEAD_DIM) -> Program:
    b = Builder("tp_attention")
    x = b.input("x", dtype, [S / P, B, H], Sliced(0))
    w = {n: b.input(n, dtype, [H, H / P], Sliced(1), init="fan_in") for n in ("wq", "wk", "wv")}
    wo = b.input("wo", dtype, [H / P, H], Sliced(0), init="fan_in")
    xg = b.all_gather(x, name="xg")
    q, k, v = (b.matmul(xg, w[f"w{n}"], name=n) for n in "qkv")
    o = b.attention(q, k, v, head_dim=head_dim, name="o")
    y = b.matmul(o, wo, name="y")
    b.output("z", b.reduce_scatter(y, dim=0, name="z"))
    return b.build(schedule="AG-MM-ATT-MM-RS")


def schedules(dtype=f32, chunks: int = CHUNKS, head_dim: int = HEAD_DIM) -> dict[str, Program]:
    p = program(dtype, head_dim)
    ag = overlap(p, "xg", consumer="q", chunks=chunks)  # one of the three readers: the q matmul
    rs = overlap(p, "y", chunks=chunks)
    both = overlap(ag, "y", chunks=chunks)
    return {q.schedule: q for q in (p, ag, rs, both)}


def verify_bindings(scale: str) -> list[dict[str, int]]:
    """Whole heads of 128 on every rank at P <= 8 (H = 8 x 128)."""
    small = [{"S": 16, "B": 2, "H": 1024}]
    return small if scale == "smoke" else small + [{"S": 64, "B": 1, "H": 1024}]


def points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Measured sizes (f32, CPU ranks): (S, B, H), S*B*H at most `max_elements`."""
    shapes = {
        "smoke": [(128, 1, 512)],
        "default": [(1024, 1, 512), (2048, 1, 512)],
        "paper": [(1024, 1, 512), (2048, 1, 1024)],
    }[scale]
    return [{"S": s, "B": b, "H": h} for s, b, h in shapes if s * b * h <= max_elements]


class LibraryAttention(TimedCalls):
    """See the module doc. `compute_ms`: its matmuls and attention; `library_ms`: 0 (the cost
    model times both itself)."""

    def __init__(self, ctx: BaselineContext):
        self.t = ctx.tensors()
        self.comm = ctx.backend.communicator(ctx.group, NO_STREAMS)
        x, wq = self.t["x"], self.t["wq"]
        self.xg = x.new_empty((x.shape[0] * ctx.P, *x.shape[1:]))
        self.qkv = [x.new_empty((*self.xg.shape[:-1], wq.shape[1])) for _ in range(3)]
        self.o = torch.empty_like(self.qkv[0])
        self.y = x.new_empty(self.xg.shape)
        self.z = torch.empty_like(x)
        self.compute_ms = self.library_ms = 0.0

    def _attention(self) -> None:
        q, k, v = (heads(t, HEAD_DIM) for t in self.qkv)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        heads(self.o, HEAD_DIM).copy_(o)

    def step(self) -> None:
        t = self.t
        self.comm.all_gather(t["x"].view(-1), self.xg.view(-1))
        for w, out in zip(("wq", "wk", "wv"), self.qkv):
            self.timed(lambda: torch.matmul(self.xg, t[w], out=out), False)
        self.timed(self._attention, False)
        self.timed(lambda: torch.matmul(self.o, t["wo"], out=self.y), False)
        self.comm.reduce_scatter(self.y.view(-1), self.z.view(-1), "sum")

    def outputs(self) -> dict[str, np.ndarray]:
        return {"z": self.z.float().cpu().numpy().copy()}


_POINTS = [
    {"S": 2048, "B": 1, "H": 12288},  # GPT-3 175B: 96 heads of 128
    {"S": 8192, "B": 1, "H": 8192},  # Llama 3 70B: 64 heads of 128 (GQA ignored)
]
PAPER = one_node(_POINTS)

EXPERIMENT = register(
    Experiment(
        name="tp_attention",
        figure="beyond the paper",
        program=program,
        schedules=schedules,
        verify_bindings=verify_bindings,
        points=points,
        baseline=LibraryAttention,
        principal=("S", "B", "H"),
        paper=PAPER,
        check_bindings=verify_bindings("smoke")[0],
    )
)
