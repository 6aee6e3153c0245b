"""Model (tensor) parallel Megatron layer: row-parallel matmul, all-reduce, bias, dropout, residual
(paper Fig. 11).

The matmul is either of the layer's two row-parallel ones, both [S,B,K/P] x [K/P,H]: the attention
output projection (K = H) and the MLP's second matmul (K = 4H); K is bound per point.

Schedules: `MM-AR-C` (the program), `MM-RS-C-AG` (split along S + reorder: bias, dropout and
residual run on slices), `ol(MM,fuse(RS-C-AG))` (the matmul computed in row chunks, each chunk's
fused reduce-scatter + computation + all-gather started as soon as it is produced).
"""
from __future__ import annotations

from dsl import Builder, P, Program, Sliced, f32, sym
from dsl.transforms import fuse, overlap, reorder, split

from ._layer import B, S, SCATTER_DIM, H, bias_dropout_residual, value_of

NAME = "model_parallel"
FIGURE = "Fig. 11"
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
    shapes = {"smoke": [(64, 1, 128)], "default": [(1024, 1, 1024), (1024, 4, 1024)],
              "paper": [(1024, 1, 3072), (1024, 4, 3072)]}[scale]
    return [{"S": S, "B": B, "H": H, "K": k * H} for S, B, H in shapes for k in (1, 4)
            if S * B * H <= max_elements]


def measure(settings):
    from ._mp_measure import measure as run

    return run(NAME, program(), schedules(), points(settings.scale, settings.max_elements),
               settings.world_size, settings.warmup, settings.repeats, settings.csv_path,
               settings.kernels_dir, "MM-RS-C-AG", settings.seed, settings.timeout_s,
               check_bindings=verify_bindings("smoke")[0], backend=settings.backend)
