"""Where a step's time goes beyond its parts: a schedule's Plan timed step by step on local ranks.

    python -m benchmarks.steps [--experiment adam_fusion] [--schedules RS-C-AG,RS-C-AG+as_slice]
        [--size N=1M] [--world 2] [--rounds 40]

The cost model adds up the medians of a step's parts (calibration fits each collective to the
median of its calls), while a run reports the median of whole steps. This benchmark shows how
far apart the two are on this machine, and why. The schedules' plans (the experiment's program
lowered at the size, inputs uniform in [0.1, 1)) run in rounds: each round every schedule takes
one sample of 3 calls, in a random order that is the same on every rank, each call after a
barrier, every Plan step timed on its own (ms, this rank's clock, rank 0's times shown). Per
schedule:
- `step`: the median whole call; `sum of parts`: the sum of each Plan step's median;
  `independent`: the median of sums of the parts drawn independently (what per-part medians and
  tails predict if they do not interact), from the same calls;
- `first` / `later`: the median of the first call of a sample (after another schedule ran) and of
  the calls after it (after itself);
- per collective step (a fused one included), `tail`: the share of its calls more than 1 ms above
  its median (on gloo, a transfer that waits a 4 ms scheduler tick).
Sizes: the program's size symbols, suffixes K = 2^10, M = 2^20. Nothing here is asserted: the
machine is shared and these are its measurements.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from codegen.lower import lower
from codegen.plan import Collective, FusedCollective
from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch
from experiments.harness import FUSED_CHUNKS

from .comm import parse_size

CALLS = 3  # calls per sample: the first after another schedule, the others after itself


def runner(program, bindings: dict, rank: int, world: int) -> PlanRunner:
    """The schedule's plan on this rank, lowered as the experiments lower it (`FUSED_CHUNKS`),
    its kernels built, its float inputs uniform in [0.1, 1)."""
    plan = lower(program, bindings, world, fused_chunks=FUSED_CHUNKS)
    backend = CpuBackend()
    r = PlanRunner(plan, rank, backend.build(plan.kernels()), backend.groups(plan.stages))
    gen = torch.Generator().manual_seed(rank)
    for _, bid in plan.inputs:
        buf = r.bufs.get(bid)
        if buf is not None and buf.dtype.is_floating_point and buf.numel() > 1:
            buf.copy_(torch.rand(buf.shape, generator=gen) * 0.9 + 0.1)
    return r


def rank_main(rank: int, world: int, experiment: str, names: list[str], bindings: dict,
              rounds: int) -> dict:
    import experiments
    exp = experiments.get(experiment)
    every = exp.schedules()
    runners = {n: runner(every[n], bindings, rank, world) for n in names}
    parts = {n: [[] for _ in r.plan.steps] for n, r in runners.items()}
    whole = {n: [] for n in names}
    first = {n: [] for n in names}
    later = {n: [] for n in names}
    for r in runners.values():  # warm-up
        r.run()
    for rnd in range(rounds):
        for i in np.random.default_rng([11, rnd]).permutation(len(names)):
            n, r = names[i], runners[names[i]]
            for call in range(CALLS):
                dist.barrier()
                times = []
                start = time.perf_counter()
                for s in r.plan.steps:
                    t = time.perf_counter()
                    r.step(s)
                    times.append((time.perf_counter() - t) * 1e3)
                total = (time.perf_counter() - start) * 1e3
                for k, t in enumerate(times):
                    parts[n][k].append(t)
                whole[n].append(total)
                (first if call == 0 else later)[n].append(total)
    kinds = {n: [_kind(s) for s in r.plan.steps] for n, r in runners.items()}
    return {"parts": parts, "whole": whole, "first": first, "later": later, "kinds": kinds}


def _kind(step) -> str:
    """A Plan step's label: "Collective <kind>", "FusedCollective fused", or its type."""
    if isinstance(step, Collective):
        return f"Collective {step.kind}"
    return "FusedCollective fused" if isinstance(step, FusedCollective) else type(step).__name__


def summary(res: dict, names: list[str], seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = [f"{'schedule':26} {'step':>7} {'sum of parts':>13} {'independent':>12} "
             f"{'first':>7} {'later':>7}   collectives' tail (share > median + 1 ms)"]
    for n in names:
        P = [np.array(p) for p in res["parts"][n]]
        med = [float(np.median(p)) for p in P]
        drawn = sum(rng.choice(p, 20000) for p in P)
        tails = [f"{k.split()[-1]} {np.mean(p > m + 1.0):.2f}"
                 for k, p, m in zip(res["kinds"][n], P, med)
                 if k.startswith(("Collective", "FusedCollective"))]
        lines.append(f"{n:26} {statistics.median(res['whole'][n]):7.2f} {sum(med):13.2f} "
                     f"{float(np.median(drawn)):12.2f} {statistics.median(res['first'][n]):7.2f} "
                     f"{statistics.median(res['later'][n]):7.2f}   " + ", ".join(tails))
    return "\n".join(lines) + "\n(ms; rank 0)"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="adam_fusion")
    ap.add_argument("--schedules", default="RS-C-AG,RS-C-AG+as_slice,AR-C")
    ap.add_argument("--size", default="N=1M", help="SYMBOL=SIZE[,SYMBOL=SIZE...]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args(argv)
    bindings = {k: parse_size(v) for k, v in (kv.split("=") for kv in a.size.split(","))}
    names = [n.strip() for n in a.schedules.split(",") if n.strip()]
    res = launch(rank_main, a.world, args=(a.experiment, names, bindings, a.rounds),
                 timeout_s=1800)[0]
    print(f"{a.experiment} at {a.size} on {a.world} ranks, {a.rounds} rounds of {CALLS} calls")
    print(summary(res, names))


if __name__ == "__main__":
    main()
