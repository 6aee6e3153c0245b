"""Training: a small BERT-style encoder trained data-parallel on local ranks with three optimizer
set-ups, and the paper's Table 1 predicted at BERT's sizes (paper section 6.1, Table 1).

    python -m suite experiment=training [scale=smoke|default|paper] [experiment.model=bert_base]

The model: the scale's small encoder (`bert.Encoder`, SETTINGS), or with `experiment.model`
BERT itself (`bert_hf`: `transformers.BertForMaskedLM` from BERT-base's published configuration,
randomly initialised, synthetic masked-token data; MODELS), trained with AdamW as BERT's recipe
for the loss curves of the three set-ups and their step time at the common micro-batch.

Measured (backend=cpu, `world_size` gloo ranks; `experiments.training_rank`), for Adam, AdamW
(weight decay 0.01 but on biases and norms, as BERT recipes) and LAMB: `baseline` = torch DDP +
`torch.optim.Adam(fused=True)` (AdamW: `torch.optim.AdamW(fused=True)`; LAMB: a torch LAMB,
`bert.LAMB`), `zero_redundancy` = torch's ZeroRedundancyOptimizer under DDP,
`fuse(RS-C-AG)+as_slice` = the model without DDP and `coconet.FusedAdam` / `FusedAdamW` /
`FusedLAMB` (the generated step) over gloo; with `backend.comm=shm`, also
`fuse(RS-C-AG)+as_slice(shm)`, the same over shared memory, timed in the same interleaved rounds
(its rows' `comm` is shm). Rows (`row_kind`):
- `loss`: the loss of every step (`step`, `loss`; rank 0's micro-batch), `SETTING.steps` steps
  from the same initialisation and data for all three; a config's step rows say `verified` when
  its losses agree with the baseline's within 1e-5 relative on every rank at every step;
- `step`: time per training step at the common micro-batch, median over interleaved rounds with
  a bootstrap 95% interval of the median (`time_ms_lo`, `time_ms_hi`), the spread over rounds
  (`time_ms_min`, `time_ms_max`), throughput (`samples_per_s` = micro-batch x ranks / step time,
  with its interval) and `speedup` = throughput over the baseline's, paired per round, median
  and bootstrap interval (`speedup_lo`, `speedup_hi`);
- `table1`: the same at each set-up's own largest micro-batch under the memory cap;
- `memory`: bytes per rank (`memory_bytes`: parameters, gradients, communication buffers and
  optimizer state, from tensor sizes; `state_bytes`: the optimizer state alone), the cap
  (`memory_cap_bytes`), and the largest micro-batch whose total with the activations (the bytes
  autograd saves for backward, measured at that micro-batch) fits (`micro_batch`).
`size` is the model's parameter count. Predicted (every backend): the paper's Table 1 at BERT
334M, 1.2B, 3.9B on 16 DGX-2 (`experiments.table1`), and the paper's reported range beside it
(source `paper`, cost_model/data/paper_results.csv).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from coconet.programs import SLICED
from codegen.runtime.launch import run_ranks
from cost_model.topology import load_topology
from reports.results import append_row

from . import bert as B
from . import bert_hf as H
from .kinds import MeasurementExperiment
from .predict import paper_result_rows
from .registry import register
from .table1 import predict_table1
from .training_rank import Spec, rank_main

log = logging.getLogger(__name__)

NAME = "training"
LABEL = {
    "ddp": "baseline",
    "zero": "zero_redundancy",
    "fused": SLICED,
    "fused_shm": f"{SLICED}(shm)",
}
COMM = {"fused_shm": "shm"}  # a set-up's transport where not the run's (its rows' `comm`)
AGREE_RTOL = 1e-5
HP = {
    "adam": {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "embedding_lr_scale": 2.0,
    },
    "adamw": {  # as BERT recipes run it: no decay on biases and norms
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.01,
        "embedding_lr_scale": 2.0,
        "no_decay": True,
    },
    "lamb": {
        "lr": 2e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-6,
        "weight_decay": 0.01,
        "embedding_lr_scale": 2.0,
    },
}


HP_BERT = {  # BERT's pre-training recipe (google-research/bert, optimization.py): AdamW
    "adamw": {
        "lr": 1e-4,
        "betas": (0.9, 0.999),
        "eps": 1e-6,
        "weight_decay": 0.01,
        "embedding_lr_scale": 1.0,
        "no_decay": True,
    }
}


@dataclass(frozen=True)
class Setting:
    size: B.ModelSize | H.BertSize
    micro_batch: int
    cap_mb: int  # the memory cap per rank, MiB
    rounds: int
    steps_per_round: int
    steps: int = 50
    optimizers: tuple[str, ...] = ("adam", "adamw", "lamb")
    hp: dict = field(default_factory=lambda: HP)
    agree_rtol: float = AGREE_RTOL  # the loss agreement that makes a set-up's rows `verified`
    time_largest: bool = True  # time each set-up at its largest micro-batch too (Table 1)


SETTINGS = {
    "smoke": Setting(
        B.ModelSize(2, 64, 2, 256, 32), micro_batch=8, cap_mb=6, rounds=5, steps_per_round=2
    ),
    "default": Setting(
        B.ModelSize(2, 128, 4, 1024, 64), micro_batch=8, cap_mb=40, rounds=6, steps_per_round=2
    ),
    "paper": Setting(
        B.ModelSize(4, 128, 4, 1024, 64), micro_batch=8, cap_mb=64, rounds=15, steps_per_round=3
    ),
}


# experiment.model: BERT itself (experiments.bert_hf), AdamW as BERT's recipe, the loss curves and
# the step time at the common micro-batch (seq 128, BERT's phase 1); bert_large is configured but
# too large for a 2-core machine (run it where there are cores and memory for it).
_BERT = Setting(
    H.BERT_BASE,
    micro_batch=2,
    cap_mb=3072,
    rounds=3,
    steps_per_round=1,
    steps=20,
    optimizers=("adamw",),
    hp=HP_BERT,
    agree_rtol=1e-3,
    time_largest=False,
)
MODELS = {
    "bert_base": _BERT,
    "bert_large": replace(_BERT, size=H.BERT_LARGE, cap_mb=16384),
    # the optimizer-bound configuration: a wide encoder (10.5M parameters, hidden 512, vocab
    # 4096) and one sequence of 16 tokens a rank, so the step is mostly the gradient's
    # communication and the optimizer's update, where fusing them can pay
    "wide": Setting(
        B.ModelSize(2, 512, 8, 4096, 16),
        micro_batch=1,
        cap_mb=512,
        rounds=8,
        steps_per_round=2,
        steps=30,
        time_largest=False,
    ),
}


def check_model(model) -> None:
    """ValueError (one line) unless `model` is null or a name in MODELS."""
    if model is not None and model not in MODELS:
        raise ValueError(
            f"experiment.model={model} is not a model of experiment=training; "
            f"one of {sorted(MODELS)}, or null for the scale's encoder"
        )


def setting_of(settings) -> Setting:
    """experiment.model's setting where one is named, else the scale's."""
    check_model(settings.model)
    return SETTINGS[settings.scale] if settings.model is None else MODELS[settings.model]


def median_ci(xs, seed: int = 0, n: int = 2000) -> tuple[float, float, float]:
    """Median of xs and a bootstrap 95% interval of it (percentiles of n resampled medians)."""
    xs = np.asarray(xs, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(xs), (n, len(xs)))
    meds = np.median(xs[idx], axis=1)
    return float(np.median(xs)), float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def _base(setting: Setting, world: int, optimizer: str, comm: str) -> dict:
    s = setting.size
    return {
        "experiment": NAME,
        "source": "measured",
        "backend": "cpu",
        "topology": "local",
        "world_size": world,
        "size": s.parameters(),
        "dtype": "f32",
        "optimizer": optimizer,
        "comm": comm,
        "shape": f"L={s.layers},H={s.hidden},heads={s.heads},V={s.vocab},S={s.seq}",
    }


def loss_rows(base: dict, curves) -> list[dict]:
    return [
        {
            **base,
            "comm": COMM.get(c, base["comm"]),
            "schedule": LABEL[c],
            "row_kind": "loss",
            "step": i + 1,
            "loss": round(v, 7),
        }
        for c, losses in curves.items()
        for i, v in enumerate(losses)
    ]


def agreement(per_rank: list[dict], optimizer: str) -> dict[str, float]:
    """config -> the largest relative loss difference from the baseline, over ranks and steps."""
    out = {}
    for c in per_rank[0][optimizer]["curves"]:
        out[c] = max(
            float(
                np.max(
                    np.abs(np.subtract(r[optimizer]["curves"][c], r[optimizer]["curves"]["ddp"]))
                    / np.abs(r[optimizer]["curves"]["ddp"])
                )
            )
            for r in per_rank
        )
    return out


def timing_rows(setting: Setting, base: dict, result, worst) -> list[dict]:
    timing, memory = result["timing"], result["memory"]
    rows = []
    for kind, mb_of in (
        ("step", lambda c: setting.micro_batch),
        ("table1", lambda c: memory[c]["max_micro_batch"]),
    ):
        base_key = ("ddp", mb_of("ddp"))
        for c in memory:
            key = (c, mb_of(c))
            if key not in timing or base_key not in timing:
                continue
            ms = np.array(timing[key])
            world = base["world_size"]
            thr = key[1] * world / (ms / 1e3)
            ratio = thr / (base_key[1] * world / (np.array(timing[base_key]) / 1e3))
            t, t_lo, t_hi = median_ci(ms)
            s, s_lo, s_hi = median_ci(thr)
            r, r_lo, r_hi = median_ci(ratio)
            rows.append(
                {
                    **base,
                    "comm": COMM.get(c, base["comm"]),
                    "schedule": LABEL[c],
                    "row_kind": kind,
                    "micro_batch": key[1],
                    "time_ms": round(t, 3),
                    "time_ms_lo": round(t_lo, 3),
                    "time_ms_hi": round(t_hi, 3),
                    "time_ms_min": round(float(ms.min()), 3),
                    "time_ms_max": round(float(ms.max()), 3),
                    "samples_per_s": round(s, 2),
                    "samples_per_s_lo": round(s_lo, 2),
                    "samples_per_s_hi": round(s_hi, 2),
                    "speedup": round(r, 4),
                    "speedup_lo": round(r_lo, 4),
                    "speedup_hi": round(r_hi, 4),
                    "verified": worst[c] <= setting.agree_rtol,
                    "note": f"{len(ms)} interleaved rounds of {setting.steps_per_round} "
                    f"steps; loss agreement {worst[c]:.1e}",
                }
            )
    return rows


def memory_rows(setting: Setting, base: dict, memory) -> list[dict]:
    cap = setting.cap_mb << 20
    return [
        {
            **base,
            "comm": COMM.get(c, base["comm"]),
            "schedule": LABEL[c],
            "row_kind": "memory",
            "micro_batch": m["max_micro_batch"],
            "state_bytes": m["state"],
            "memory_bytes": m["params"] + m["grads"] + m["comm"] + m["state"],
            "memory_cap_bytes": cap,
            "note": f"params {m['params']}, grads {m['grads']}, communication buffers "
            f"{m['comm']}, state {m['state']}, activations per sample "
            f"{m['activations_per_sample']} (bytes)",
        }
        for c, m in memory.items()
    ]


def measure(settings) -> list[dict]:
    if settings.backend != "cpu":
        log.info(
            f"measure: skipped: training measures torch DDP and the fused optimizers on cpu "
            f"gloo ranks only (backend={settings.backend})"
        )
        return []
    setting = setting_of(settings)
    spec = Spec(
        size=setting.size,
        hp=setting.hp,
        steps=setting.steps,
        micro_batch=setting.micro_batch,
        cap_bytes=setting.cap_mb << 20,
        rounds=setting.rounds,
        warmup_rounds=1,
        steps_per_round=setting.steps_per_round,
        seed=settings.seed,
        optimizers=setting.optimizers,
        # comm=shm: the fused step over shm beside the same over gloo, in the same rounds
        configs=("ddp", "zero", "fused") + (("fused_shm",) if settings.comm == "shm" else ()),
        comm="ring" if settings.comm == "shm" else settings.comm or "ring",
        time_largest=setting.time_largest,
    )
    log.info(
        f"training: {setting.size} ({setting.size.parameters()} parameters), "
        f"{setting.steps} steps per set-up, micro-batch {setting.micro_batch}"
    )
    per_rank = run_ranks(
        rank_main,
        settings.world_size,
        args=(spec,),
        timeout_s=settings.timeout_s,
        collective_timeout_s=settings.collective_timeout_s,
    )
    rows = []
    for optimizer, result in per_rank[0].items():
        worst = agreement(per_rank, optimizer)
        base = _base(setting, settings.world_size, optimizer, spec.comm)
        rows += loss_rows(base, result["curves"])
        rows += timing_rows(setting, base, result, worst)
        rows += memory_rows(setting, base, result["memory"])
    for r in rows:
        append_row(settings.csv_path, r)
    return rows


def predict(settings) -> list[dict]:
    """The paper's Table 1 predicted on 16 DGX-2 (dgx2's files at 16 nodes: 256 GPUs)."""
    topo = load_topology("dgx2", nodes=16)
    return predict_table1(topo, topo.devices) + paper_result_rows(NAME)


def summary(measured: list, predicted: list) -> str:
    lines = ["training: throughput over the baseline (median [95% CI]); Table 1 predicted"]
    for r in measured:
        if r.get("row_kind") in ("step", "table1"):
            lines.append(
                f"  measured {r['optimizer']} {r['row_kind']:6s} {r['schedule']:24s} "
                f"mb {r['micro_batch']:3d} {r['samples_per_s']:9.1f} samples/s "
                f"x{r['speedup']:.2f} [{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]"
            )
    for r in predicted:
        if r.get("row_kind") == "table1":
            fits = "does not fit" if not r["micro_batch"] else "the baseline does not fit"
            lines.append(
                f"  predicted {r['optimizer']} {r['shape'][:10]} {r['schedule']:24s} "
                f"mb {r['micro_batch']:3d} "
                + (f"x{r['speedup']:.2f}" if r["speedup"] != "" else fits)
            )
    return "\n".join(lines)


EXPERIMENT = register(
    MeasurementExperiment(
        name=NAME,
        figure="Table 1 (section 6.1)",
        measure=measure,
        predict=predict,
        summary=summary,
        doc=__doc__,
    )
)
