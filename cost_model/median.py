"""A step's median time: what a measured step's median over rounds is predicted to be.

    r = step_median(plan, topo, fold=None, compute_us=None)   # a workload.Result
    calls(plan.steps)                                          # its communication calls

A run reports a step's time as the median over rounds (`experiments.rounds`), while a calibrated
topology's links are fitted at its communication benchmarks' means (`experiments.calibration.fit`:
a step of many heavy-tailed calls pays their tails), and `Topology.lone()` has them at their
medians. Neither is a step's median: a step of one call takes that call's median (a stall hits
it in a minority of rounds), a step of many calls their means less what the sum's skew leaves
out. For n independent calls alike, the sum's mean is n means and its skewness falls as
1/sqrt(n) while its spread grows as sqrt(n), so its mean - median gap (skewness x spread / 6,
to first order: Cornish-Fisher) stays one call's gap:

    median(sum) = n x mean - (mean - median) = lone + (1 - 1/n) x (means - lone)

where `means` is the step simulated on the topology's links (`workload.simulate`), `lone` on
`Topology.lone()`'s, and n the step's communication calls (`calls`: a collective or send, each
chunk of a fused collective or an overlap a call of its own). One call: its median; many: their
means, less one call's gap. Re-predicting the measured rows of seven `experiment=paper` runs
(runs 43-46 and two earlier on the Intel VM, the AMD reference run 40) with it, the largest
speedup error fell in 12 of 14 (experiment, run) cells of adam_fusion and lamb_fusion (adam in
runs 43-45: 29.8 / 16.0 / 13.5% to 17.5 / 11.6 / 17.9%; lamb 26.5 / 25.0 / 21.5% to 21.0 / 17.9 /
17.0%; the AMD reference's adam 14.7% to 19.1%) and in all 14 of model_parallel and
pipeline_parallel; the medians moved either way by 0-3.3 points.

A topology without lone links (shipped, GPU), a step of one rank or with no communication: the
plain simulation. The Result is the simulation on the topology's links, its `time_us` replaced
(its trace keeps the means' timeline). Units: us.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from codegen.plan import P2P, Collective, FusedCollective, Overlap, Plan, Prefetch

from .topology import Topology
from .workload import Result, simulate


def calls(steps, mult: int = 1) -> int:
    """The communication calls of `steps`: a Collective or P2P one call, each `chunks` times
    inside a FusedCollective or an Overlap (both its producer's and its consumer's)."""
    n = 0
    for s in steps:
        if isinstance(s, (Collective, P2P)):
            n += mult
        elif isinstance(s, FusedCollective):
            n += calls(s.steps, mult * s.chunks)
        elif isinstance(s, Overlap):
            n += calls((s.producer, s.consumer), mult * s.chunks)
        elif isinstance(s, Prefetch):
            n += calls((s.gather, s.behind), mult)
    return n


def step_median(
    plan: Plan, topo: Topology, fold: Optional[bool] = None, compute_us: Optional[dict] = None
) -> Result:
    """The predicted median of the step's time over rounds (see the module)."""
    means = simulate(plan, topo, fold, compute_us)
    lone = topo.lone()
    n = calls(plan.steps)
    if lone is topo or plan.world_size < 2 or n == 0:
        return means
    low = simulate(plan, lone, fold, compute_us).time_us
    return dataclasses.replace(means, time_us=low + (1.0 - 1.0 / n) * (means.time_us - low))


__all__ = ["calls", "step_median"]
