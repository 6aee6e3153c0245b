"""Fit the device of the `local` topology (one rank's compute) to calibration's measurements.

Data in, `Device` out (`experiments.calibration.fit.fit` calls `fit_device`; no ranks here):
- `kernel` (the generated Adam kernel over b bytes of traffic): launch overhead (the smallest
  sizes' time), memory bandwidth and its efficiency curve by kernel bytes;
- `kernel_stream` and the sweep's largest `kernel` calls: `stream_memory_gbps`, the rate of a
  generated kernel inside a step (`stream_memory_gbps`);
- `matmul`: the f32 peak and the rate by flops (`matmul_rate`);
- `add`, `copy`: `library_efficiency` by traffic bytes, and `inplace_write_weight`;
- `library_<routine>`: `library_steps_us`, each size's median time.
`series(ms, kind)` is every fit's view of one benchmark: (bytes, median time in us) by size.
Units: `time_ms` in ms, `nbytes` in bytes, device fields as named (`_us`, `_gbps`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Iterable

from cost_model.curves import fit_curve, fixed_cost, smooth
from cost_model.microbench import LIBRARY, Measurement
from cost_model.topology import Device

# the streaming rate's calls (`stream_memory_gbps`), in bytes of traffic per call: the Adam
# kernel over 2^21 elements on fresh data, over 2^23 on the sweep's reused buffers
STREAM_FROM, SWEEP_STREAM_FROM = 28 << 21, 28 << 23


def series(ms: Iterable[Measurement], kind: str) -> list[tuple[int, float]]:
    """(nbytes, median time in us) of one kind, by size."""
    by: dict[int, list[float]] = {}
    for m in ms:
        if m.kind == kind:
            by.setdefault(m.nbytes, []).append(m.time_ms * 1e3)
    return sorted((b, statistics.median(ts)) for b, ts in by.items())


def inplace_write_weight(ms: list[Measurement], write_allocate: bool) -> float:
    """What a byte written in place costs against a byte read (`Device.inplace_write_weight`),
    from torch's in-place add (x += y: reads 2b, writes b in place) and copy (y = x: reads b,
    writes b that a `write_allocate` device reads first: 3b) of b bytes at the sizes whose
    traffic streams from memory (the add's 3b from STREAM_FROM): copy / add = 3 / (2 + w) at
    each, the median, within [0, 1]. 1 (as a read) on a device that does not allocate on write,
    or without such sizes."""
    add, copy = dict(series(ms, "add")), dict(series(ms, "copy"))
    got = [
        3.0 * add[b] / copy[b] - 2.0
        for b in sorted(add)
        if b in copy and 3 * b >= STREAM_FROM and copy[b] > 0
    ]
    if not write_allocate or not got:
        return 1.0
    return round(min(1.0, max(0.0, statistics.median(got))), 3)


def stream_memory_gbps(ms: list[Measurement], launch_us: float) -> float:
    """GB/s per rank with every rank streaming memory at once: the median of bytes / (time -
    launch) (the slowest rank's) over the kernel's calls whose data comes from memory whatever
    the caches do: `kernel_stream` from STREAM_FROM bytes (fresh data each call) and the
    sweep's `kernel` from SWEEP_STREAM_FROM (its buffers reused, but seven times a 32 MiB
    cache). Smaller `kernel_stream` calls scatter (35-56 GB/s over seven calibrations here,
    partly served from the cache; their median once read 45.8 GB/s) where these agree (35-37
    GB/s) with what the kernels of measured steps reach (adam's at 2^24 elements: 35-39).
    Without any such call, the median over `kernel_stream`'s sizes; 0 (the device's own curve)
    without those either."""

    def rates(kind: str, least: int) -> list[float]:
        return [b / max(t - launch_us, 1e-3) / 1e3 for b, t in series(ms, kind) if b >= least]

    got = rates("kernel_stream", STREAM_FROM) + rates("kernel", SWEEP_STREAM_FROM) or rates(
        "kernel_stream", 0
    )
    return round(statistics.median(got), 3) if got else 0.0


def library_steps_us(ms: list[Measurement]) -> dict:
    """{routine: {bytes: median us}} from the `library_<routine>` measurements."""
    kinds = sorted({m.kind for m in ms if m.kind.startswith(LIBRARY)})
    return {k[len(LIBRARY) :]: {int(b): round(t, 2) for b, t in series(ms, k)} for k in kinds}


def fit_device(ms: list[Measurement], base: Device) -> Device:
    """Launch overhead, memory bandwidth and its curve (the kernel), f32 peak (matmul)."""
    kern = series(ms, "kernel")
    launch = fixed_cost(kern)
    mem_bw, _ = fit_curve(kern, launch)  # then the launch without the small sizes' wire time
    launch = max(0.0, statistics.median(t - b / (mem_bw * 1e3) for b, t in kern[:5]))
    mem_bw, mem_eff = fit_curve(kern, launch)
    f32, mm_eff = matmul_rate(ms, base)
    lib = {}
    elementwise = sorted(
        [(3 * b, t) for b, t in series(ms, "add")] + [(2 * b, t) for b, t in series(ms, "copy")]
    )
    if elementwise:  # torch's adds and copies, by traffic, against the same memory bandwidth
        lib = {
            b: round(min(1.0, max(1e-3, b / max(t - launch, 1e-3) / 1e3 / mem_bw)), 4)
            for b, t in elementwise
        }
    return dataclasses.replace(
        base,
        memory_bandwidth_gbps=round(mem_bw, 3),
        launch_us=round(launch, 2),
        library_steps_us=library_steps_us(ms) or base.library_steps_us,
        memory_efficiency={k: round(v, 4) for k, v in mem_eff.items()},
        matmul_efficiency=1.0,
        stream_memory_gbps=stream_memory_gbps(ms, launch) or base.stream_memory_gbps,
        inplace_write_weight=inplace_write_weight(ms, base.write_allocate),
        matmul_efficiency_by_flops=mm_eff,
        library_efficiency=lib,
        peak_tflops={**base.peak_tflops, "f32": round(f32, 5), "f64": round(f32 / 2, 5)},
    )


def matmul_rate(ms: list[Measurement], base: Device) -> tuple[float, dict]:
    """(f32 peak in TFLOP/s, {flops: fraction of it}) from the `matmul` measurements: each
    size's achieved rate (the median where a size was measured more than once), smoothed over
    sizes by flops; the best is the peak. Without any: the base device's peak, no curve."""
    by: dict[int, list[float]] = {}
    for m in ms:
        if m.kind == "matmul" and m.time_ms > 0 and m.flops > 0:
            by.setdefault(int(m.flops), []).append(m.flops / (m.time_ms * 1e9))
    if not by:
        return base.peak("f32"), {}
    sizes = sorted(by)
    rates = smooth([statistics.median(by[f]) for f in sizes])
    best = max(rates)
    return round(best, 5), {f: round(max(1e-3, r / best), 4) for f, r in zip(sizes, rates)}
