"""Timing on ranks, on every backend: warm-up, repeats, a barrier before each timed region, the
maximum over ranks.

`time_ranks(fn, warmup, repeats, group=None, clock=WallClock()) -> Timing` calls `fn()` `warmup`
times untimed, then `repeats` times (more for a short fn with `min_total_ms`), each preceded by
`clock.settle()` (a GPU finishes its queued work) and a barrier of `group` (a gloo group: the
default one `launch` makes); a repeat's time is what `clock` measured between `start()` and
`stop()` (the backend's clock: host wall time on the CPU, CUDA events on a GPU), the maximum over
the ranks of the group (all_reduce MAX), so a repeat costs what the slowest rank paid. Every rank
gets the same Timing (the same number of repeats too). Units: milliseconds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .backend import WallClock


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


def time_ranks(
    fn: Callable[[], None],
    warmup: int,
    repeats: int,
    group: Optional[object] = None,
    before: Optional[Callable[[], None]] = None,
    min_total_ms: float = 0.0,
    max_repeats: int = 0,
    clock=None,
) -> Timing:
    """Time fn on every rank of `group`; `before()` (untimed) runs ahead of each call, e.g. to
    reset state that fn updates in place. With `min_total_ms`, a short fn is repeated until the
    repeats add up to that much (as the first repeat's time, the same on every rank, says), at
    most `max_repeats` times: a median of more samples where each costs little."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    clock = clock or WallClock()
    for _ in range(warmup):
        if before:
            before()
        fn()
    out: list[float] = []
    t = torch.zeros(1, dtype=torch.float64)
    count = repeats
    while len(out) < count:
        if before:
            before()
        clock.settle()
        dist.barrier(group=group)
        clock.start()
        fn()
        t[0] = clock.stop()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out.append(float(t[0]))
        if len(out) == 1 and min_total_ms > 0:
            wanted = math.ceil(min_total_ms / max(out[0], 1e-6))
            count = max(repeats, min(max_repeats or repeats, wanted))
    return Timing(tuple(out))
