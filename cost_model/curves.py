"""Curves from a benchmark's sizes: pure functions of (bytes, time) points, no topology.

`monotone` makes a link benchmark's times non-decreasing in size (a stall interpolated, noise
pooled); `fit_curve` takes a rate and its efficiency by size from times with a fixed cost;
`fixed_cost` is the smallest sizes' time; `bulk_rate` the largest sizes' bytes per time;
`smooth` a running median of three; `solve` inverts an increasing function by bisection. Units:
bytes, and whatever unit of time the caller's points carry (`experiments.calibration.fit`: us), rates
in GB/s where the times are in us.
"""

from __future__ import annotations

import math
import statistics


def monotone(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """(bytes, time) by size made non-decreasing in size. Moving more bytes does not take less
    time, so a size measured slower than larger ones was hit by something the model does not
    describe (a scheduler stall), in two ways:
    - a size more than STALLED x slower than the next larger one is a stall outright (on this
      VM one size's gloo all-reduce sat at 2.2 ms in most rounds between 0.44 and 0.78 ms): it
      is dropped and takes its neighbours' log-log interpolation (the smallest size, the next
      larger one's time), so that it raises none of them;
    - smaller inversions (a flat, noisy run of small sizes) are pooled, the isotonic fit in
      least absolute deviations: adjacent sizes that go the wrong way pooled into one block at
      the block's median, until no block is slower than the next (a running minimum would take
      the lowest of the noise)."""
    points = unstalled(points)
    blocks: list[list[float]] = []
    for _, t in points:
        blocks.append([t])
        while len(blocks) > 1 and statistics.median(blocks[-2]) > statistics.median(blocks[-1]):
            blocks[-2:] = [blocks[-2] + blocks[-1]]
    times = [statistics.median(b) for b in blocks for _ in b]
    return [(b, t) for (b, _), t in zip(points, times)]


STALLED = 1.25  # a size this much slower than the next larger one: a stall (`monotone`)


def unstalled(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Each size more than STALLED x slower than the next larger one replaced by the log-log
    interpolation of the nearest kept sizes on either side (the larger one's time where there
    is none smaller), from the largest size (always kept) down."""
    kept = [True] * len(points)
    for i in range(len(points) - 2, -1, -1):
        nxt = next(j for j in range(i + 1, len(points)) if kept[j])
        kept[i] = points[i][1] <= STALLED * points[nxt][1]
    out = []
    for i, (b, t) in enumerate(points):
        if kept[i]:
            out.append((b, t))
            continue
        lo = next((j for j in range(i - 1, -1, -1) if kept[j]), None)
        hi = next(j for j in range(i + 1, len(points)) if kept[j])
        if lo is None:
            out.append((b, points[hi][1]))
            continue
        (b0, t0), (b1, t1) = points[lo], points[hi]
        w = math.log(b / b0) / math.log(b1 / b0)
        out.append((b, math.exp((1 - w) * math.log(t0) + w * math.log(t1))))
    return out


def smooth(values: list[float]) -> list[float]:
    """A running median of three (the ends keep theirs)."""
    if len(values) < 3:
        return list(values)
    return (
        [values[0]]
        + [statistics.median(values[i - 1 : i + 2]) for i in range(1, len(values) - 1)]
        + [values[-1]]
    )


def fit_curve(points: list[tuple[float, float]], fixed_us: float):
    """From (bytes, time_us) with time = fixed + bytes / rate(bytes): (best rate in GB/s,
    {bytes: rate / best}). Sizes whose time is within 1.5x the fixed cost carry no rate."""
    usable = [(b, b / (t - fixed_us) / 1e3) for b, t in points if t > 1.5 * fixed_us and b > 0]
    if not usable:  # a short or noisy sweep: every size that takes longer than the fixed cost
        usable = [(b, b / (t - fixed_us) / 1e3) for b, t in points if t > fixed_us and b > 0]
    if not usable:
        raise ValueError("no size is large enough to measure a bandwidth")
    sizes = [b for b, _ in usable]
    rates = smooth([r for _, r in usable])
    best = max(rates)
    return best, {int(b): max(1e-3, min(1.0, r / best)) for b, r in zip(sizes, rates)}


def fixed_cost(points: list[tuple[int, float]], n: int = 5) -> float:
    """The fixed cost: the median time of the n smallest sizes (of the smaller half at most, so
    that a short sweep's large sizes do not count as fixed cost)."""
    n = max(1, min(n, len(points) // 2))
    return statistics.median(t for _, t in points[:n])


def solve(f, target: float, hi: float = 0.0) -> float:
    """The x >= 0 with f(x) = target for an increasing f (0 when f(0) >= target; bisection
    from [0, hi], hi doubled until f(hi) >= target; hi = max(target, 1) when not given)."""
    lo = 0.0
    if f(lo) >= target:
        return 0.0
    hi = hi or max(target, 1.0)
    while f(hi) < target and hi < 1e9:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def bulk_rate(points: list[tuple[float, float]], largest: int = 4) -> float:
    """GB/s from the largest sizes' slopes (bytes, time_us): the median over pairs of
    d(bytes) / d(time), which a fixed latency does not bias."""
    top = sorted(points)[-largest:]
    slopes = [
        (b2 - b1) / (t2 - t1) / 1e3
        for i, (b1, t1) in enumerate(top)
        for b2, t2 in top[i + 1 :]
        if t2 > t1 and b2 > b1
    ]
    if not slopes:
        b, t = top[-1]
        return b / t / 1e3
    return statistics.median(slopes)
