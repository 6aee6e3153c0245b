"""Fit the `local` topology to microbenchmark measurements (data in, Topology out; no ranks here).

The calibration experiment (in experiments/) measures; this module only reads its measurements,
so the fit runs anywhere. A `Measurement` is one benchmark at one size: `kind`, `nbytes`, the
median `time_ms` over rounds (its min/max and mean), `world_size` P, `flops` where it applies.
The communication kinds (`AT_MEAN`) are fitted at their mean over rounds where it was measured
(`at_means`), every other kind at its median: on gloo a transfer's time has a heavy tail (a
512 KiB ring exchange: median 1.75 ms, mean 3.34 ms over 200 calls here), and a step of many
transfers, which is what the model adds them up into, pays nearer the sum of their means than
of their medians (RS-C-AG at 2^20 elements: 13.6 ms a step against 12.5 ms of its parts'
medians, `python -m benchmarks.steps`). The links fitted at the medians are kept beside them
(`lone_link`, `lone_library`), for what is a lone call's median (`Topology.lone`:
`experiment=collectives`, the calibration's own table); `experiment=collectives` takes the
lone call's time times `alone_scale`, from the `alone_<kind>` collectives (timed in rounds of
collectives only, as that experiment times them) over the same kinds among every other benchmark
(`alone_scale`). Kinds and what they fit (the model's
formula for each, inverted size by size):
- `exchange` (every rank sends b to its right, receives b from its left): the ring's link. On a
  bus the P messages of a step go one after the other: time = P * (overhead + b / (bandwidth *
  efficiency(b))) + latency. `exchange_chunked` (the same in C chunks) gives the per-message
  overhead at small sizes: first (chunked - whole) / ((C-1) P), then the overhead for which the
  model's own chunked exchange is as far above the whole one as measured (`chunk_overhead_us`:
  posts overlap the wire); the latency is the smallest sizes' fixed cost; each size's achieved
  bandwidth is solved for, the best is the bandwidth and each size's share of it the efficiency
  curve. With `rate_by: transfer` (the shipped `local`) chunks
  go at their whole transfer's rate, which `exchange_chunked` at large sizes checks.
- `all_reduce` (gloo's): the library link, the same way, as a ring of 2(P-1) steps of b/P bytes.
- `kernel` (the generated Adam kernel over b bytes of traffic): launch overhead (the smallest
  sizes' time), memory bandwidth and its efficiency curve by kernel bytes.
- `kernel_stream` (the same kernel, each call on fresh data beyond the caches, every rank at
  once), with the sweep's largest sizes: the device's `stream_memory_gbps`, the rate of a
  generated kernel inside a step (the median of bytes / (time - launch) over the calls that
  stream from memory, `stream_memory_gbps`), and of comm=shm's peer reads (`fit_shm`).
- `matmul` (torch.matmul at several shapes, `flops` each): the device's f32 peak and the rate by
  size, `matmul_efficiency_by_flops` (the achieved flop/s by flops, smoothed; the best is the
  peak, each size's share of it the curve; matmul_efficiency 1).
- `overlap_kernel`, `overlap_exchange`, `overlap_inside`, `overlap_both` (a kernel alone, an
  exchange alone, the kernel's time while the exchange is in flight, the time until both end):
  compute_slowdown u = 1 - kernel / inside; comm_slowdown v = (both - exchange) / inside.
- `reduce_scatter`, `all_gather` (the runtime's rings): the ring link too. At the means (a
  step's link) each size's achieved bandwidth is the mean of what the two rings need
  (`STEP_RINGS`: the collectives a step calls); at the medians (`lone_link`) the median of what
  the exchange and the two rings need.
- `add`, `copy` (torch's, in place): the device's `library_efficiency` by traffic bytes; and at
  the sizes that stream from memory the device's `inplace_write_weight` (`inplace_write_weight`:
  the add writes its input in place, the copy a buffer it does not read, which a
  `write_allocate` device reads first): what a generated kernel's in-place writes cost
  (`cost_model.closed_form.kernel_bytes`).
- `sequence`, `sequence_comm`, `sequence_compute`, `sequence_extra` (gloo's all-reduce of b bytes
  followed at once by the generated Adam kernel on b / 4 elements, each alone, and the first
  minus the other two paired call by call): the topology's `step_overhead_us`, the median over
  sizes of `sequence_extra` (at least 0), and `step_overhead_by_bytes`, `sequence_extra` by size
  (a running median of three, at least 0), which the model charges by a step's largest transfer;
  given the machine's `cores` (`fit`), both are divided by ranks / cores where the calibration
  ran more ranks than cores (`Topology.cores`: stated for one rank per core at most).
- `library_<routine>` (a library routine on b bytes of gradient, e.g. `library_adam`: the
  baseline's torch fused Adam step): the device's `library_steps_us[routine]`, its median times.
- `exchange_first`, `exchange_last` (a ring exchange in 4 chunks posted at once: the wait for
  the first chunk, the whole): `wake_us` (`wake_us`), what the first chunk's wait takes beyond
  its landing in the model.
- `send` (rank 0 sends b bytes to rank 1, the others idle): the link of one-way messages (a
  pipeline's P2P between stages, `Topology.p2p_link`): time = overhead + b / (bandwidth *
  efficiency(b)) + latency, the ring link's per-message overhead, the rest fitted as the ring's
  link is. The ring's link put a 4 MiB send at 1.88-1.90 ms where it took 1.55-1.63 ms (three
  calibrations on the Intel VM), and pipeline_parallel's 2-rank steps at H=1024 (a 4 MiB send
  and about 1 ms of kernels) 16-34% slow (each schedule's mean over eighteen stored runs; 5-21%
  with this link).
- `all_reduce` is also kept as measured (its means by size, at the calibration's ranks): the
  topology's `all_reduce_us`, the reference a run's own all-reduce is compared with
  (`experiments.predict.comm_scale`).
- `shm_all_reduce`, `shm_reduce_scatter`, `shm_all_gather` (comm=shm's collectives over POSIX
  shared memory, measured when the calibration runs with comm=shm): `fit_shm` makes the topology
  of that transport: the fitted one with its library link fitted to `shm_all_reduce` and its
  ring link to `shm_reduce_scatter` and `shm_all_gather`, as `fit` fits gloo's, and no
  `wake_us` (its waits spin, then yield: they never block).
Achieved bandwidths are smoothed by a running median over neighbouring sizes before the curve
is taken, so one noisy size does not bend it; a link benchmark's times are first made
non-decreasing in size (`curves.monotone`: a size more than 1.25x slower than the next larger one
is a stall and takes its neighbours' interpolation; smaller inversions are pooled at their
median, an isotonic fit), so a stalled small size reads neither as fixed cost nor as a slow
wire, nor raises its neighbours.
The device's figures (kernel, kernel_stream, matmul, add, copy, library_<routine>) are fitted in
`experiments.calibration.fit_device`.
`predict_ms(topo, m)` (`cost_model.microbench`) is the model's time for a measurement, for the
calibration's own predicted-vs-measured table. Units: `time_ms` in ms, `nbytes` in bytes,
topology fields as named (`_us`, `_gbps`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Iterable, Optional

from cost_model.closed_collectives import collective_us
from cost_model.collectives import CollSpec
from cost_model.curves import bulk_rate, fixed_cost, monotone, smooth, solve
from cost_model.microbench import (  # noqa: F401
    ALONE,
    LIBRARY,
    SHM,
    Measurement,
    pool,
    predict_ms,
    waited_us,
)
from cost_model.network import hop_us
from cost_model.topology import LinkClass, Topology

from .fit_device import (  # noqa: F401
    STREAM_FROM,
    SWEEP_STREAM_FROM,
    fit_device,
    inplace_write_weight,
    stream_memory_gbps,
)
from .fit_device import series as _series

FITTED = (
    "exchange",
    "exchange_chunked",
    "reduce_scatter",
    "all_gather",
    "all_reduce",
    "kernel",
    "kernel_stream",
    "matmul",
    "overlap_kernel",
    "overlap_exchange",
    "overlap_inside",
    "overlap_both",
    "sequence",
    "sequence_comm",
    "sequence_compute",
    "exchange_first",
    "send",
)
# `exchange_first` within this share of `exchange_last`: its wait ended with the exchange
# (`wake_us`)
CAPPED = 0.9
ALONE_RANGE = (0.5, 2.0)  # what `alone_scale` is clipped to
# the kinds whose achieved bandwidths set the ring link at the means (a step's), their mean
# size by size: the runtime's two rings, which a step calls. The median of these and the bare
# `exchange` (no adds or copies: 2.6-5.0 GB/s at 0.5-8 MiB at the means of 24 pooled
# calibrations, the all-gather 1.3-3.2, the reduce-scatter 1.2-2.3) took the all-gather's rate
# mostly, and the reduce-scatter's went unheard. Re-predicting those 24 paper runs (Intel VM):
# lamb_fusion's speedup-error median was over 5% in 9 of them (6 with the mean of the rings),
# adam_fusion's largest over 15% in 13 (9), model_parallel's median over 5% in 7 (2). The lone
# link (medians: `experiment=collectives`) keeps the median of all three.
STEP_RINGS = ("reduce_scatter", "all_gather")
# fitted at their mean over rounds (see the module); comm=shm's too, as shm_<kind>
AT_MEAN = ("exchange", "exchange_chunked", "send", "all_reduce", "reduce_scatter", "all_gather")


def at_means(ms: Iterable[Measurement]) -> list[Measurement]:
    """The measurements with each `AT_MEAN` kind's `time_ms` its mean over rounds, where
    measured (a calibration without `time_ms_mean` is fitted at its medians throughout)."""
    return [
        dataclasses.replace(m, time_ms=m.time_ms_mean)
        if m.time_ms_mean is not None and m.kind.removeprefix(SHM) in AT_MEAN
        else m
        for m in ms
    ]


def fit_link(
    ms: list[Measurement],
    benchmarks: dict,
    messages: float,
    overhead_us: float,
    rate_by: str = "message",
    rates_from: Optional[tuple] = None,
) -> LinkClass:
    """A link class that makes each benchmark's closed form `model(link, b)` (us) its measured
    time: benchmarks = {kind: (message_of(b), model)}. The latency is the fixed cost: solved in
    every benchmark at its smallest sizes (the first kind's `messages` serialized messages of
    `message_of(b)` bytes give a bulk rate to take their small wire time off), the median
    taken. Then each size's achieved bandwidth is solved for in every benchmark where the wire
    is a third of its time or more (so every message a benchmark's path serializes is counted
    as the model counts it; each benchmark's times made non-decreasing in size first,
    `monotone`), the median over the benchmarks taken and smoothed over sizes: the
    best is the bandwidth, each size's share of it the efficiency by message size.
    `rates_from`: the kinds whose achieved bandwidths set the rate instead, their mean at each
    size (every benchmark still gives the latency); None, or none of them measured: the median
    over every benchmark."""
    first = next(iter(benchmarks))
    points = monotone(_series(ms, first))
    overhead = min(overhead_us, fixed_cost(points))
    message_of = benchmarks[first][0]
    bulk = bulk_rate([(message_of(b) * messages, t) for b, t in points])

    def link(bw: float, latency: float) -> LinkClass:
        return LinkClass(
            bandwidth_gbps=bw, latency_us=latency, overhead_us=overhead, rate_by=rate_by
        )

    fixed = []
    for kind, (_, model) in benchmarks.items():
        series = monotone(_series(ms, kind))
        for b, t in series[: max(1, min(5, len(series) // 2))]:
            fixed.append(solve(lambda lat: model(link(bulk, lat), b), t))
    latency = statistics.median(fixed)
    by_kind: dict[str, dict[int, list[float]]] = {}
    for kind, (size_of, model) in benchmarks.items():
        for b, t in monotone(_series(ms, kind)):
            if model(link(1e9, latency), b) > t * 2 / 3:  # the wire is too small a part
                continue
            per_byte = solve(lambda y: model(link(1.0 / max(y, 1e-12), latency), b), t, 1.0)
            by_kind.setdefault(kind, {}).setdefault(int(size_of(b)), []).append(
                1.0 / max(per_byte, 1e-12)
            )
    chosen = [k for k in (rates_from or ()) if k in by_kind]
    pick = statistics.fmean if chosen else statistics.median
    rates: dict[int, list[float]] = {}
    for kind in chosen or by_kind:
        for size, got in by_kind[kind].items():
            rates.setdefault(size, []).extend(got)
    sizes = sorted(rates)
    if not sizes:  # a short sweep: no size's wire stands out of its fixed cost
        return LinkClass(
            bandwidth_gbps=round(bulk, 4),
            latency_us=round(latency, 2),
            overhead_us=round(overhead, 2),
            rate_by=rate_by,
        )
    curve = smooth([pick(rates[k]) for k in sizes])
    bw = max(curve)
    return LinkClass(
        bandwidth_gbps=round(bw, 4),
        latency_us=round(latency, 2),
        overhead_us=round(overhead, 2),
        rate_by=rate_by,
        efficiency={k: round(max(1e-3, r / bw), 4) for k, r in zip(sizes, curve)},
    )


def message_overhead_us(ms: list[Measurement], messages: float, up_to: int = 1 << 18) -> float:
    """The per-message cost: what C chunks cost beyond one message, per extra message, where the
    wire is negligible (the median over sizes up to 256 KiB of (chunked - whole) / ((C - 1) *
    messages), `messages` = 1 where each rank's thread posts its own in parallel); at large
    sizes chunks gain on the bulk rate instead; at least 1 us."""
    whole = dict(_series(ms, "exchange"))
    extra = [
        (m.time_ms * 1e3 - whole[m.nbytes]) / ((m.chunks - 1) * messages)
        for m in ms
        if m.kind == "exchange_chunked" and m.chunks > 1 and m.nbytes in whole and m.nbytes <= up_to
    ]
    return max(1.0, statistics.median(extra)) if extra else 1.0


def chunk_overhead_us(
    ms: list[Measurement], topo: Topology, first: float, up_to: int = 1 << 18
) -> float:
    """The per-message cost for which the model (`predict_ms` on topo, its link's overhead
    replaced) puts the chunked exchange as far above the whole one as measured, at sizes up to
    256 KiB (the median over sizes; `first`: the estimate that starts the search)."""
    times = dict(_series(ms, "exchange"))

    def with_overhead(o: float) -> Topology:
        link = dataclasses.replace(topo.intra.link, overhead_us=o)
        return dataclasses.replace(topo, intra=dataclasses.replace(topo.intra, link=link))

    got = []
    for m in ms:
        if (
            m.kind == "exchange_chunked"
            and m.chunks > 1
            and m.nbytes in times
            and m.nbytes <= up_to
        ):
            whole = dataclasses.replace(m, kind="exchange", chunks=1)

            def extra(o, m=m, whole=whole):
                return (predict_ms(with_overhead(o), m) - predict_ms(with_overhead(o), whole)) * 1e3

            got.append(solve(extra, m.time_ms * 1e3 - times[m.nbytes], first))
    return max(1.0, statistics.median(got)) if got else first


def fit(
    measurements: Iterable,
    base: Topology,
    world_size: int,
    source: str = "",
    cores: Optional[int] = None,
) -> Topology:
    """The base topology (suite/conf/topology/local.yaml) with every fitted figure replaced: its links
    fitted at the communication kinds' means (`at_means`), `lone_link`, `lone_library` and
    `lone_p2p_link` at their medians (`Topology.lone`); `cores`: the cores the calibration's
    `world_size` ranks shared (`Topology.cores`; None: unknown, the step overhead as measured)."""
    ms = [m if isinstance(m, Measurement) else Measurement.of(m) for m in measurements]
    topo = _means_and_lone(_fit, ms, base, world_size, rates_from=STEP_RINGS)
    per_core = max(1.0, world_size / cores) if cores else 1.0  # the overhead at one rank a core
    return dataclasses.replace(
        topo,
        source=source,
        all_reduce_us=all_reduce_us(ms, world_size),
        alone_scale=alone_scale(ms),
        cores=cores,
        step_overhead_us=round(topo.step_overhead_us / per_core, 2),
        step_overhead_by_bytes={
            b: round(us / per_core, 2) for b, us in topo.step_overhead_by_bytes.items()
        },
    )


def alone_scale(ms: list[Measurement]) -> float:
    """The topology's `alone_scale`: the geometric mean, over every `alone_<kind>` measurement
    with a `<kind>` one at its size and ranks, of its median over that one's (a collective
    timed in rounds of collectives only against the same among every other benchmark), clipped
    to ALONE_RANGE; 1 without them."""
    among = {(m.kind, m.nbytes, m.world_size): m.time_ms for m in ms}
    logs = [
        math.log(m.time_ms / among[key])
        for m in ms
        if m.kind.startswith(ALONE)
        and (key := (m.kind[len(ALONE) :], m.nbytes, m.world_size)) in among
        and m.time_ms > 0
        and among[key] > 0
    ]
    if not logs:
        return 1.0
    return round(min(ALONE_RANGE[1], max(ALONE_RANGE[0], math.exp(statistics.fmean(logs)))), 4)


def all_reduce_us(ms: list[Measurement], world_size: int) -> dict:
    """{ranks: {bytes: mean us}} of the `all_reduce` measurements (the topology's
    `all_reduce_us`, a run's communication reference); {} without them."""
    got = {int(b): round(t, 2) for b, t in _series(at_means(ms), "all_reduce")}
    return {world_size: got} if got else {}


def _means_and_lone(fit_links, ms: list[Measurement], *args, **at_means_kw) -> Topology:
    """`fit_links(ms, *args, **at_means_kw)` at the communication kinds' means, with the links
    of the same fit at the medians (without `at_means_kw`) as `lone_link`, `lone_library` and
    `lone_p2p_link`."""
    lone = fit_links(ms, *args)
    return dataclasses.replace(
        fit_links(at_means(ms), *args, **at_means_kw),
        lone_link=lone.intra.link,
        lone_library=lone.library,
        lone_p2p_link=lone.p2p_link,
    )


def _fit(
    ms: list[Measurement], base: Topology, world_size: int, rates_from: Optional[tuple] = None
) -> Topology:
    P = world_size
    device = fit_device(ms, base.device)
    plain = dataclasses.replace(base, device=device, compute_slowdown=0.0, comm_slowdown=0.0)
    per_step = P if base.intra.kind == "bus" else 1  # messages one after the other per step
    group = tuple(range(P))

    def with_link(link, **kw):
        return dataclasses.replace(plain, intra=dataclasses.replace(base.intra, link=link), **kw)

    # the ring's link: from a bare ring step, and from the runtime's own rings (with their adds
    # and copies), each size's achieved bandwidth the median of the three, or the mean of the
    # `rates_from` kinds' (a step's link: STEP_RINGS)
    rings = {
        "exchange": (
            lambda b: b,
            lambda link, b: (
                collective_us(
                    CollSpec(  # without the copy
                        "all_gather", b * P, group
                    ),
                    "ring",
                    with_link(link),
                )
                - (device.elementwise_us(2 * b) if base.ring_work_on_compute else 0.0)
            ),
        ),
        "reduce_scatter": (
            lambda b: b / P,
            lambda link, b: collective_us(
                CollSpec("reduce_scatter", b, group), "ring", with_link(link)
            ),
        ),
        "all_gather": (
            lambda b: b / P,
            lambda link, b: collective_us(
                CollSpec("all_gather", b, group), "ring", with_link(link)
            ),
        ),
    }
    posted = base.ring_work_on_compute  # each rank's thread posts its own messages
    u, v = _slowdowns(ms, base)
    overhead = message_overhead_us(ms, 1 if posted else per_step)
    for _ in range(2):  # the first estimate, then the one the model's own chunks agree with
        link = fit_link(ms, rings, per_step, overhead, base.intra.link.rate_by, rates_from)
        overhead = chunk_overhead_us(
            ms, with_link(link, compute_slowdown=u, comm_slowdown=v), overhead
        )
    library = fit_link(
        ms,
        {
            "all_reduce": (
                lambda b: b / P,
                lambda link, b: collective_us(
                    CollSpec("all_reduce", b, group, library=True),
                    "ring",
                    dataclasses.replace(plain, library=link),
                ),
            )
        },
        2 * (P - 1) * per_step,
        0.0,
        base.library.rate_by if base.library else "message",
    )
    fitted = dataclasses.replace(
        base,
        device=device,
        intra=dataclasses.replace(base.intra, link=link),
        library=library,
        compute_slowdown=u,
        comm_slowdown=v,
        p2p_link=p2p_link(ms, link, with_link),
        step_overhead_us=step_overhead_us(ms, base.step_overhead_us),
        step_overhead_by_bytes=step_overhead_by_bytes(ms),
    )
    return dataclasses.replace(fitted, wake_us=wake_us(ms, fitted, base.wake_us))


def p2p_link(ms: list[Measurement], ring: LinkClass, with_link) -> LinkClass | None:
    """The link of one-way messages (`Topology.p2p_link`) from `send`: one message from rank 0
    to rank 1 alone (`network.hop_us` on `with_link(link)`), with the ring link's per-message
    overhead (`ring`) and rate_by; None without `send` measurements."""
    if not any(m.kind == "send" for m in ms):
        return None
    one = lambda link, b: hop_us(with_link(link), 0, 1, b, whole=b)  # noqa: E731
    return fit_link(ms, {"send": (lambda b: b, one)}, 1, ring.overhead_us, ring.rate_by)


def wake_us(ms: list[Measurement], topo: Topology, default: float = 0.0) -> float:
    """How long after its chunk lands a blocked thread runs (`Topology.wake_us`), from
    `exchange_first` (the wait for the first of C chunks posted at once): per size, the measured
    wait minus the model's landing of that chunk on `topo` with no wake (`waited_us`), the
    median over the sizes whose wait ended well before the exchange did (under CAPPED of
    `exchange_last`; a later one only says the wake is at least that long), at least 0; where
    every size is capped, the largest of those lower bounds; `default` without the kind."""
    first, last = (dict(_series(ms, k)) for k in ("exchange_first", "exchange_last"))
    chunks = {m.nbytes: m.chunks for m in ms if m.kind == "exchange_first"}
    sizes = [b for b in sorted(first) if b in last]
    if not sizes:
        return default
    P = ms[0].world_size
    quiet = dataclasses.replace(topo, wake_us=0.0)
    late = {b: first[b] - waited_us(quiet, P, b, chunks[b])[0] for b in sizes}
    free = [late[b] for b in sizes if first[b] < CAPPED * last[b]]
    got = statistics.median(free) if free else max(late.values())
    return round(max(0.0, got), 1)


def fit_shm(
    measurements: Iterable, fitted: Topology, world_size: int, source: str = ""
) -> Topology:
    """The topology of comm=shm: `fitted` (this machine's, from `fit`: device, overlap, step)
    with its links replaced by shared memory's: the library link from `shm_all_reduce`, the ring
    link from `shm_reduce_scatter` and `shm_all_gather`, each size's achieved bandwidth solved
    for in the same closed forms as gloo's (`fit`), and `peer_reads` (a fused all-reduce's
    kernel reads its peers' chunks: memory traffic, `cost_model.workload`) at the device's
    `stream_memory_gbps` (`kernel_stream`: every rank streaming at once). ValueError without
    shm measurements."""
    every = [m if isinstance(m, Measurement) else Measurement.of(m) for m in measurements]
    ms = [dataclasses.replace(m, kind=m.kind[len(SHM) :]) for m in every if m.kind.startswith(SHM)]
    if not ms:
        raise ValueError("no shm_* measurements to fit comm=shm's links to")
    return dataclasses.replace(
        _means_and_lone(_fit_shm, ms, fitted, world_size),
        source=source or fitted.source,
        all_reduce_us=all_reduce_us(ms, world_size),
        alone_scale=1.0,
    )


def _fit_shm(ms: list[Measurement], fitted: Topology, world_size: int) -> Topology:
    P, group = world_size, tuple(range(world_size))
    plain = dataclasses.replace(fitted, compute_slowdown=0.0, comm_slowdown=0.0)
    per_step = P if fitted.intra.kind == "bus" else 1

    def with_link(link):
        return dataclasses.replace(plain, intra=dataclasses.replace(fitted.intra, link=link))

    rings = {
        kind: (
            lambda b: b / P,
            lambda link, b, kind=kind: collective_us(
                CollSpec(kind, b, group), "ring", with_link(link)
            ),
        )
        for kind in ("reduce_scatter", "all_gather")
    }
    # no per-message overhead: a chunk is a copy and a flag; the fixed cost is the latency
    link = fit_link(ms, rings, per_step, 0.0, fitted.intra.link.rate_by)
    library = fit_link(
        ms,
        {
            "all_reduce": (
                lambda b: b / P,
                lambda lk, b: collective_us(
                    CollSpec("all_reduce", b, group, library=True),
                    "ring",
                    dataclasses.replace(plain, library=lk),
                ),
            )
        },
        2 * (P - 1) * per_step,
        0.0,
        fitted.library.rate_by if fitted.library else "message",
    )
    # its P2P goes over shared memory too (`codegen.runtime.shm_comm`): the ring's link
    return dataclasses.replace(
        fitted,
        intra=dataclasses.replace(fitted.intra, link=link),
        library=library,
        peer_reads=True,
        wake_us=0.0,
        p2p_link=None,
    )


def step_overhead_us(ms: list[Measurement], default: float = 0.0) -> float:
    """What a step costs beyond its operations timed alone, at least 0 (us): the median over
    sizes of `sequence_extra` (each call's sequence - comm - compute, paired within the call);
    without it (older calibrations), of sequence - sequence_comm - sequence_compute."""
    paired = _series(ms, "sequence_extra")
    if paired:
        return round(max(0.0, statistics.median(t for _, t in paired)), 2)
    parts = [dict(_series(ms, k)) for k in ("sequence", "sequence_comm", "sequence_compute")]
    sizes = [b for b in parts[0] if b in parts[1] and b in parts[2]]
    if not sizes:
        return default
    return round(
        max(0.0, statistics.median(parts[0][b] - parts[1][b] - parts[2][b] for b in sizes)), 2
    )


def step_overhead_by_bytes(ms: list[Measurement]) -> dict:
    """{bytes: us}: `sequence_extra` by its all-reduce's size (each size's median over rounds), a
    running median of three over sizes, at least 0; {} without it (older calibrations)."""
    paired = _series(ms, "sequence_extra")
    return {
        int(b): round(max(0.0, t), 2) for (b, _), t in zip(paired, smooth([t for _, t in paired]))
    }


def _slowdowns(ms: list[Measurement], base: Topology) -> tuple[float, float]:
    got = {m.kind: m.time_ms for m in ms if m.kind.startswith("overlap_")}
    if len(got) < 4:
        return base.compute_slowdown, base.comm_slowdown
    u = 1.0 - got["overlap_kernel"] / got["overlap_inside"]
    v = (got["overlap_both"] - got["overlap_exchange"]) / got["overlap_inside"]
    clip = lambda x: round(min(0.9, max(0.0, x)), 3)  # noqa: E731
    return clip(u), clip(v)
