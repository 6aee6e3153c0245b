"""Calibration: microbenchmarks of the runtime on local ranks, fitted into the `local` topology.

    python -m suite experiment=calibrate [world_size=2] [scale=smoke|default]

Every rank runs the same operations side by side with the runtime every experiment uses
(`codegen.runtime.comm` over gloo, kernels from `codegen.build`), in interleaved rounds as the
measurement harness times schedules (`interleaved`): each round runs every benchmark once, in a
fresh random order (the same on every rank), each sample after an untimed call of its own (a
benchmark under `experiments.rounds.LONG_CALL_MS` a call) and a barrier, the slowest rank's time
per call (a short benchmark's sample holds several calls, `experiments.rounds.calls_for`: a
local operation's back to back, a communication's each after its own barrier, the sample their
median, `experiments.rounds.sample_ms`, as every experiment's rounds and `collectives` time
them), and each
benchmark's time is the median over rounds (and its mean over rounds, `time_ms_mean`, at which
the fit takes the communication kinds for steps: `experiments.calibration.fit.AT_MEAN`; the
results.csv rows are the medians, predicted with the links fitted at the medians,
`Topology.lone`); so benchmarks that the fit compares with each other
(a step and its parts, a kernel alone and beside an exchange, chunked and whole exchanges, the
matmul sizes) see a shared machine's drifts alike. Sizes are in bytes (f32 buffers), powers of
two up to the scale's largest (a communication's buffers views of one set of the largest, a
kernel's buffers its own, as a runner's are; the benchmarks are built in `experiments.benches`):
- `exchange`: a ring step: every rank sends b bytes to its right and receives b from its left
  (`comm.P2P`, what the runtime's ring reduce-scatter and all-gather are made of);
  `exchange_chunked`: the same in 16 chunks (the per-message cost, from b = 64 KiB);
  `exchange_first`, `exchange_last`: the same in 4 chunks, every chunk's receive and send posted
  at once as a fused step posts its reduce-scatter's, each rank then waiting for its first
  chunk (first) and for all (last), at 8-64 MiB (`benches.waited`: the topology's `wake_us`);
- `send`: rank 0 sends b bytes to rank 1, the others idle (a pipeline's P2P): the link of
  one-way messages (`Topology.p2p_link`);
- `all_reduce`: gloo's all-reduce of b bytes (`comm.all_reduce`, the AR-C schedules' and the
  baselines'); `reduce_scatter`, `all_gather`: the runtime's rings (`comm.reduce_scatter`,
  `comm.all_gather`, b = the whole array), checked against the model, not fitted;
- `kernel`: the generated kernel of the lowered Adam program over 2^k elements (b = 28 bytes of
  traffic per element), on every rank;
  `kernel_stream`: the same kernel over n elements (a fused step's chunk), each call on the next
  piece of buffers of STREAM_BUFFER elements (beyond the caches), on every rank at once: the memory
  rate ranks that share the memory bus get streaming a step's data (the device's
  `stream_memory_gbps`, comm=shm's peer reads too, read from its calls of 2^21 elements and up
  and the sweep's of 2^23 and up, `experiments.calibration.fit.stream_memory_gbps`: the sweep
  reuses its buffers, which smaller sizes find in the caches);
  `library_adam`: adam_fusion's baseline's optimizer step (its `local_step`: torch's fused
  Adam) on 2^22 and 2^23 elements (b = 4 bytes each), each round's time put in the memory
  spell of `kernel_stream`'s median round (`in_streams_spell`): the device's
  `library_steps_us`, which every run's own baseline step is compared with to read the
  machine's memory rate at that point
  (`experiments.predict.memory_scale`);
  `add` / `copy`: torch's in-place add and copy of b bytes (a ring's reduction, an all-gather's
  own-block copy); `matmul`: torch.matmul of [m, k] x [k, n] f32 into its output, whole and in
  row pieces (each call's rows new to the caches), at the shapes model_parallel's row-parallel
  matmuls and their overlap's row chunks have on 2 ranks (`MATMULS`; b, flops and time: one
  call's): the rate by flops;
- `sequence`: a step's two operations back to back, no barrier between (gloo's all-reduce of b
  bytes, then the generated Adam kernel on b / 4 elements), beside `sequence_comm` and
  `sequence_compute` (each alone), all three in every call of one bench, and `sequence_extra`,
  the first minus the other two call by call: what a step costs beyond its parts (the fit
  states it at one rank a core, given the machine's cores: `Topology.cores`);
- `alone_all_reduce`, `alone_reduce_scatter`, `alone_all_gather`: the same collectives at every
  other size (`ALONE_SCALES`), timed as `experiment=collectives` times them (zeroed buffers, each
  call after its own barrier), in rounds of their own after the others (`benches.alone`): a
  collective among collectives only ran faster than the same one among kernels, matmuls and
  steps, in the median 0.90x (2 ranks on the Intel VM, fifteen paper runs: the collectives'
  sweep against the same run's calibration), so the sweep, not a step, is predicted with the
  fit's `alone_scale` (`experiments.calibration.fit.alone_scale`);
- `shm_all_reduce`, `shm_reduce_scatter`, `shm_all_gather` (with comm=shm): the same collectives
  over shared memory (`codegen.runtime.shm_comm`), fitted into a second topology,
  `topology_shm.yaml` (`experiments.calibration.fit.fit_shm`), the one comm=shm's runs predict with;
- `overlap_kernel`, `overlap_exchange`: a kernel, an exchange, each alone; `overlap_inside`,
  `overlap_both`: both started at once, the kernel's time while the exchange is in flight
  (compute slowdown) and the time until both are done (communication slowdown); one bench, the
  three side by side at least 3 times a sample (`benches.overlap`).

The baselines' library computation (torch's fused Adam, ...) is not benchmarked here: every run
times its own baseline and the cost model takes that time (`experiments.predict`).

Rounds: `ROUNDS[scale]` x max(3, repeats) (20 at default scale; 6 in the quick pass a run makes
when none is cached). The fit (`experiments.calibration.fit.fit`, which only sees the measurements as
data) is written to
`topology.yaml` in the run directory (use it with `topology=local topology.path=FILE`), the raw
measurements to `calibration.json`, and measured and predicted rows of every benchmark to
results.csv (`schedule` = the benchmark, `size` = bytes). Given a history folder
(`MeasureSettings.calibration_history`: the suite keeps one per machine and measurement code),
the fit reads this calibration pooled with up to `calibration_pool - 1` earlier ones of the
same scale and ranks kept there (per benchmark the median over them, `with_history`; what it
read: calibration_pooled.json), and this one is kept there; the rows and the calibration's own
predicted-vs-measured check stay this calibration's.
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from codegen.build import build
from codegen.lower import lower
from codegen.plan import Compute
from codegen.runtime import comm
from codegen.runtime.backend import NO_STREAMS, CpuBackend, CpuKernel
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import cpu_cores, run_ranks
from cost_model.microbench import LIBRARY, SHM, Measurement, pool, predict_ms
from cost_model.topology import dump_topology, load_topology
from reports.progress import Progress
from reports.results import append_row

from ..benches import (
    Bench,
    alone,
    communication,
    kernels,
    library_steps,
    matmuls,
    overlap,
    sequences,
    shm_collectives,
)
from ..kinds import MeasurementExperiment
from ..optimizers import adam_program
from ..registry import register
from ..rounds import calls_for, needs_untimed
from .fit import fit, fit_shm
from .history import keep, pooled

log = logging.getLogger(__name__)

NAME = "calibrate"
TOPOLOGY, CALIBRATION = "topology.yaml", "calibration.json"
POOLED = "calibration_pooled.json"  # what the fit read, where it pooled several calibrations
TOPOLOGY_SHM = "topology_shm.yaml"  # with comm=shm: the shared-memory transport's topology
# scale "quick": the default sizes' range, every other size, one pass: what a run calibrates
# with when none is cached for this machine (experiments.calibration.cache), in about 20 s
SCALES = {"smoke": (12, 20, 2), "quick": (12, 26, 2), "default": (12, 27, 1), "paper": (12, 27, 1)}
KERNEL_SCALES = {
    "smoke": (7, 16, 3),
    "quick": (10, 25, 3),
    "default": (7, 25, 1),
    "paper": (7, 25, 1),
}  # elements
ROUNDS = {"smoke": 1, "quick": 2, "default": 4, "paper": 6}  # x max(3, repeats): rounds
# torch.matmul [m, k] x [k, n] in `pieces` calls of m / pieces rows each: the row-parallel
# matmuls of model_parallel at 2 ranks (k = K/P, n = H = 1024), whole and in the row pieces its
# overlap computes (S*B/P/chunks rows a call), each call's rows new to the caches as there
MATMULS = {
    "smoke": [(128, 128, 256, 1), (128, 128, 256, 4), (256, 256, 256, 1)],
    "quick": [
        (1024, 512, 1024, 1),
        (1024, 512, 1024, 8),
        (1024, 2048, 1024, 1),
        (1024, 2048, 1024, 8),
    ],
    "default": [
        (1024, 512, 1024, 1),
        (1024, 512, 1024, 2),
        (1024, 512, 1024, 4),
        (1024, 512, 1024, 8),
        (4096, 512, 1024, 1),
        (4096, 512, 1024, 8),
        (1024, 2048, 1024, 1),
        (1024, 2048, 1024, 8),
    ],
}
MATMULS["paper"] = MATMULS["default"]
# in calibration.json for the fit, not rows: a difference of times (may be negative)
DERIVED = ("sequence_extra",)
STREAM_SCALES = {
    "smoke": (12, 14, 2),
    "quick": (18, 22, 2),
    "default": (18, 22, 1),
    "paper": (18, 22, 1),
}  # elements: a fused step's chunks (kernel_stream)
# elements: the buffers kernel_stream's chunks are pieces of, as large as the largest optimizer
# step of the default sweep (adam_fusion's and lamb_fusion's 2^24), the sweep's largest size
# where that is smaller (`benches.kernels`)
STREAM_BUFFER = 1 << 24
# elements: library_adam, from 2^22 (a point below the curve gets no memory scale,
# `experiments.predict.memory_scale`): at 2^20 its calls, back to back on the same 16 MiB, run
# from the caches (1.25 ms against 6.9 at 2^22, 5.5x faster for 4x less data) where a run's
# step, after its all-reduce, does not (1.9 ms): one run that took 2^20 into the curve read
# memory scales of 0.66-0.68 there and predicted its 2^20 kernels 1.5x slow
LIBRARY_SCALES = {
    "smoke": (12, 12, 1),
    "quick": (22, 23, 1),
    "default": (22, 23, 1),
    "paper": (22, 23, 1),
}
ALONE_SCALES = {
    "smoke": (12, 20, 4),
    "quick": (12, 26, 2),
    "default": (12, 26, 2),
    "paper": (12, 26, 2),
}  # bytes: the `alone_<kind>` collectives
SEQUENCE_SCALES = {
    "smoke": (14, 18, 2),
    "quick": (19, 23, 2),
    "default": (19, 23, 1),
    "paper": (19, 23, 1),
}  # elements


def sizes(scale: str, table=SCALES) -> list[int]:
    lo, hi, step = table[scale]
    return [1 << k for k in range(lo, hi + 1, step)]


def _adam_kernel(n_max: int, world: int):
    """The AR-C Compute step of the Adam program lowered at n_max elements, and its plan."""
    plan = lower(adam_program(), {"N": n_max}, world)
    step = next(s for s in plan.steps if isinstance(s, Compute))
    return plan, step


def rank_main(rank: int, world: int, spec: dict) -> list[dict]:
    """Every benchmark in interleaved rounds (`interleaved`); per benchmark the median over
    rounds of the slowest rank's time per call, its min and max, and its mean over rounds
    (`time_ms_mean`, which the fit takes for the communication kinds,
    `experiments.calibration.fit.AT_MEAN`)."""
    plan, step = spec["plan"], spec["step"]
    fn = build([step.kernel])[step.kernel.name]
    runner = PlanRunner(
        plan, rank, {step.kernel.name: CpuKernel(fn)}, CpuBackend().groups(plan.stages)
    )
    shm = (
        CpuBackend(comm="shm").communicator(comm.Group.world(), NO_STREAMS)
        if spec.get("shm")
        else None
    )
    benches = (
        communication(rank, world, spec)
        + kernels(plan, step, fn, runner, spec)
        + library_steps(rank, world, spec, CpuBackend())
        + matmuls(spec)
        + sequences(plan, step, fn, runner, spec)
        + overlap(spec, runner, step)
        + (shm_collectives(world, spec, shm) if shm is not None else [])
    )
    times = in_streams_spell(benches, interleaved(benches, spec["rounds"], spec["warmup"], rank))
    by_themselves = alone(world, spec) if world > 1 and spec.get("alone_sizes") else []
    if by_themselves:  # in rounds of their own
        times += interleaved(by_themselves, spec["rounds"], spec["warmup"], rank, seed=1)
    return [
        {
            "kind": kind,
            "nbytes": b.sizes.get(kind, b.nbytes),
            "time_ms": statistics.median(ts),
            "time_ms_min": min(ts),
            "time_ms_max": max(ts),
            "time_ms_mean": statistics.fmean(ts),
            "world_size": world,
            "rounds": len(ts),
            **b.extra,
        }
        for b, got in zip(benches + by_themselves, times)
        for kind, ts in zip(b.kinds, got)
    ]


def in_streams_spell(benches: list[Bench], times: list) -> list:
    """The `library_<routine>` benches' rounds, each put in the memory spell of the median
    round of `kernel_stream` (its largest size): a round's library time x that bench's median
    over rounds / its time in the same round. A shared machine's memory rate moves by 1.5x
    between spells of seconds to minutes; a run compares its baseline's optimizer step with
    these times to scale the streaming rate (`experiments.predict.memory_scale`), so the two
    must come from one spell, and a few rounds' medians of each, taken alone, can come from
    two. Unchanged without kernel_stream."""
    stream = [i for i, b in enumerate(benches) if b.kinds == ("kernel_stream",)]
    if not stream:
        return times
    ref = times[max(stream, key=lambda i: benches[i].nbytes)][0]
    mid = statistics.median(ref)
    return [
        [[t * mid / r for t, r in zip(ts, ref)] for ts in got]
        if b.kinds[0].startswith(LIBRARY)
        else got
        for b, got in zip(benches, times)
    ]


def interleaved(
    benches: list[Bench], rounds: int, warmup: int, rank: int, seed: int = 0
) -> list[list[list[float]]]:
    """Per bench, per kind of it, one sample per round: warm-up (each bench `warmup` times, the last
    one's slowest-rank time sets how many calls make a sample of a short bench, as
    `experiments.rounds` does, and never fewer than the bench's `min_calls`), then `rounds`
    rounds, each running every bench once (one untimed `sample(1)` before each timed sample of a
    bench whose warm-up took under LONG_CALL_MS, as `experiments.rounds` does: `needs_untimed`)
    in a fresh random order
    (`numpy.random.default_rng([seed, round])`: the same on every rank), the round's times the
    slowest rank's (one all_reduce MAX), so drifts of a shared machine reach every benchmark
    alike and benchmarks compared with each other are compared round by round."""
    warm = torch.zeros(len(benches), dtype=torch.float64)
    for _ in range(max(1, warmup)):
        for i, b in enumerate(benches):
            warm[i] = b.sample(1)[0]
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    calls = [
        max(b.min_calls, calls_for(float(w))) if b.repeatable else 1 for b, w in zip(benches, warm)
    ]
    untimed = [needs_untimed(float(w)) for w in warm]
    slots, width = [], 0
    for b in benches:
        slots.append(width)
        width += len(b.kinds)
    times = [[[] for _ in b.kinds] for b in benches]
    bar = Progress([1] * rounds, label="calibrate")
    for r in range(rounds):
        vec = torch.zeros(width, dtype=torch.float64)
        for i in np.random.default_rng([seed, r]).permutation(len(benches)):
            if untimed[i]:  # a sample never takes the first call (as the rounds')
                benches[i].sample(1)
            vec[slots[i] : slots[i] + len(benches[i].kinds)] = torch.tensor(
                benches[i].sample(calls[i]), dtype=torch.float64
            )
        dist.all_reduce(vec, op=dist.ReduceOp.MAX)
        for i, b in enumerate(benches):
            for j in range(len(b.kinds)):
                times[i][j].append(float(vec[slots[i] + j]))
        line = bar.step(f"round {r + 1} of {rounds} over {len(benches)} benchmarks")
        if rank == 0:
            log.info(line)
    return times


def measure(settings) -> list[dict]:
    """Run the microbenchmarks, fit the local topology, write topology.yaml (and the raw
    measurements, calibration.json) into the run directory; return the measured rows."""
    P, out_dir = settings.world_size, Path(settings.csv_path).parent
    szs, ksz = sizes(settings.scale), sizes(settings.scale, KERNEL_SCALES)
    plan, step = _adam_kernel(max(ksz) * P, P)
    log.info("building the Adam kernel ...")
    build([step.kernel])  # compiled once here; the ranks load it from the cache
    small = settings.scale == "smoke"
    spec = {
        "sizes": szs,
        "kernel_elements": ksz,
        "rounds": ROUNDS[settings.scale] * max(3, settings.repeats),
        "sequence_elements": sizes(settings.scale, SEQUENCE_SCALES),
        "alone_sizes": sizes(settings.scale, ALONE_SCALES),
        "library_elements": sizes(settings.scale, LIBRARY_SCALES),
        "stream_elements": [n for n in sizes(settings.scale, STREAM_SCALES) if n < max(ksz)],
        "stream_buffer": min(max(ksz), STREAM_BUFFER),
        "warmup": max(1, settings.warmup),
        "plan": plan,
        "step": step,
        "shm": settings.comm == "shm",
        "matmuls": MATMULS["smoke" if small else settings.scale],
        "overlap_exchange": 1 << (20 if small else 26),
        "overlap_kernel": 1 << (16 if small else 24),
    }
    start = time.perf_counter()
    raw = run_ranks(
        rank_main,
        P,
        args=(spec,),
        timeout_s=settings.timeout_s,
        collective_timeout_s=settings.collective_timeout_s,
    )[0]
    took = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CALIBRATION).write_text(json.dumps(raw, indent=1))
    measurements, pooled_with = with_history(raw, settings, out_dir)
    source = (
        f"calibrated by experiment=calibrate on {platform.node()} ({P} ranks, "
        f"{settings.scale} scale, {time.strftime('%Y-%m-%d %H:%M')}{pooled_with})"
    )
    topo = fit(measurements, load_topology("local"), P, source=source, cores=cpu_cores())
    path = dump_topology(
        topo,
        out_dir / TOPOLOGY,
        header=source + "\nUse it with: python -m "
        f"suite experiment=... topology=local topology.path={out_dir / TOPOLOGY}",
    )
    log.info(
        f"calibration: {len(raw)} measurements on {P} ranks in {took:.0f} s; fitted topology "
        f"written to {path}"
    )
    log.info(describe(topo))
    if spec["shm"]:
        shm = fit_shm(measurements, topo, P, source=source + ", comm=shm")
        path = dump_topology(
            shm,
            out_dir / TOPOLOGY_SHM,
            header=shm.source + "\nUse it with: "
            f"python -m suite experiment=... comm=shm topology=local "
            f"topology.path={out_dir / TOPOLOGY_SHM}",
        )
        log.info(f"comm=shm: fitted topology written to {path}\n{describe(shm)}")
    rows = [_row(m, "measured", "cpu", m["time_ms"]) for m in raw if m["kind"] not in DERIVED]
    for r in rows:
        append_row(settings.csv_path, r)
    return rows


def with_history(raw: list[dict], settings, out_dir: Path) -> tuple[list[dict], str]:
    """The measurements the fit reads, and how the topology's source names them: this
    calibration's own (`raw`), or, with `settings.calibration_history`, pooled with the
    `calibration_pool - 1` latest calibrations kept there of the same scale and ranks
    (`experiments.calibration.history`; per benchmark the median over them,
    `experiments.calibration.fit.pool`, written to calibration_pooled.json). This calibration is
    kept there too, for the next (where it cannot be written, the run says so and goes on)."""
    history = settings.calibration_history
    if history is None:
        return raw, ""
    used = pooled(
        Path(history), raw, settings.scale, settings.world_size, max(1, settings.calibration_pool)
    )
    try:
        kept_as = str(keep(Path(history), raw, settings.scale, settings.world_size))
    except OSError as e:  # the fit does not need it: say so, and go on
        kept_as = f"no history (not kept: {e})"
    log.info(
        f"calibration kept in {kept_as}; the fit pools {len(used)} calibration"
        f"{'s' if len(used) > 1 else ''} of this machine (calibration_pool="
        f"{settings.calibration_pool}): {', '.join(name for name, _ in used)}"
    )
    if len(used) == 1:
        return raw, ""
    measurements = pool([m for _, m in used])
    (out_dir / POOLED).write_text(json.dumps(measurements, indent=1))
    return (
        measurements,
        f"; per benchmark the median of {len(used)} calibrations: this one "
        f"and {len(used) - 1} earlier of this machine",
    )


def predict(settings) -> list[dict]:
    """Every measured benchmark predicted by the fitted topology (the calibration's own check),
    its links for a lone call's median (`Topology.lone`), as the rows measure."""
    out_dir = Path(settings.out_dir)
    if not (out_dir / CALIBRATION).exists():
        return []
    raw = json.loads((out_dir / CALIBRATION).read_text())
    topo = load_topology(path=out_dir / TOPOLOGY)
    shm = load_topology(path=out_dir / TOPOLOGY_SHM) if (out_dir / TOPOLOGY_SHM).exists() else None

    def on_shm(kind):
        return shm is not None and (kind.startswith(SHM) or kind == "kernel_stream")

    return [
        _row(
            m,
            "predicted",
            "sim",
            predict_ms((shm if on_shm(m["kind"]) else topo).lone(), Measurement.of(m)),
        )
        for m in raw
        if (shm is not None or not m["kind"].startswith(SHM)) and m["kind"] not in DERIVED
    ]


def _row(m: dict, source: str, backend: str, time_ms: float) -> dict:
    row = {
        "experiment": NAME,
        "schedule": m["kind"],
        "source": source,
        "backend": backend,
        "topology": "local",
        "world_size": m["world_size"],
        "size": m["nbytes"],
        "shape": f"{m['nbytes']} B",
        "dtype": "f32",
        "time_ms": round(time_ms, 6),
    }
    if source == "measured":
        row.update(
            time_ms_min=round(m["time_ms_min"], 6),
            time_ms_max=round(m["time_ms_max"], 6),
            verified=True,
        )
    return row


def describe(topo) -> str:
    d, link, lib = topo.device, topo.intra.link, topo.library

    def lone(k) -> str:  # links at the means (a step's), and at the medians (`Topology.lone`)
        return (
            f"; a lone call's (medians) {k.bandwidth_gbps:.2f} GB/s, latency {k.latency_us:.0f} us"
            if k is not None
            else ""
        )

    return (
        f"  device: memory {d.memory_bandwidth_gbps:.1f} GB/s (best), launch "
        f"{d.launch_us:.0f} us, streaming {d.stream_memory_gbps:.1f} GB/s (a kernel in a "
        f"step), matmul f32 {d.peak('f32') * 1e3:.0f} GFLOP/s\n"
        f"  ring send/recv: {link.bandwidth_gbps:.2f} GB/s, overhead {link.overhead_us:.0f} us"
        f" per message, latency {link.latency_us:.0f} us (small messages)"
        f"{lone(topo.lone_link)}\n"
        f"  gloo all_reduce: {lib.bandwidth_gbps:.2f} GB/s, latency {lib.latency_us:.0f} us"
        f"{lone(topo.lone_library)}\n"
        f"{_one_way(topo, lone)}"
        f"  overlap: compute slowdown u = {topo.compute_slowdown:.2f}, communication slowdown"
        f" v = {topo.comm_slowdown:.2f}\n"
        f"  a step beyond its operations: {_by_size(topo)}{_per_core(topo)}\n"
        f"  a thread blocked on a chunk in flight runs {topo.wake_us / 1e3:.2f} ms after it "
        f"lands\n"
        f"  a collective among collectives only takes x{topo.alone_scale:.2f} its time among "
        "the other benchmarks"
    )


def _one_way(topo, lone) -> str:
    """The line of the one-way messages' link (`Topology.p2p_link`), where fitted."""
    k = topo.p2p_link
    return (
        f"  one-way send (a pipeline's P2P): {k.bandwidth_gbps:.2f} GB/s, latency "
        f"{k.latency_us:.0f} us{lone(topo.lone_p2p_link)}\n"
        if k is not None
        else ""
    )


def _per_core(topo) -> str:
    return (
        f" (at one rank a core; a plan of more ranks than the {topo.cores} cores pays it x "
        "ranks / cores)"
        if topo.cores
        else ""
    )


def _by_size(topo) -> str:
    """The step overhead by its largest transfer's size, or the one figure of an older fit."""
    if not topo.step_overhead_by_bytes:
        return f"{topo.step_overhead_us / 1e3:.2f} ms"
    size = lambda b: f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"  # noqa: E731
    return ", ".join(
        f"{us / 1e3:.2f} ms at {size(b)}" for b, us in sorted(topo.step_overhead_by_bytes.items())
    )


EXPERIMENT = register(
    MeasurementExperiment(
        name=NAME,
        figure="none (fits the cost model's local topology)",
        measure=measure,
        predict=predict,
        fits_topology=True,
        needs_measurement=True,
    )
)
