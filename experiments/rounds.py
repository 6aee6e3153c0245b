"""Interleaved timing: a point's baseline and schedules timed in rounds, speedups paired per round.

    r = interleave({"baseline": f0, "AR-C": f1, ...}, Budget(...), key=(seed, N), clock=clock)
    r.times_ms["AR-C"]            # one sample per round: ms per call, the slowest rank's
    r.speedup("AR-C")             # Interval: median of baseline[i] / AR-C[i] over rounds i, 95% CI
    r.stopped                     # "converged" | "budget" | "rounds"
    interleave(fns, budget, key, clock, baseline=None)   # times alone, nothing paired
    interleave(fns, budget, key, clock, aside=("probe",))  # "probe" timed, not held to the target

On every rank of the default process group, collectively:
- warm-up: each function `budget.warmup` times (at least once), in the given order; each one's
  last warm-up (the slowest rank's time) sets its `calls[name]` (`calls_for`), how many calls
  make one of its samples (a call shorter than MIN_SAMPLE_MS: several, at least MIN_CALLS, at
  most MAX_CALLS), so a function is called max(1, warmup) + rounds x (1 + calls[name]) times
  (max(1, warmup) + rounds x calls[name] where the point's calls are long: below);
- before each sample, one untimed call of the same function (after its own barrier), so that no
  sample takes the first call after another function: that call ran slower (RS-C-AG at 2^20
  elements: 8.6 against 7.7 ms, `python -m benchmarks.steps`), and a step of 5 ms and more,
  sampled as one call, always took it where a shorter step's median of several calls did not.
  Not where every function's warm-up took LONG_CALL_MS or more (`needs_untimed` of the shortest):
  such calls have no slow first call to leave out (their buffers are far beyond the caches; at
  2^22 and 2^24 elements the first call after another schedule was within -2.3..+3.5% of the
  later ones, either way: `benchmarks.steps` on adam's and lamb's AR-C, RS-C-AG+as_slice and
  fuse(RS-C-AG)+as_slice, 12-30 rounds), so their samples are taken at once and their rounds
  take half the time; one rule for all of a point's compared functions, so that paired
  samples are taken alike (a function in `aside`, a probe compared with calibration's
  benchmark, by its own warm-up: `untimed_calls`). Calibration's benchmarks are sampled the
  same way, each bench by its own calls (`experiments.calibration.measure.interleaved`);
- a sample (`sample_ms`): `calls` calls, EACH after `clock.settle()` and a barrier and timed
  alone by the backend's clock; the sample is the median of those calls' times in ms (the
  experiments' schedules, `experiments.calibration.measure`'s microbenchmarks and
  `experiments.collectives` alike, so that the model is fitted to and checked on samples like
  the steps it predicts; fitted to the fastest of 3 calls, the time of a call no stall hit, it
  predicted adam / lamb steps 10-40% fast, as the steps carry the stalls). Never back to back:
  on gloo, a communication that follows another at once waits behind it (2 ranks on the 2-core
  VM: a 1 KiB send/recv exchange 0.1 ms after a barrier, 3-4 ms a call back to back). Even
  apart, a two-way exchange (each rank's isend and irecv at once; gloo's ring steps and its
  all-reduce) stalls for one or two 4 ms scheduler ticks in 5-60% of calls, by load, while
  gloo's TCP loop threads hold both cores; a one-way send does not. The median of such a mix
  can flip between the two modes from run to run (a 4 KiB reduce-scatter 0.21 or 1.76 ms);
- rounds: each round runs every function once (one sample each), in a fresh random order drawn
  from `numpy.random.default_rng([*key, round])`, so the same on every rank and different each
  round; the round's samples and "this rank ran out of time" go through one all_reduce MAX, so
  every rank holds the same samples (the slowest rank's) and takes the same decision;
- stop: after at least `budget.min_rounds`, when every paired speedup's bootstrap 95% interval
  (RESAMPLES resamples of the rounds, seeded by `key`: the same on every rank) lies within
  +-`budget.ci_pct`% of its median (with `baseline=None`: every function's time interval;
  functions named in `aside` are timed in the rounds but not held to the target)
  ("converged"), or when the point is out of time on some rank ("budget": `out_of_time`, it
  has used `budget.budget_s` seconds of wall time, and, where its rounds are long, either
  `budget.long_rounds` rounds or `budget.long_budget_s` seconds), or after `budget.max_rounds`
  ("rounds"). The extension spends time where steps are long: a 2^24-element optimizer step
  (1.2-2.8 s a round) gets only `min_rounds` in 15 s, and its speedup's interval then reaches
  7-16% either side (three `experiment=paper` runs); the interval narrows as 1/sqrt(rounds).
  Points with short rounds reach `long_rounds` inside `budget_s` and stop as before.

Pure rules (`paired`, `bootstrap_median`, `calls_for`, `out_of_time`) are separate from the rank
loop.
Units: ms, s, %.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

# a sample of a short call: calls adding up to MIN_SAMPLE_MS, at least MIN_CALLS, at most MAX_CALLS
MIN_SAMPLE_MS, MIN_CALLS, MAX_CALLS = 5.0, 3, 64
# a call at least this long (its warm-up, the slowest rank's) takes no untimed call before its
# samples (`needs_untimed`)
LONG_CALL_MS = 25.0
RESAMPLES = 1000  # bootstrap resamples per interval


@dataclass(frozen=True, kw_only=True)
class Budget:
    warmup: int = 1  # untimed calls of each function before the first round
    min_rounds: int = 5
    max_rounds: int = 400
    budget_s: float = 20.0  # wall seconds per point (warm-up included)
    ci_pct: float = 2.5  # stop when every speedup's 95% interval is within +-ci_pct% of its median
    # past budget_s, a point with fewer than long_rounds rounds goes on, up to long_budget_s
    # seconds (0: no extension)
    long_rounds: int = 0
    long_budget_s: float = 0.0


def out_of_time(elapsed_s: float, rounds: int, budget: Budget) -> bool:
    """Whether a point that has run `rounds` rounds in `elapsed_s` seconds is out of time:
    past budget_s, and, where it has fewer than long_rounds rounds, past long_budget_s too."""
    if elapsed_s <= budget.budget_s:
        return False
    return rounds >= budget.long_rounds or elapsed_s > budget.long_budget_s


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
    calls: Mapping[str, int]  # per function, calls per sample (each timed alone; a sample: median)
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


def bootstrap_median(
    samples: Sequence[float], key: tuple = (0,), resamples: int = RESAMPLES
) -> Interval:
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


def converged(
    times_ms: Mapping[str, Sequence[float]],
    key: tuple,
    ci_pct: float,
    baseline: Optional[str] = "baseline",
    aside: Sequence[str] = (),
) -> bool:
    """Every paired speedup's 95% interval within +-ci_pct% of its median (baseline None: every
    time's interval), the functions named in `aside` left out."""
    held = {n: t for n, t in times_ms.items() if n not in aside}
    if baseline is None:
        return all(bootstrap_median(t, key).halfwidth_pct <= ci_pct for t in held.values())
    base = times_ms[baseline]
    return all(
        bootstrap_median(paired(base, t), key).halfwidth_pct <= ci_pct
        for name, t in held.items()
        if name != baseline
    )


def calls_for(call_ms: float) -> int:
    """Calls per sample of a call that took `call_ms`: 1 from MIN_SAMPLE_MS up, else enough to
    add up to it, at least MIN_CALLS (a median of several, not of 2), at most MAX_CALLS."""
    if call_ms >= MIN_SAMPLE_MS:
        return 1
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(MIN_SAMPLE_MS / max(call_ms, 1e-6))))


def needs_untimed(call_ms: float) -> bool:
    """Whether a function whose call took `call_ms` gets an untimed call before each sample: a
    call under LONG_CALL_MS, whose first call after another function runs slower."""
    return call_ms < LONG_CALL_MS


def untimed_calls(
    names: Sequence[str], warm_ms: Sequence[float], aside: Sequence[str] = ()
) -> dict[str, bool]:
    """Per function, whether an untimed call goes before each of its samples: one rule for the
    functions compared with each other (`needs_untimed` of their shortest warm-up), so that
    paired samples are taken alike; a function in `aside`, compared with calibration's
    benchmark instead, by its own warm-up, as calibration samples that benchmark."""
    held = [w for n, w in zip(names, warm_ms) if n not in aside] or list(warm_ms)
    point = needs_untimed(min(held))
    return {n: needs_untimed(w) if n in aside else point for n, w in zip(names, warm_ms)}


def interleave(
    fns: Mapping[str, Callable[[], None]],
    budget: Budget,
    key: tuple,
    clock,
    baseline: Optional[str] = "baseline",
    aside: Sequence[str] = (),
) -> Rounds:
    """Time `fns` in interleaved rounds on every rank (see the module)."""
    if baseline is not None and baseline not in fns:
        raise ValueError(f"interleave needs the {baseline!r} function to pair speedups with")
    started = time.monotonic()
    names = list(fns)
    warm = torch.zeros(len(names), dtype=torch.float64)
    for _ in range(max(1, budget.warmup)):
        for i, name in enumerate(names):
            warm[i] = sample_ms(fns[name], 1, clock)  # one call: any statistic
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    calls = {name: calls_for(float(w)) for name, w in zip(names, warm)}
    untimed = untimed_calls(names, [float(w) for w in warm], aside)
    times: dict[str, list[float]] = {n: [] for n in names}
    round_ = torch.zeros(len(names) + 1, dtype=torch.float64)
    stopped = "rounds"
    for r in range(budget.max_rounds):
        for i in np.random.default_rng([*_ints(key), r]).permutation(len(names)):
            if untimed[names[i]]:  # a sample never takes the first call
                sample_ms(fns[names[i]], 1, clock)
            round_[i] = sample_ms(fns[names[i]], calls[names[i]], clock)
        round_[-1] = float(out_of_time(time.monotonic() - started, r + 1, budget))
        dist.all_reduce(round_, op=dist.ReduceOp.MAX)
        for i, name in enumerate(names):
            times[name].append(float(round_[i]))
        if r + 1 < budget.min_rounds:
            continue
        late = round_[-1] > 0
        # checked every round at first, then every tenth of the rounds so far (and at the end)
        if late or (r + 1 - budget.min_rounds) % max(1, (r + 1) // 10) == 0:
            if converged(times, key, budget.ci_pct, baseline, aside):
                stopped = "converged"
                break
        if late:
            stopped = "budget"
            break
    return Rounds(
        {n: tuple(t) for n, t in times.items()},
        calls,
        stopped,
        time.monotonic() - started,
        tuple(key),
    )


def sample_ms(fn: Callable[[], None], calls: int, clock) -> float:
    """One sample: the median of the ms of `calls` calls, each timed alone after the device
    settles and the ranks meet (this rank's times; see the module)."""
    times = []
    for _ in range(max(1, calls)):
        clock.settle()
        dist.barrier()
        clock.start()
        fn()
        times.append(clock.stop())
    return statistics.median(times)


def _ints(key) -> list[int]:
    """A seed sequence from a key of ints and strings (stable across processes)."""
    out = []
    for k in key:
        out += [int(k)] if isinstance(k, (int, np.integer)) else list(str(k).encode())
    return out


def repeatability_pct(halfwidths_pct: Sequence[float]) -> float:
    """The machine's repeatability at these points: the median 95% half-width, in %."""
    return statistics.median(halfwidths_pct) if halfwidths_pct else float("nan")
