"""Interleaved timing: a point's baseline and schedules timed in rounds, speedups paired per round.

    r = interleave({"baseline": f0, "AR-C": f1, ...}, Budget(...), key=(seed, N), clock=clock)
    r.times_ms["AR-C"]            # one sample per round: ms per call, the slowest rank's
    r.speedup("AR-C")             # Interval: median of baseline[i] / AR-C[i] over rounds i, 95% CI
    r.stopped                     # "converged" | "budget" | "rounds"

On every rank of the default process group, collectively:
- warm-up: each function `budget.warmup` times (at least once), in the given order; the last
  warm-up's time (the slowest rank's) sets `calls`, how many back-to-back calls make one sample
  (a step shorter than MIN_SAMPLE_MS is called several times per sample, at most MAX_CALLS);
- rounds: each round runs every function once (one sample each: `clock.settle()`, a barrier,
  `calls` calls timed by the backend's clock), in a fresh random order drawn from
  `numpy.random.default_rng([*key, round])`, so the same on every rank and different each round;
  the round's times and "this rank ran out of time" go through one all_reduce MAX, so every rank
  holds the same samples and takes the same decision;
- stop: after at least `budget.min_rounds`, when every paired speedup's bootstrap 95% interval
  (RESAMPLES resamples of the rounds, seeded by `key`: the same on every rank) lies within
  +-`budget.ci_pct`% of its median ("converged"), or when the point has used `budget.budget_s`
  seconds of wall time on some rank ("budget"), or after `budget.max_rounds` ("rounds").

Pure statistics (`paired`, `bootstrap_median`) are separate from the rank loop. Units: ms, s, %.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

MIN_SAMPLE_MS, MAX_CALLS = 5.0, 64  # a sample lasts at least this long, in at most this many calls
RESAMPLES = 1000  # bootstrap resamples per interval


@dataclass(frozen=True, kw_only=True)
class Budget:
    warmup: int = 1  # untimed calls of each function before the first round
    min_rounds: int = 5
    max_rounds: int = 400
    budget_s: float = 20.0  # wall seconds per point (warm-up included)
    ci_pct: float = 2.5  # stop when every speedup's 95% interval is within +-ci_pct% of its median


@dataclass(frozen=True)
class Interval:
    median: float
    lo: float
    hi: float

    @property
    def halfwidth_pct(self) -> float:
        """The interval's larger side, in % of the median."""
        return 100.0 * max(self.median - self.lo, self.hi - self.median) / self.median


@dataclass(frozen=True)
class Rounds:
    times_ms: Mapping[str, tuple[float, ...]]  # per function, one sample (ms per call) per round
    calls: int  # calls per sample
    stopped: str  # converged | budget | rounds
    elapsed_s: float
    key: tuple

    @property
    def rounds(self) -> int:
        return len(next(iter(self.times_ms.values())))

    def time(self, name: str) -> Interval:
        """Median time per call with its bootstrap 95% interval."""
        return bootstrap_median(self.times_ms[name], self.key)

    def speedup(self, name: str, baseline: str = "baseline") -> Interval:
        """Median of the paired per-round speedups baseline/name, with its 95% interval."""
        return bootstrap_median(paired(self.times_ms[baseline], self.times_ms[name]), self.key)


def paired(base_ms: Sequence[float], other_ms: Sequence[float]) -> np.ndarray:
    """Per-round speedups: base[i] / other[i]."""
    return np.asarray(base_ms, dtype=np.float64) / np.asarray(other_ms, dtype=np.float64)


def bootstrap_median(samples: Sequence[float], key: tuple = (0,),
                     resamples: int = RESAMPLES) -> Interval:
    """The median of `samples` and the percentile bootstrap 95% interval of the median
    (deterministic for a given key)."""
    x = np.asarray(samples, dtype=np.float64)
    med = float(np.median(x))
    if len(x) < 2:
        return Interval(med, med, med)
    rng = np.random.default_rng([*_ints(key), len(x)])
    meds = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return Interval(med, float(min(lo, med)), float(max(hi, med)))


def converged(times_ms: Mapping[str, Sequence[float]], key: tuple, ci_pct: float,
              baseline: str = "baseline") -> bool:
    """Every paired speedup's 95% interval within +-ci_pct% of its median."""
    base = times_ms[baseline]
    return all(bootstrap_median(paired(base, t), key).halfwidth_pct <= ci_pct
               for name, t in times_ms.items() if name != baseline)


def interleave(fns: Mapping[str, Callable[[], None]], budget: Budget, key: tuple,
               clock, baseline: str = "baseline") -> Rounds:
    """Time `fns` in interleaved rounds on every rank (see the module)."""
    if baseline not in fns:
        raise ValueError(f"interleave needs the {baseline!r} function to pair speedups with")
    started = time.monotonic()
    names = list(fns)
    warm = torch.zeros(len(names), dtype=torch.float64)
    for _ in range(max(1, budget.warmup)):
        for i, name in enumerate(names):
            warm[i] = _sample(fns[name], 1, clock)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    calls = max(1, min(MAX_CALLS, math.ceil(MIN_SAMPLE_MS / max(float(warm.min()), 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in names}
    round_ = torch.zeros(len(names) + 1, dtype=torch.float64)
    stopped = "rounds"
    for r in range(budget.max_rounds):
        for i in np.random.default_rng([*_ints(key), r]).permutation(len(names)):
            round_[i] = _sample(fns[names[i]], calls, clock) / calls
        round_[-1] = float(time.monotonic() - started > budget.budget_s)
        dist.all_reduce(round_, op=dist.ReduceOp.MAX)
        for i, name in enumerate(names):
            times[name].append(float(round_[i]))
        if r + 1 < budget.min_rounds:
            continue
        out_of_time = round_[-1] > 0
        # checked every round at first, then every tenth of the rounds so far (and at the end)
        if out_of_time or (r + 1 - budget.min_rounds) % max(1, (r + 1) // 10) == 0:
            if converged(times, key, budget.ci_pct, baseline):
                stopped = "converged"
                break
        if out_of_time:
            stopped = "budget"
            break
    return Rounds({n: tuple(t) for n, t in times.items()}, calls, stopped,
                  time.monotonic() - started, tuple(key))


def _sample(fn: Callable[[], None], calls: int, clock) -> float:
    """ms of `calls` back-to-back calls, after the device settles and the ranks meet."""
    clock.settle()
    dist.barrier()
    clock.start()
    for _ in range(calls):
        fn()
    return clock.stop()


def _ints(key) -> list[int]:
    """A seed sequence from a key of ints and strings (stable across processes)."""
    out = []
    for k in key:
        out += [int(k)] if isinstance(k, (int, np.integer)) else list(str(k).encode())
    return out


def repeatability_pct(halfwidths_pct: Sequence[float]) -> float:
    """The machine's repeatability at these points: the median 95% half-width, in %."""
    return statistics.median(halfwidths_pct) if halfwidths_pct else float("nan")
