"""Where a step's time goes beyond its parts: a schedule's Plan timed piece by piece on local ranks.

    python -m benchmarks.steps [--experiment adam_fusion] [--schedules RS-C-AG,RS-C-AG+as_slice]
        [--size N=1M] [--world 2] [--rounds 40] [--segments] [--topology FILE]

The cost model adds up the medians of a step's parts (calibration fits each collective to the
median of its calls), while a run reports the median of whole steps. This benchmark shows how
far apart the two are on this machine, and why. The schedules' plans (the experiment's program
lowered at the size as the experiments lower it, `FUSED_CHUNKS`; inputs uniform in [0.1, 1)) run
in rounds: each round every schedule takes one sample of 3 calls, in a random order that is the
same on every rank, each call after a barrier, with the runner's timeline on
(`PlanRunner.marks`): every piece of work a segment of its own (a plain Plan step whole; inside a
fused step, the head's start, each chunk's wait, kernel and all-gather send, a barrier, the
final waits; ms, this rank's clock, rank 0's times shown). Per schedule:
- `step`: the median whole call; `sum of parts`: the sum of each Plan step's median (a step's
  time in a call: the sum of its segments); `independent`: the median of sums of the parts drawn
  independently (what per-part medians and tails predict if they do not interact), from the
  same calls; `pieces`: the sum of every segment's median (a fused step's pieces: below its
  step's median by the tails of its blocking pieces, each call stalling in another);
- `first` / `later`: the median of the first call of a sample (after another schedule ran) and of
  the calls after it (after itself);
- per collective step (a fused one included), `tail`: the share of its calls more than 1 ms above
  its median (on gloo, a transfer that waits a 4 ms scheduler tick).
`--segments`: each schedule's segments, their median, mean and 90th percentile. `--topology
FILE` (a calibrated topology.yaml: a run's `calibrate/topology.yaml`, or the cached one in
`.cache/calibration/<key>/`): the cost model's prediction of each schedule beside it, the step's
predicted median (`cost_model.median.step_median`, what a run's local prediction reports) and
the step on the lone links and on the links at the means (no per-point scales).
The CPUs are kept awake while the ranks run (`codegen.runtime.awake`, as the suite keeps them by
default: without it, this VM's blocked gloo threads wait milliseconds for a halted vCPU, and the
steps here ran 1.4-1.5x the runs' times); `--no-keep-awake` lets them halt.
`--schedules`: names separated by commas (a comma inside parentheses belongs to the name, as in
`ol(RS,fuse(P2P-C-AG))`); an unknown one is refused before any rank starts (exit 2).
Sizes: the program's size symbols, suffixes K = 2^10, M = 2^20. Nothing here is asserted: the
machine is shared and these are its measurements.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

import experiments
from codegen.lower import lower
from codegen.plan import Collective, FusedCollective, label, walk
from codegen.runtime.awake import keep_awake
from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch
from cost_model.median import step_median
from cost_model.topology import load_topology
from cost_model.workload import simulate
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


def marked_call(r: PlanRunner) -> tuple[tuple[str, ...], np.ndarray]:
    """One call of the plan with its timeline on: (segment labels, their ms)."""
    r.marks = []
    r.run()
    marks, r.marks = r.marks, None
    t = np.array([m[1] for m in marks])
    return tuple(m[0] for m in marks[1:]), np.diff(t) * 1e3


def step_of(plan) -> dict[str, int]:
    """{label of a step or of any part of it: the index of its Plan step}."""
    return {label(s): k for k, top in enumerate(plan.steps) for s in walk([top])}


def _owner(segment: str, owners: dict[str, int]) -> int:
    """The Plan step a segment belongs to: its label's step, or the step it names a part of."""
    words = segment.split(" ")
    for n in range(len(words), 0, -1):
        k = owners.get(" ".join(words[:n]))
        if k is not None:
            return k
    raise ValueError(f"segment {segment!r} names no step of the plan")


def rank_main(
    rank: int, world: int, experiment: str, names: list[str], bindings: dict, rounds: int
) -> dict:
    exp = experiments.get(experiment)
    every = exp.schedules()
    runners = {n: runner(every[n], bindings, rank, world) for n in names}
    parts = {n: [[] for _ in r.plan.steps] for n, r in runners.items()}
    labels: dict[str, Optional[tuple]] = {n: None for n in names}
    pieces = {n: [] for n in names}
    whole = {n: [] for n in names}
    first = {n: [] for n in names}
    later = {n: [] for n in names}
    owners = {n: step_of(r.plan) for n, r in runners.items()}
    for r in runners.values():  # warm-up
        r.run()
    for rnd in range(rounds):
        for i in np.random.default_rng([11, rnd]).permutation(len(names)):
            n, r = names[i], runners[names[i]]
            for call in range(CALLS):
                dist.barrier()
                got, ms = marked_call(r)
                if labels[n] is None:
                    labels[n] = got
                elif got != labels[n]:
                    raise RuntimeError(f"{n}: its pieces changed between calls")
                per_step = [0.0] * len(r.plan.steps)
                for segment, t in zip(got, ms):
                    per_step[_owner(segment, owners[n])] += float(t)
                for k, t in enumerate(per_step):
                    parts[n][k].append(t)
                pieces[n].append(ms)
                total = float(ms.sum())
                whole[n].append(total)
                (first if call == 0 else later)[n].append(total)
    kinds = {n: [_kind(s) for s in r.plan.steps] for n, r in runners.items()}
    return {
        "parts": parts,
        "whole": whole,
        "first": first,
        "later": later,
        "kinds": kinds,
        "labels": labels,
        "pieces": {n: np.array(p) for n, p in pieces.items()},
    }


def _kind(step) -> str:
    """A Plan step's label: "Collective <kind>", "FusedCollective fused", or its type."""
    if isinstance(step, Collective):
        return f"Collective {step.kind}"
    return "FusedCollective fused" if isinstance(step, FusedCollective) else type(step).__name__


def summary(res: dict, names: list[str], seed: int = 0, model: Optional[dict] = None) -> str:
    """One line per schedule (see the module); `model`: {schedule: (median, lone, means)} ms."""
    rng = np.random.default_rng(seed)
    lines = [
        f"{'schedule':26} {'step':>7} {'sum of parts':>13} {'independent':>12} "
        f"{'pieces':>7} {'first':>7} {'later':>7}"
        + (f" {'model':>7}" if model else "")
        + "   collectives' tail (share > median + 1 ms)"
    ]
    for n in names:
        P = [np.array(p) for p in res["parts"][n]]
        med = [float(np.median(p)) for p in P]
        drawn = sum(rng.choice(p, 20000) for p in P)
        pieces = res.get("pieces", {}).get(n)
        sum_pieces = float(np.median(pieces, axis=0).sum()) if pieces is not None else sum(med)
        tails = [
            f"{k.split()[-1]} {np.mean(p > m + 1.0):.2f}"
            for k, p, m in zip(res["kinds"][n], P, med)
            if k.startswith(("Collective", "FusedCollective"))
        ]
        lines.append(
            f"{n:26} {statistics.median(res['whole'][n]):7.2f} {sum(med):13.2f} "
            f"{float(np.median(drawn)):12.2f} {sum_pieces:7.2f} "
            f"{statistics.median(res['first'][n]):7.2f} "
            f"{statistics.median(res['later'][n]):7.2f}"
            + (f" {model[n][0]:7.2f}" if model else "")
            + "   "
            + ", ".join(tails)
        )
    if model:
        lines += [
            f"  model, {n}: on the lone links {model[n][1]:.2f}, on the links at the means "
            f"{model[n][2]:.2f}"
            for n in names
        ]
    return "\n".join(lines) + "\n(ms; rank 0)"


def segments_table(res: dict, name: str) -> str:
    """A schedule's segments: median, mean and 90th percentile over its calls (ms, rank 0)."""
    seg = res["pieces"][name]
    lines = [f"{name}: {len(seg)} calls", f"  {'segment':62} {'median':>7} {'mean':>7} {'p90':>7}"]
    for i, s in enumerate(res["labels"][name]):
        col = seg[:, i]
        lines.append(
            f"  {s[:62]:62} {np.median(col):7.3f} {np.mean(col):7.3f} {np.percentile(col, 90):7.3f}"
        )
    return "\n".join(lines)


def predicted(experiment: str, names: list[str], bindings: dict, world: int, path: str) -> dict:
    """{schedule: (the step's predicted median, on the lone links, at the means)} in ms, on the
    topology.yaml at `path`."""
    topo = load_topology("local", path=path)
    every = experiments.get(experiment).schedules()
    out = {}
    for n in names:
        plan = lower(every[n], bindings, world, fused_chunks=FUSED_CHUNKS)
        out[n] = (
            step_median(plan, topo).time_ms,
            simulate(plan, topo.lone()).time_ms,
            simulate(plan, topo).time_ms,
        )
    return out


def schedule_names(text: str) -> list[str]:
    """Comma-separated schedule names, a comma inside parentheses part of a name
    ("ol(RS,fuse(P2P-C-AG)),AR-C-P2P" is two)."""
    names, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            names.append(cur)
            cur = ""
        else:
            cur += ch
    return [n.strip() for n in names + [cur] if n.strip()]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="adam_fusion")
    ap.add_argument("--schedules", default="RS-C-AG,RS-C-AG+as_slice,AR-C")
    ap.add_argument("--size", default="N=1M", help="SYMBOL=SIZE[,SYMBOL=SIZE...]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--segments", action="store_true", help="each schedule's segments too")
    ap.add_argument("--topology", default=None, help="a topology.yaml: the model beside it")
    ap.add_argument(
        "--no-keep-awake",
        dest="keep_awake",
        action="store_false",
        help="let idle CPUs halt (the suite keeps them awake: keep_awake=true)",
    )
    a = ap.parse_args(argv)
    bindings = {k: parse_size(v) for k, v in (kv.split("=") for kv in a.size.split(","))}
    names = schedule_names(a.schedules)
    if a.experiment not in experiments.registry.names():
        ap.error(f"unknown experiment {a.experiment!r}")
    every = experiments.get(a.experiment).schedules()
    unknown = [n for n in names if n not in every]
    if unknown or not names:
        ap.error(
            f"{a.experiment} has no schedule {unknown[0] if unknown else ''!r}; schedules: "
            f"{', '.join(every)}"
        )
    model = predicted(a.experiment, names, bindings, a.world, a.topology) if a.topology else None
    with keep_awake(a.keep_awake):
        res = launch(
            rank_main, a.world, args=(a.experiment, names, bindings, a.rounds), timeout_s=1800
        )[0]
    print(f"{a.experiment} at {a.size} on {a.world} ranks, {a.rounds} rounds of {CALLS} calls")
    print(summary(res, names, model=model))
    if a.segments:
        for n in names:
            print(segments_table(res, n))


if __name__ == "__main__":
    main()
