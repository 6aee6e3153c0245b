"""The paper's Table 1 predicted: BERT data-parallel training at 334M, 1.2B and 3.9B parameters
on 16 DGX-2 (256 V100 32 GB), PyTorch DDP + Adam/LAMB against the fused optimizer, each at the
largest micro-batch that fits in a GPU's memory.

`predict_table1(topo, world_size, optimizers) -> rows` (the results table's; `row_kind=table1`,
source `predicted`). Per model and optimizer:
- optimizer step: the suite's own Plans simulated by the cost model (`cost_model.workload.simulate`,
  NCCL's tuner for every collective): the baseline as `AR-C` (the library all-reduce, then the
  update), the fused one as `fuse(RS-C-AG)+as_slice`, at N = the model's parameters, f32;
- forward + backward of a micro-batch b: 6 N b s flops for the weights plus 12 L s^2 H b for
  attention (s = 128), as a library matmul on the topology's device at f16 (tensor cores, as BERT
  trains): `Device.matmul_us` (peak x matmul_efficiency, or weight traffic where that is larger);
- DDP all-reduces gradient buckets during the backward pass (2/3 of forward + backward): only the
  all-reduce's communication beyond the backward is exposed; the fused step runs after backward;
- memory per GPU (`MEMORY_BYTES`, V100 32 GB): per parameter, as these Plans hold it (f32):
  baseline w, g, DDP's bucket, m, v = 20 bytes; fused w, g (the bucket itself) = 8 bytes plus the
  Plan's slices (m, v and its scratch, as lowered: `Plan.buffers` of size N/P). Activations per
  sample: s H L (34 + 5 a s / H) bytes (Korthikanti et al. 2022, f16, no recomputation), a =
  H / 64 heads. The largest micro-batch is what fits after that (0: the model does not fit);
- throughput b P / step time, speedup = fused throughput / baseline throughput.
These are the cost model's predictions from hardware figures, not fitted to the paper.
"""

from __future__ import annotations

from coconet.programs import SLICED, adam_program, lamb_program, sliced_schedule
from codegen.lower import lower
from codegen.plan import ITEMSIZE
from cost_model.workload import simulate

from .predict import _split as time_split

BERT = (
    ("BERT-334M", 24, 1024, 334_000_000),
    ("BERT-1.2B", 24, 2048, 1_200_000_000),
    ("BERT-3.9B", 48, 2560, 3_900_000_000),
)
SEQ = 128
MEMORY_BYTES = 32 * 1024**3  # V100 SXM3 32 GB (FIELD_NOTES: DGX-2)
BASELINE_BYTES_PER_PARAM = 20  # f32 w, g, DDP's gradient bucket, m, v
PROGRAMS = {"adam": adam_program, "lamb": lamb_program}


def activation_bytes(layers: int, hidden: int, seq: int = SEQ) -> float:
    """Bytes per sample kept for backward (Korthikanti et al. 2022, f16, no recomputation)."""
    heads = hidden // 64
    return seq * hidden * layers * (34 + 5 * heads * seq / hidden)


def fwd_bwd_ms(topo, params: int, layers: int, hidden: int, micro_batch: int) -> float:
    flops = 6 * params * micro_batch * SEQ + 12 * layers * SEQ**2 * hidden * micro_batch
    return topo.device.matmul_us(3 * 2 * params, flops, "f16") / 1e3


def _plan_state_bytes(plan) -> int:
    """Bytes of the fused Plan's buffers that are not the full w or g (m, v, scratch)."""
    ids = dict(plan.inputs)
    full = {ids["w"], ids["g"]}
    return sum(
        b.numel * ITEMSIZE[b.dtype] for b in plan.buffers if b.id not in full and b.shape != ()
    )


def _largest(free_bytes: float, per_sample: float) -> int:
    return max(0, int(free_bytes // per_sample))


def predict_table1(topo, world_size: int, optimizers=("adam", "lamb")) -> list[dict]:
    rows = []
    for name, layers, hidden, params in BERT:
        act = activation_bytes(layers, hidden)
        for opt in optimizers:
            program = PROGRAMS[opt]()
            n = -(-params // (world_size * 64)) * world_size * 64  # padded as a bucket is
            base_plan = lower(program, {"N": n}, world_size)
            fused_plan = lower(sliced_schedule(program), {"N": n}, world_size)
            base_sim, fused_sim = simulate(base_plan, topo), simulate(fused_plan, topo)
            fused_bytes = 8 * params + _plan_state_bytes(fused_plan)
            sides = {
                "baseline": (BASELINE_BYTES_PER_PARAM * params, base_sim),
                SLICED: (fused_bytes, fused_sim),
            }
            out = {}
            for schedule, (static, sim) in sides.items():
                b = _largest(MEMORY_BYTES - static, act)
                if b == 0:
                    out[schedule] = (b, None, static, sim)
                    continue
                compute = fwd_bwd_ms(topo, params, layers, hidden, b)
                if schedule == "baseline":  # the all-reduce hides behind the backward pass
                    update, comm, _ = time_split(sim)
                    step = compute + update + max(0.0, comm - compute * 2 / 3)
                else:
                    step = compute + sim.time_ms
                out[schedule] = (b, step, static, sim)
            base_thr = _throughput(out["baseline"], world_size)
            for schedule, (b, step, static, sim) in out.items():
                thr = _throughput(out[schedule], world_size)
                rows.append(
                    {
                        "experiment": "training",
                        "schedule": schedule,
                        "source": "predicted",
                        "backend": "sim",
                        "topology": topo.name,
                        "world_size": world_size,
                        "size": params,
                        "shape": f"{name} (L={layers},H={hidden},S={SEQ})",
                        "dtype": "f32",
                        "row_kind": "table1",
                        "optimizer": opt,
                        "micro_batch": b,
                        "time_ms": round(step, 3) if step else "",
                        "samples_per_s": round(thr, 1) if thr else "",
                        "speedup": round(thr / base_thr, 3) if thr and base_thr else "",
                        "memory_bytes": int(static),
                        "memory_cap_bytes": MEMORY_BYTES,
                        "note": "does not fit"
                        if b == 0
                        else f"optimizer step {sim.time_ms:.1f} ms",
                    }
                )
    return rows


def _throughput(entry, world_size: int):
    b, step, _, _ = entry
    return b * world_size / (step / 1e3) if step else None
