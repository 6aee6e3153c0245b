"""Timing on ranks: warm-up, repeats, a barrier before each timed region, the maximum over ranks.

`time_ranks(fn, warmup, repeats, group=None) -> Timing` calls `fn()` `warmup` times untimed, then
`repeats` times, each preceded by a barrier; a repeat's time is the maximum over the ranks of the
group of their elapsed wall-clock time (all_reduce MAX), so a repeat costs what the slowest rank
paid. Every rank gets the same Timing. Units: milliseconds.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Timing:
    times_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)


def time_ranks(fn: Callable[[], None], warmup: int, repeats: int, group: Optional[object] = None,
               before: Optional[Callable[[], None]] = None) -> Timing:
    """Time fn on every rank of `group`; `before()` (untimed) runs ahead of each call, e.g. to
    reset state that fn updates in place."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for _ in range(warmup):
        if before:
            before()
        fn()
    out = []
    t = torch.zeros(1, dtype=torch.float64)
    for _ in range(repeats):
        if before:
            before()
        dist.barrier(group=group)
        start = time.perf_counter()
        fn()
        t[0] = (time.perf_counter() - start) * 1e3
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out.append(float(t[0]))
    return Timing(tuple(out))
