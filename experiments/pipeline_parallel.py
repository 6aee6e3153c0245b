"""Pipeline-parallel stage boundary of the Megatron layer (paper Fig. 12).

Two pipeline stages, each a tensor-parallel group of P ranks. On stage 0 the layer's partial sums
are all-reduced, then + bias, dropout, + residual, and the result is sent to the peer rank of stage
1 (rank i of stage 0 to rank i of stage 1). Bias and residual are held by both stages.

Schedules: `AR-C-P2P` (the program, Megatron's order), `AR-P2P-C` (the computation moved to the
receiving stage), `RS-P2P-C-AG` (each rank sends only its slice; stage 1 computes on slices and
all-gathers), `ol(RS,fuse(P2P-C-AG))` (the reduce-scatter overlapped chunk by chunk with the fused
send + computation + all-gather).

Baseline: the layer's tail as Megatron-LM writes it, then a library send to the next stage
(`experiments.megatron.MegatronBaseline`); measured at 2 stages x 1 rank and 2 stages x 2 ranks
(4 processes). The paper's setting: GPT-3 175B (hidden 12288, seq 2048, micro-batch 1), tensor 8
x pipeline 16, the boundary between two stages (16 GPUs), f16, on DGX-2, DGX A100 and DGX H100
nodes; on another topology, two stages of min(8, devices per node).
"""

from __future__ import annotations

from dsl import Builder, Local, Program, f16, f32
from dsl.transforms import fuse, overlap, reorder, split

from .api import PaperSetting
from .kinds import Experiment
from .megatron import SCATTER_DIM, B, H, MegatronBaseline, S, bias_dropout_residual, value_of
from .registry import register

CHUNKS = 4


def program(dtype=f32) -> Program:
    b = Builder("pipeline_boundary", stages=2)
    partial = b.input("y", dtype, [S, B, H], Local(), stage=0)
    out = bias_dropout_residual(b, partial, dtype)
    b.output("out", b.send(out, dst=1, name="sent"))
    return b.build(schedule="AR-C-P2P")


def schedules(dtype=f32, chunks: int = CHUNKS) -> dict[str, Program]:
    p = program(dtype)
    ar_p2p_c = reorder(p, value_of(p, "p2p"))
    rs = split(p, dim=SCATTER_DIM)
    rs = reorder(rs, value_of(rs, "p2p"))
    rs_p2p_c_ag = reorder(rs, value_of(rs, "all_gather"))
    fused = fuse(rs_p2p_c_ag, first=value_of(rs_p2p_c_ag, "p2p"))
    ol = overlap(fused, value_of(fused, "reduce_scatter"), chunks=chunks)
    return {q.schedule: q for q in (p, ar_p2p_c, rs_p2p_c_ag, ol)}


def verify_bindings(scale: str) -> list[dict[str, int]]:
    small = [{"B": 1, "S": 16, "H": 8}]
    return small if scale == "smoke" else small + [{"B": 2, "S": 32, "H": 12}]


def points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Measured sizes (fp32, micro-batch 1, on a CPU)."""
    shapes = {
        "smoke": [(64, 1, 128)],
        "default": [(1024, 1, 1024), (1024, 1, 3072)],
        "paper": [(2048, 1, 3072), (2048, 1, 12288)],
    }[scale]
    return [{"S": S, "B": B, "H": H} for S, B, H in shapes if S * B * H <= max_elements]


_PP = [{"S": 2048, "B": 1, "H": 12288}]
PAPER = PaperSetting(
    topologies=(("dgx2", 1), ("dgx_a100", 2), ("dgx_h100", 2)),
    world_size=16,
    dtype=f16,
    points={"smoke": _PP, "default": _PP, "paper": _PP},
    world_on=lambda topo: 2 * min(8, topo.devices_per_node),
)

EXPERIMENT = register(
    Experiment(
        name="pipeline_parallel",
        figure="Fig. 12",
        program=program,
        schedules=schedules,
        verify_bindings=verify_bindings,
        points=points,
        baseline=MegatronBaseline,
        principal=("S", "B", "H"),
        paper=PAPER,
        measure_worlds=(2, 4),
        split_schedule="RS-P2P-C-AG",
        check_bindings=verify_bindings("smoke")[0],
    )
)
