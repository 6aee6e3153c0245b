"""One rank of experiment=training: loss curves, memory, and interleaved timing of the three
data-parallel configurations (`experiments.bert.CONFIGS`: ddp, zero, fused) for each optimizer.

`rank_main(rank, world, spec) -> dict`, per optimizer:
- `curves[config]`: the loss of each of `spec.steps` steps (this rank's micro-batch), every
  config from the same initialisation (`size.model(seed)`: `bert.Encoder`, or BERT itself,
  `bert_hf.MaskedLM`) and data (`size.batch(seed, step, rank, ..)`),
  with the same param groups and a linear warm-up (LambdaLR over `warmup_steps`);
- `memory[config]`: this rank's bytes by kind (`bert.memory_bytes`), the activation bytes per
  sample, and `max_micro_batch`: the largest micro-batch whose total (those bytes plus the
  activations measured at that micro-batch, `bert.activation_bytes`) stays within
  `spec.cap_bytes` (0: none fits). Activations are linear in the micro-batch: the candidate comes
  from the bytes measured at 1 and 2, and is then confirmed by measuring at it (and lowered while
  it does not fit);
- `timing[(config, micro_batch)]`: ms per training step (forward, backward, optimizer step; the
  slowest rank's time over `steps_per_round` steps, after a barrier) in each of `spec.rounds`
  rounds, after `spec.warmup_rounds` untimed ones. In each round every (config, micro-batch) is
  timed once, in a fresh random order (the same on every rank), so that drifts of the machine hit
  all of them alike; points: every config at `spec.micro_batch` and (`spec.time_largest`) at its
  own largest micro-batch.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from codegen.runtime.backend import CpuBackend

from . import bert as B

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spec:
    size: B.ModelSize  # or bert_hf.BertSize: anything with parameters(), model(), batch()
    hp: dict  # optimizer -> {lr, betas, eps, weight_decay, embedding_lr_scale}
    steps: int  # loss-curve steps
    micro_batch: int  # of the loss curves and the common timing point
    cap_bytes: int  # the memory cap per rank
    rounds: int
    warmup_rounds: int
    steps_per_round: int
    seed: int
    optimizers: tuple[str, ...] = ("adam", "lamb")
    configs: tuple[str, ...] = ("ddp", "zero", "fused")
    warmup_steps: int = 10
    comm: str = "ring"  # the fused optimizers' transport (codegen.runtime.backend.CpuBackend)
    time_largest: bool = True  # also time each config at its largest micro-batch under the cap


def _memory(spec: Spec, setups: dict, rank: int) -> dict:
    plain = spec.size.model(spec.seed)  # activations do not depend on the config
    measured: dict[int, int] = {}

    def act(b: int) -> int:
        if b not in measured:
            measured[b] = B.activation_bytes(plain, *spec.size.batch(spec.seed, 0, rank, b))
        return measured[b]

    per_sample = act(2) - act(1)
    out = {}
    for config, (module, opt) in setups.items():
        static = B.memory_bytes(module, opt)
        free = spec.cap_bytes - sum(static.values()) - (act(1) - per_sample)
        b = max(0, free // per_sample)
        while b > 0 and sum(static.values()) + act(b) > spec.cap_bytes:
            b -= 1
        out[config] = {
            **static,
            "activations_per_sample": per_sample,
            "max_micro_batch": int(b),
            "activations": act(b) if b else 0,
        }
    return out


def _timed(spec: Spec, module, opt, rank: int, start: int, micro_batch: int) -> float:
    """ms per step over steps_per_round steps, the slowest rank's."""
    dist.barrier()
    t0 = time.perf_counter()
    B.train_steps(module, opt, spec.size, spec.seed, rank, start, spec.steps_per_round, micro_batch)
    ms = torch.tensor([(time.perf_counter() - t0) * 1e3 / spec.steps_per_round])
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return float(ms)


def _timing(spec: Spec, setups: dict, memory: dict, rank: int) -> dict:
    points = [(c, spec.micro_batch) for c in setups]
    points += [
        (c, m["max_micro_batch"])
        for c, m in memory.items()
        if spec.time_largest and m["max_micro_batch"] and (c, m["max_micro_batch"]) not in points
    ]
    times: dict = {p: [] for p in points}
    start = spec.steps
    for r in range(spec.warmup_rounds + spec.rounds):
        order = list(points)
        random.Random(spec.seed * 1000 + r).shuffle(order)
        for config, mb in order:
            module, opt = setups[config]
            ms = _timed(spec, module, opt, rank, start, mb)
            start += spec.steps_per_round
            if r >= spec.warmup_rounds:
                times[(config, mb)].append(ms)
    return times


def rank_main(rank: int, world: int, spec: Spec) -> dict:
    torch.manual_seed(spec.seed)
    out = {}
    for optimizer in spec.optimizers:
        hp = spec.hp[optimizer]
        setups = {
            c: B.CONFIGS[c](
                spec.size.model(spec.seed), optimizer, hp, backend=CpuBackend(comm=spec.comm)
            )
            for c in spec.configs
        }
        curves = {}
        for config, (module, opt) in setups.items():
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: min(1.0, (s + 1) / spec.warmup_steps)
            )
            curves[config] = B.train_steps(
                module, opt, spec.size, spec.seed, rank, 0, spec.steps, spec.micro_batch, sched
            )
        memory = _memory(spec, setups, rank)
        out[optimizer] = {
            "curves": curves,
            "memory": memory,
            "timing": _timing(spec, setups, memory, rank),
        }
        if rank == 0:
            log.info(f"training: {optimizer} measured")
    return out
