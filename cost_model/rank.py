"""Ranking candidate Plans by predicted time: the closed form over all, the DES over the best k.

    ranking = rank(plans, topo, top_k=8)      # plans: candidate key -> Plan (same program, point)
    ranking[0].key                            # the predicted best (a Ranking is a sequence)
    [r.closed_us, r.des_us, r.closed_rank, r.des_rank]
    ranking.closed_s, ranking.des_s, ranking.des_count   # what the search cost (wall seconds)

The closed form (`closed_form.plan_us`, microseconds per schedule, no contention) is cheap and
orders the whole space; the discrete-event simulation (`workload.simulate`, contention and overlap
as they happen; on a calibrated topology the step's median, `median.step_median`) re-times the
`top_k` best of that order, and the final order is by DES time for those and by closed-form
time after them (a candidate the DES did not time never outranks one it did). Ties keep the
candidates' given order. `compute_us` (candidate key -> {step id: us}) replaces the generated
kernels' modelled time where a candidate runs library code (a baseline).

Pure: Plans in, numbers out; no lowering, no ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

from codegen.plan import Plan

from .closed_form import plan_us
from .median import step_median
from .topology import Topology


@dataclass(frozen=True)
class Ranked:
    key: str
    closed_us: float  # closed-form time
    closed_rank: int  # 0 = predicted fastest by the closed form
    des_us: Optional[float] = None  # DES time (the top k only)
    des_rank: Optional[int] = None  # rank among the DES-timed candidates

    @property
    def time_us(self) -> float:
        """The best prediction of this candidate: the DES where it ran, else the closed form."""
        return self.des_us if self.des_us is not None else self.closed_us


@dataclass(frozen=True)
class Ranking:
    """Every candidate, the predicted best first (a sequence of `Ranked`), and what it cost: the
    closed form's wall time over all of them, the DES's over the `des_count` it re-timed."""

    entries: tuple[Ranked, ...]
    closed_s: float
    des_s: float
    des_count: int

    def __getitem__(self, i):
        return self.entries[i]

    def __iter__(self) -> Iterator[Ranked]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def rank(
    plans: Mapping[str, Plan],
    topo: Topology,
    top_k: int = 8,
    compute_us: Optional[Mapping[str, dict]] = None,
    topologies: Optional[Mapping[str, Topology]] = None,
) -> Ranking:
    """Every candidate ranked (see the module doc); the predicted best first. `topologies`
    (candidate key -> Topology) times a candidate on its own variant of `topo` (e.g. with NCCL's
    algorithm forced: `Topology.algo`)."""
    if not plans:
        raise ValueError("rank: no candidate plans")
    if top_k < 1:
        raise ValueError(f"rank: top_k must be >= 1, got {top_k}")
    compute_us, topologies = compute_us or {}, topologies or {}
    t0 = time.perf_counter()
    closed = {k: plan_us(p, topologies.get(k, topo)) for k, p in plans.items()}
    order = sorted(closed, key=lambda k: closed[k])  # stable: ties keep the given order
    closed_rank = {k: i for i, k in enumerate(order)}
    t1 = time.perf_counter()
    des = {
        k: step_median(plans[k], topologies.get(k, topo), compute_us=compute_us.get(k)).time_us
        for k in order[:top_k]
    }
    t2 = time.perf_counter()
    des_order = sorted(des, key=lambda k: des[k])
    des_rank = {k: i for i, k in enumerate(des_order)}
    final = des_order + order[top_k:]
    return Ranking(
        tuple(Ranked(k, closed[k], closed_rank[k], des.get(k), des_rank.get(k)) for k in final),
        t1 - t0,
        t2 - t1,
        len(des),
    )


__all__ = ["Ranked", "Ranking", "rank"]
