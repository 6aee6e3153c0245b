"""Tensor-parallel overlap, predicted beside published measurements (FIELD_NOTES), gaps explained.

`cases()` predicts each published case with the suite's own model of the pair it measured:
the DES of the pair as a DSL program (`pair_program`: all-gather + matmul, or matmul +
reduce-scatter, as in `experiments.tensor_parallel`), one after the other and decomposed
(`ol(AG,MM)`, `ol(MM,RS)`, `CHUNKS` chunks), and `cost_model.contention`'s bound for the two run at
once (NCCL's kernel holding SMs; copy engines for an all-gather). Units: microseconds.

The cases (bf16 assumed where the source states no dtype):
- PyTorch's `fused_all_gather_matmul` (pytorch/pytorch PR 143160), M=2048 N=3584 K=8192, taken as
  8 x H100 (dgx_h100) and the gathered A of [M, K] bf16 times a local B of [K, N] (Llama 3 70B's MLP
  at TP 8): NCCL + cuBLAS 301 us, decomposed async TP 354 us, communication-aware 295 us,
  multimem 277 us.
- Flux (bytedance/flux docs/performance_report.md), TP 8 on A800, M=4096 K=12288 N=49152: AG+GEMM
  3.099 -> 2.469 ms, GEMM+RS 3.100 -> 2.508 ms. `a800()`: dgx_a100 with the A800's 8 NVLink3
  links (400 GB/s a GPU both ways, where the A100 has 12: NVIDIA's A800 datasheet) and NCCL's
  rings over them (8 channels of one link each, where dgx_a100 has 12; assumed by analogy with
  the A100's search); every other figure, fitted constants included, the A100's.
- Domino (arXiv 2409.15241): up to 1.3x over Megatron-LM on DGX H100, for whole training steps:
  no single pair to predict; the report compares it with the block's predicted speedup.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from codegen.lower import lower
from cost_model.contention import CE_KINDS, overlap_pair
from cost_model.topology import Topology, load_topology
from cost_model.workload import simulate
from dsl import Builder, P, Program, Sliced, bf16, sym
from dsl.transforms import overlap

S, B, H, F = sym("S"), sym("B"), sym("H"), sym("F")
CHUNKS = 4


def pair_program(pattern: str, dtype=bf16) -> Program:
    """`AG-MM`: all_gather(x [S/P, B, H]) @ w1 [H, F/P]; `MM-RS`: reduce_scatter(h [S, B, F/P] @
    w2 [F/P, H]) along S: the two halves of the block in `experiments.tensor_parallel`."""
    b = Builder(pattern.lower().replace("-", "_"))
    if pattern == "AG-MM":
        x = b.input("x", dtype, [S / P, B, H], Sliced(0))
        w = b.input("w1", dtype, [H, F / P], Sliced(1))
        b.output("h", b.matmul(b.all_gather(x, name="xg"), w, name="h"))
    else:
        h = b.input("h", dtype, [S, B, F / P], Sliced(2))
        w = b.input("w2", dtype, [F / P, H], Sliced(0))
        b.output("z", b.reduce_scatter(b.matmul(h, w, name="y"), dim=0, name="z"))
    return b.build()


def a800() -> Topology:
    """dgx_a100 with the A800's NVLink (see the module doc)."""
    t = load_topology("dgx_a100")
    link = dataclasses.replace(t.intra.link, bandwidth_gbps=200.0)  # 8 x 25 GB/s a direction
    return dataclasses.replace(
        t,
        name="a800",
        intra=dataclasses.replace(t.intra, link=link),
        nccl=dataclasses.replace(t.nccl, channels=8),
    )


@dataclass(frozen=True)
class Case:
    name: str
    topology: str
    pattern: str  # AG-MM | MM-RS
    sizes: dict  # S, B, H, F of `pair_program`
    measured: dict  # what the source measured: label -> us
    source: str


FLUX = {"S": 4096, "B": 1, "H": 12288, "F": 49152}  # Flux's TP 8 M=4096 K=12288 N=49152
CASES = (
    Case(
        "PyTorch fused_all_gather_matmul",
        "dgx_h100",
        "AG-MM",
        {"S": 2048, "B": 1, "H": 8192, "F": 8 * 3584},
        {"NCCL + cuBLAS": 301.0, "decomposed": 354.0, "comm-aware": 295.0, "multimem": 277.0},
        "pytorch/pytorch PR 143160",
    ),
    Case(
        "Flux AG+GEMM",
        "a800",
        "AG-MM",
        FLUX,
        {"NCCL + cuBLAS": 3099.0, "Flux": 2469.0},
        "bytedance/flux docs/performance_report.md",
    ),
    Case(
        "Flux GEMM+RS",
        "a800",
        "MM-RS",
        FLUX,
        {"NCCL + cuBLAS": 3100.0, "Flux": 2508.0},
        "bytedance/flux docs/performance_report.md",
    ),
)


def _topology(name: str) -> Topology:
    return a800() if name == "a800" else load_topology(name)


def predict_case(case: Case, world: int = 8) -> dict:
    """{label: us}: the pair one after the other and decomposed (the DES), and at once with SMs
    taken or on the copy engines (`cost_model.contention`, independent tasks: a bound)."""
    topo = _topology(case.topology)
    p = pair_program(case.pattern)
    ref = "xg" if case.pattern == "AG-MM" else "y"
    seq = simulate(lower(p, case.sizes, world), topo).time_us
    ol = simulate(lower(overlap(p, ref, chunks=CHUNKS), case.sizes, world), topo).time_us
    s = case.sizes
    m, h, f = s["S"] * s["B"], s["H"], s["F"] // world
    kind, mnk = (
        ("all_gather", (m, f, h)) if case.pattern == "AG-MM" else ("reduce_scatter", (m, h, f))
    )
    out = {"one after the other": seq, f"ol({case.pattern.replace('-', ',')}), c={CHUNKS}": ol}
    for mode, label in (("sm", "at once, SMs taken"), ("copy_engine", "at once, copy engines")):
        if mode == "copy_engine" and (kind not in CE_KINDS or topo.intra.copy_engine_gbps is None):
            continue
        out[label] = overlap_pair(topo, mnk, "bf16", kind, m * h * 2, world, mode).total_us
    return out


# measured label -> the predicted label it is read against
AGAINST = {
    "NCCL + cuBLAS": "one after the other",
    "decomposed": "ol(AG,MM)",
    "comm-aware": "ol(AG,MM)",
    "multimem": "at once, SMs taken",
    "Flux": "ol(",
}
GAPS = {
    "PyTorch fused_all_gather_matmul": (
        "one after the other, the pair is predicted as measured. Decomposed, the model is "
        "optimistic: each shard's matmul is 1/8 of the rows (256 x 3584 x 8192), where cuBLAS "
        "runs below the efficiency the model's curve gives it, and PyTorch issues a copy and a "
        "matmul a shard from the host; the model charges the launches only. Multimem (NVLink "
        "SHARP loads and stores inside the kernel) is read against the bound for the two at "
        "once, which is below it for the reason the independent case is optimistic: L2 and "
        "power interference are not modelled (cost_model.contention)."
    ),
    "Flux AG+GEMM": (
        "one after the other is above Flux's NCCL + cuBLAS by the matmul: A800 is predicted at "
        "the A100's assumed 0.7 matmul efficiency. Flux's kernel beats both the chunked "
        "decomposition and the SM bound: it gathers inside the GEMM's tiles, so no NCCL kernel "
        "holds SMs and no chunk boundary waits."
    ),
    "Flux GEMM+RS": (
        "as for AG+GEMM; the decomposition gains less, since each chunk's rows are P matmuls "
        "(one a rank's block: the sums stay bit for bit those of the whole matmul), and the "
        "reduction runs on SMs in every variant, so no copy-engine bound applies."
    ),
}


def section() -> str:
    """The report's comparison: each case's measured figures beside the predictions."""
    lines = [
        "### Beside published measurements",
        "",
        "Each published pair predicted with the suite's model of it (bf16, TP 8): the DES of the "
        "pair one after the other and decomposed into chunks, and `cost_model.contention`'s bound "
        "for the two run at once. A800 is dgx_a100 with 8 NVLinks (see `experiments.tp_published`).",
        "",
        "| case | topology | measured | us | predicted as | us | error |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for case in CASES:
        pred = predict_case(case)
        for k, v in case.measured.items():
            key = AGAINST[k]
            label, us = next(((lb, u) for lb, u in pred.items() if lb.startswith(key)), ("", 0.0))
            err = "-" if not us else f"{us / v - 1:+.0%}" if abs(us / v - 1) >= 0.005 else "0%"
            lines.append(
                f"| {case.name} ({case.source}) | {case.topology} | {k} | {v:.0f} "
                f"| {label or '-'} | {us:.0f} | {err} |"
            )
    lines += ["", "Gaps:", ""]
    lines += [f"- {name}: {why}" for name, why in GAPS.items()]
    lines += [
        "- Every case: the rest of each pair's predictions ("
        + "; ".join(
            f"{c.name}: " + ", ".join(f"{k} {v:.0f} us" for k, v in predict_case(c).items())
            for c in CASES
        )
        + ")."
    ]
    lines += [
        "- Domino (arXiv 2409.15241), up to 1.3x over Megatron-LM on DGX H100 for whole training "
        "steps: it splits the batch and the weights so one half's tensor-parallel all-reduce hides "
        "behind the other half's compute in forward and backward; the block here is one forward "
        "MLP, whose predicted gain on dgx_h100 (above) is the part of that a single layer shows.",
    ]
    return "\n".join(lines) + "\n"
