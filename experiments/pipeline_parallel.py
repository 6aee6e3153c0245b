"""Pipeline-parallel stage boundary of the Megatron layer (paper Fig. 12).

Two pipeline stages, each a tensor-parallel group of P ranks. On stage 0 the layer's partial sums
are all-reduced, then + bias, dropout, + residual, and the result is sent to the peer rank of stage
1 (rank i of stage 0 to rank i of stage 1). Bias and residual are held by both stages.

Schedules: `AR-C-P2P` (the program, Megatron's order), `AR-P2P-C` (the computation moved to the
receiving stage), `RS-P2P-C-AG` (each rank sends only its slice; stage 1 computes on slices and
all-gathers), `ol(RS,fuse(P2P-C-AG))` (the reduce-scatter overlapped chunk by chunk with the fused
send + computation + all-gather).
"""
from __future__ import annotations

from dsl import Builder, Local, Program, f32
from dsl.transforms import fuse, overlap, reorder, split

from ._layer import B, S, SCATTER_DIM, H, bias_dropout_residual, value_of

NAME = "pipeline_parallel"
FIGURE = "Fig. 12"
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
    shapes = {"smoke": [(64, 1, 128)], "default": [(1024, 1, 1024), (1024, 1, 3072)],
              "paper": [(2048, 1, 3072), (2048, 1, 12288)]}[scale]
    return [{"S": S, "B": B, "H": H} for S, B, H in shapes if S * B * H <= max_elements]


def measure(settings):
    """Measured at 2 stages x 1 rank and 2 stages x 2 ranks (4 processes)."""
    from ._mp_measure import measure as run

    rows = []
    for world in (2, 4):
        rows += run(NAME, program(), schedules(), points(settings.scale, settings.max_elements),
                    world, settings.warmup, settings.repeats, settings.csv_path,
                    settings.kernels_dir, "RS-P2P-C-AG", settings.seed, settings.timeout_s,
                    check_bindings=verify_bindings("smoke")[0], backend=settings.backend)
    return rows
