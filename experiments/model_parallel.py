"""Model (tensor) parallel Megatron layer: row-parallel matmul, all-reduce, bias, dropout, residual
(paper Fig. 11).

The matmul is either of the layer's two row-parallel ones, both [S,B,K/P] x [K/P,H]: the attention
output projection (K = H) and the MLP's second matmul (K = 4H); K is bound per point.

Schedules: `MM-AR-C` (the program), `MM-RS-C-AG` (split along S + reorder: bias, dropout and
residual run on slices), `ol(MM,fuse(RS-C-AG))` (the matmul computed in row chunks, each chunk's
fused reduce-scatter + computation + all-gather started as soon as it is produced).

Baseline: Megatron-LM's torch matmul, all-reduce, bias + dropout + residual in torch ops
(`experiments.megatron.MegatronBaseline`). The paper's setting: one DGX-2, 16-way, B in {8, 16},
S=1024, H=3072, K in {H, 4H}, f16; on another topology, one node of it.
"""

from __future__ import annotations

from dsl import Builder, P, Program, Sliced, f16, f32, sym
from dsl.transforms import fuse, overlap, reorder, split

from .api import PaperSetting
from .kinds import Experiment
from .megatron import SCATTER_DIM, B, H, MegatronBaseline, S, bias_dropout_residual, value_of
from .registry import register

K = sym("K")
CHUNKS = 4


def program(dtype=f32) -> Program:
    b = Builder("megatron_layer")
    x = b.input("x", dtype, [S, B, K / P], Sliced(2))
    w = b.input("weight", dtype, [K / P, H], Sliced(0))
    partial = b.matmul(x, w, name="y")
    b.output("out", bias_dropout_residual(b, partial, dtype))
    return b.build(schedule="MM-AR-C")


def schedules(dtype=f32, chunks: int = CHUNKS) -> dict[str, Program]:
    p = program(dtype)
    mm_rs_c_ag = reorder(split(p, dim=SCATTER_DIM))
    ol = overlap(fuse(mm_rs_c_ag), value_of(mm_rs_c_ag, "matmul"), chunks=chunks)
    return {q.schedule: q for q in (p, mm_rs_c_ag, ol)}


def verify_bindings(scale: str) -> list[dict[str, int]]:
    small = [{"B": 2, "S": 16, "H": 8, "K": 8}, {"B": 2, "S": 16, "H": 8, "K": 32}]
    return small if scale == "smoke" else small + [{"B": 4, "S": 32, "H": 16, "K": 64}]


def points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Measured sizes (fp32, 2 ranks on a CPU): both matmuls (K = H, 4H) of a few layer shapes."""
    shapes = {
        "smoke": [(64, 1, 128)],
        "default": [(1024, 1, 1024), (1024, 4, 1024)],
        "paper": [(1024, 1, 3072), (1024, 4, 3072)],
    }[scale]
    return [
        {"S": S, "B": B, "H": H, "K": k * H}
        for S, B, H in shapes
        for k in (1, 4)
        if S * B * H <= max_elements
    ]


_MP = [{"S": 1024, "B": B, "H": 3072, "K": k * 3072} for B in (8, 16) for k in (1, 4)]
PAPER = PaperSetting(
    topologies=(("dgx2", 1),),
    world_size=16,
    dtype=f16,
    points={"smoke": _MP[:1], "default": _MP, "paper": _MP},
    world_on=lambda topo: topo.devices_per_node,
)

EXPERIMENT = register(
    Experiment(
        name="model_parallel",
        figure="Fig. 11",
        program=program,
        schedules=schedules,
        verify_bindings=verify_bindings,
        points=points,
        baseline=MegatronBaseline,
        principal=("S", "B", "H"),
        paper=PAPER,
        split_schedule="MM-RS-C-AG",
        check_bindings=verify_bindings("smoke")[0],
    )
)
