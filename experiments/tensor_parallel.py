"""Tensor-parallel overlap beyond the paper: a sequence-parallel transformer MLP block whose
all-gather + matmul and matmul + reduce-scatter are decomposed and overlapped, as PyTorch's async
tensor parallelism and Flux run them.

The block (Megatron-LM's sequence parallelism; activations [S, B, H], sequence first, each rank
holding S/P rows of the sequence between blocks):

    xg = all_gather(x)              [S/P, B, H] -> [S, B, H]       (x sliced along S)
    h  = matmul(xg, w1)             [S, B, H] x [H, F/P]           (column-parallel)
    a  = gelu(h)
    y  = matmul(a, w2)              [S, B, F/P] x [F/P, H] -> partial sums
    z  = reduce_scatter(y, dim=0)   -> [S/P, B, H]                 (row-parallel)

Schedules: `AG-MM-C-MM-RS` (the program, every step whole), `ol(AG,MM)-C-MM-RS` (each rank's
block of the gathered rows multiplied as soon as it arrives, its own block first: the all-gather
hides behind the matmul), `AG-MM-C-ol(MM,RS)` (the second matmul computed in row chunks, each
chunk reduce-scattered while the next is computed), and both overlaps. `CHUNKS` chunks of each
rank's block of rows.

Baseline (`LibraryMLP`): the library way, as Megatron-LM without overlap runs it: the library
all-gather, torch matmul, torch's GeLU, torch matmul, the library reduce-scatter, one after the
other (gloo's on the CPU, NCCL's on GPUs). torch's own `fused_all_gather_matmul` /
`fused_matmul_reduce_scatter` need CUDA symmetric memory and do not run on gloo ranks; they are
the published figures beside the predictions (FIELD_NOTES).

Sizes: measured on CPU ranks at shapes whose communication is a visible share of the step (a CPU
multiplies ~10x slower against gloo's transfers than an H100 against NVLink, so a narrow F keeps
the same balance); predicted at the Megatron-style sizes of GPT-3 175B (H 12288, F 4H, S 2048)
and Llama 3 70B (H 8192, F 28672, S 8192) with TP 8 (one node), bf16.
"""

from __future__ import annotations

import numpy as np
import torch

from codegen.runtime.backend import NO_STREAMS
from cost_model.contention import CE_KINDS, overlap_pair
from cost_model.topology import load_topology
from dsl import Builder, P, Program, Sliced, bf16, f32, sym
from dsl.transforms import overlap

from . import tp_published
from .api import BaselineContext, PaperSetting, TimedCalls
from .kinds import Experiment
from .registry import register

S, B, H, F = sym("S"), sym("B"), sym("H"), sym("F")
CHUNKS = 4


def program(dtype=f32) -> Program:
    b = Builder("tp_mlp")
    x = b.input("x", dtype, [S / P, B, H], Sliced(0))
    w1 = b.input("w1", dtype, [H, F / P], Sliced(1), init="fan_in")
    w2 = b.input("w2", dtype, [F / P, H], Sliced(0), init="fan_in")
    xg = b.all_gather(x, name="xg")
    h = b.matmul(xg, w1, name="h")
    y = b.matmul(b.gelu(h, name="a"), w2, name="y")
    b.output("z", b.reduce_scatter(y, dim=0, name="z"))
    return b.build(schedule="AG-MM-C-MM-RS")


def schedules(dtype=f32, chunks: int = CHUNKS) -> dict[str, Program]:
    p = program(dtype)
    ag = overlap(p, "xg", chunks=chunks)
    rs = overlap(p, "y", chunks=chunks)
    both = overlap(ag, "y", chunks=chunks)
    return {q.schedule: q for q in (p, ag, rs, both)}


def verify_bindings(scale: str) -> list[dict[str, int]]:
    small = [{"S": 16, "B": 2, "H": 8, "F": 16}]
    return small if scale == "smoke" else small + [{"S": 64, "B": 1, "H": 32, "F": 64}]


def points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Measured sizes (f32, CPU ranks): (S, B, H, F), S*B*H at most `max_elements`."""
    shapes = {
        "smoke": [(64, 1, 64, 64)],
        "default": [(2048, 1, 1024, 256), (2048, 1, 1024, 1024), (1024, 1, 1024, 4096)],
        "paper": [(4096, 1, 2048, 512), (2048, 1, 2048, 8192)],
    }[scale]
    return [{"S": s, "B": b, "H": h, "F": f} for s, b, h, f in shapes if s * b * h <= max_elements]


class LibraryMLP(TimedCalls):
    """See the module doc. `compute_ms`: its matmuls and GeLU; `library_ms`: the GeLU alone (the
    cost model times matmuls itself)."""

    def __init__(self, ctx: BaselineContext):
        self.t = ctx.tensors()
        self.comm = ctx.backend.communicator(ctx.group, NO_STREAMS)
        x, w1 = self.t["x"], self.t["w1"]
        self.xg = x.new_empty((x.shape[0] * ctx.P, *x.shape[1:]))
        self.h = x.new_empty((*self.xg.shape[:-1], w1.shape[1]))
        self.y = x.new_empty(self.xg.shape)
        self.z = torch.empty_like(x)
        self.compute_ms = self.library_ms = 0.0

    def _gelu(self) -> None:
        self.a = torch.nn.functional.gelu(self.h)

    def step(self) -> None:
        t = self.t
        self.comm.all_gather(t["x"].view(-1), self.xg.view(-1))
        self.timed(lambda: torch.matmul(self.xg, t["w1"], out=self.h), False)
        self.timed(self._gelu, True)
        self.timed(lambda: torch.matmul(self.a, t["w2"], out=self.y), False)
        self.comm.reduce_scatter(self.y.view(-1), self.z.view(-1), "sum")

    def outputs(self) -> dict[str, np.ndarray]:
        return {"z": self.z.float().cpu().numpy().copy()}


def pairs(points=None, topologies=("dgx_h100", "dgx_b200"), world: int = 8) -> list[dict]:
    """The block's two matmul + collective pairs at each published size, on each topology, as
    `cost_model.contention` times them: one after the other, at once with NCCL's kernel taking
    SMs, and at once on the copy engines (the all-gather only: a reduce-scatter reduces on SMs).
    One dict a pair and mode: its matmul, its collective, what each cost alone, the SMs taken,
    the total and the speedup over one after the other."""
    rows = []
    for name in topologies:
        topo = load_topology(name)
        for pt in points or _POINTS:
            m, h, f = pt["S"] * pt["B"], pt["H"], pt["F"] // world
            nbytes = m * h * 2  # bf16: the gathered input, the reduce-scattered output
            for pattern, mnk, kind in (
                ("AG-MM", (m, f, h), "all_gather"),
                ("MM-RS", (m, h, f), "reduce_scatter"),
            ):
                seq = overlap_pair(topo, mnk, "bf16", kind, nbytes, world, "sequential")
                for mode in ("sequential", "sm", "copy_engine"):
                    if mode == "copy_engine" and kind not in CE_KINDS:
                        continue
                    o = overlap_pair(topo, mnk, "bf16", kind, nbytes, world, mode)
                    rows.append(
                        {
                            "topology": name,
                            "point": _NAMES[_POINTS.index(pt)],
                            "pattern": pattern,
                            "mode": mode,
                            "matmul_us": o.matmul_us,
                            "collective_us": o.collective_us,
                            "collective": o.collective,
                            "sms_taken": o.sms_taken,
                            "total_us": o.total_us,
                            "speedup": seq.total_us / o.total_us,
                        }
                    )
    return rows


def section(df, out_dir) -> str:
    """The report's section: the pairs (`pairs`) and the published case they are checked on."""
    lines = [
        "### Matmul and collective at once: SMs taken, or copy engines",
        "",
        "Each pair of the block at the published sizes (bf16, TP 8, one node), as "
        "`cost_model.contention` times it: NCCL's kernel holds one SM a channel while it runs; "
        "copy-engine collectives hold none but move at the copy engines' bandwidth. Validated on "
        "PyTorch's 8 x H100 case (pytorch/pytorch PR 172714: 2.96 / 2.02 / 1.77 ms measured; "
        "2.95 / 1.84 / 1.59 ms predicted). Not modelled: L2 and power interference (see the "
        "cost model page), so these are the most overlap can give.",
        "",
        "| topology | layer | pair | mode | matmul us | collective us (how) | SMs taken "
        "| total us | speedup |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in pairs():
        lines.append(
            f"| {r['topology']} | {r['point']} | {r['pattern']} | {r['mode']} "
            f"| {r['matmul_us']:.0f} | {r['collective_us']:.0f} ({r['collective']}) "
            f"| {r['sms_taken']} | {r['total_us']:.0f} | x{r['speedup']:.2f} |"
        )
    return "\n".join(lines) + "\n\n" + tp_published.section()


_NAMES = ["GPT-3 175B", "Llama 3 70B"]
_POINTS = [
    {"S": 2048, "B": 1, "H": 12288, "F": 49152},  # GPT-3 175B
    {"S": 8192, "B": 1, "H": 8192, "F": 28672},  # Llama 3 70B
]


def one_node(points: list, smoke: int = 1) -> PaperSetting:
    """The published setting of the beyond-the-paper experiments: one node of dgx_h100 and of
    dgx_b200 (TP or FSDP over its 8 GPUs), bf16, at `points` (the first `smoke` at smoke scale)."""
    return PaperSetting(
        topologies=(("dgx_h100", 1), ("dgx_b200", 1)),
        world_size=8,
        dtype=bf16,
        points={"smoke": points[:smoke], "default": points, "paper": points},
        world_on=lambda topo: topo.devices_per_node,
    )


PAPER = one_node(_POINTS)

EXPERIMENT = register(
    Experiment(
        name="tensor_parallel",
        figure="beyond the paper",
        program=program,
        schedules=schedules,
        verify_bindings=verify_bindings,
        points=points,
        baseline=LibraryMLP,
        principal=("S", "B", "H"),
        paper=PAPER,
        check_bindings=verify_bindings("smoke")[0],
        report_section=section,
    )
)
