"""Calibration: microbenchmarks of the runtime on local ranks, fitted into the `local` topology.

    python -m suite experiment=calibrate [world_size=2] [scale=smoke|default]

Every rank runs the same operations side by side with the runtime every experiment uses
(`codegen.runtime.comm` over gloo, kernels from `codegen.build`); each timing is `time_ranks`'s
(a barrier before each repeat, the slowest rank's time, the median over repeats). Sizes are in
bytes (f32 buffers), powers of two up to the scale's largest:
- `exchange`: a ring step: every rank sends b bytes to its right and receives b from its left
  (`comm.P2P`, what the runtime's ring reduce-scatter and all-gather are made of);
  `exchange_chunked`: the same in 16 chunks (the per-message cost, from b = 64 KiB);
- `send`: rank 0 sends b bytes to rank 1, the others idle (a pipeline's P2P);
- `all_reduce`: gloo's all-reduce of b bytes (`comm.all_reduce`, the AR-C schedules' and the
  baselines'); `reduce_scatter`, `all_gather`: the runtime's rings (`comm.reduce_scatter`,
  `comm.all_gather`, b = the whole array), checked against the model, not fitted;
- `kernel`: the generated kernel of the lowered Adam program over 2^k elements (b = 28 bytes of
  traffic per element), its buffers allocated at that size as a plan's are, on every rank;
  `add` / `copy`: torch's in-place add and copy of b bytes (a ring's reduction, an all-gather's
  own-block copy); `matmul`: torch.matmul of [m, m] x [m, m] f32 (b = its bytes);
- `sequence`: a step's two operations back to back, no barrier between (gloo's all-reduce of b
  bytes, then the generated Adam kernel on b / 4 elements), interleaved repeat by repeat with
  `sequence_comm` and `sequence_compute` (each alone): what a step costs beyond its parts;
- `shm_all_reduce`, `shm_reduce_scatter`, `shm_all_gather` (with comm=shm): the same collectives
  over shared memory (`codegen.runtime.shm_comm`), fitted into a second topology,
  `topology_shm.yaml` (`cost_model.calibration.fit_shm`), the one comm=shm's runs predict with;
- `overlap_compute`: the kernel while a large exchange is in flight (compute slowdown);
  `overlap_comm`: an exchange while kernels run on every rank (communication slowdown).

The baselines' library computation (torch's fused Adam, ...) is not benchmarked here: every run
times its own baseline and the cost model takes that time (`experiments.predict`).

Everything runs in `ROUNDS` passes over the whole list (3 at default scale, about a minute),
each benchmark's times pooled over the passes, so that a shared machine's drifts reach every
benchmark alike. The fit (`cost_model.calibration.fit`, which only sees the measurements as data) is written to
`topology.yaml` in the run directory (use it with `topology=local topology.path=FILE`), the raw
measurements to `calibration.json`, and measured and predicted rows of every benchmark to
results.csv (`schedule` = the benchmark, `size` = bytes).
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import torch

import torch.distributed as dist

from codegen.build import build
from codegen.lower import lower
from codegen.plan import Compute
from codegen.runtime import comm
from codegen.runtime.backend import NO_STREAMS, CpuBackend, CpuKernel
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import run_ranks
from codegen.runtime.measure import time_ranks
from cost_model.calibration import SHM, Measurement, fit, fit_shm, predict_ms
from cost_model.topology import dump_topology, load_topology
from reports.progress import Progress
from reports.table import append_row

from .api import Experiment
from .harness import MIN_TIMED_MS, MORE_REPEATS
from .optimizers import adam_program
from .registry import register

NAME = "calibrate"
TOPOLOGY, CALIBRATION = "topology.yaml", "calibration.json"
TOPOLOGY_SHM = "topology_shm.yaml"  # with comm=shm: the shared-memory transport's topology
# scale "quick": the default sizes' range, every other size, one pass: what a run calibrates
# with when none is cached for this machine (suite.calibration), in about 20 s
SCALES = {"smoke": (12, 20, 2), "quick": (12, 26, 2), "default": (12, 27, 1),
          "paper": (12, 27, 1)}
KERNEL_SCALES = {"smoke": (7, 16, 3), "quick": (10, 25, 3), "default": (7, 25, 1),
                 "paper": (7, 25, 1)}  # elements
ROUNDS = {"smoke": 1, "quick": 1, "default": 3, "paper": 3}
KERNEL_BYTES_PER_ELEMENT = 28  # Adam: reads g, w, m, v; writes w, m, v (f32)
EXCHANGE_CHUNKS, CHUNKED_FROM = 16, 1 << 16
SEQUENCE_SCALES = {"smoke": (14, 18, 2), "quick": (19, 23, 2), "default": (19, 23, 1),
                   "paper": (19, 23, 1)}  # elements


def sizes(scale: str, table=SCALES) -> list[int]:
    lo, hi, step = table[scale]
    return [1 << k for k in range(lo, hi + 1, step)]


def _adam_kernel(n_max: int, world: int):
    """The AR-C Compute step of the Adam program lowered at n_max elements, and its plan."""
    plan = lower(adam_program(), {"N": n_max}, world)
    step = next(s for s in plan.steps if isinstance(s, Compute))
    return plan, step


def _kernel_args(plan, step, n: int, runner) -> list:
    """The kernel's buffers for a loop of n elements: tensors of n elements where the plan's
    have the loop's size (the kernel's source does not depend on it), its scalars as they are.
    The tensors hold values in [0.1, 1), written page by page: zeros from calloc would leave
    read-only inputs on the kernel's shared zero page, which reads faster than a step's data
    (the Adam kernel 10-20% at 2^20 elements in a probe)."""
    loop = step.kernel.numel
    return [torch.empty(n, dtype=runner.bufs[i].dtype).uniform_(0.1, 1.0)
            if plan.buffer(i).numel == loop else runner.bufs[i] for i in step.kernel.args()]


def _timed(fn, warmup, repeats, before=None):
    t = time_ranks(fn, warmup, repeats, before=before)
    return t.median_ms, t.min_ms, t.max_ms


def _exchange(comm, x, out, tag=0, chunks=1):
    me, world = dist.get_rank(), dist.get_world_size()
    right, left = (me + 1) % world, (me - 1) % world
    send = comm.P2P(x, None, me, right, chunks=chunks, tag=tag).start()
    recv = comm.P2P(None, out, left, me, chunks=chunks, tag=tag).start()
    return send, recv


def rank_main(rank: int, world: int, spec: dict) -> list[dict]:
    """Every benchmark, in `rounds` passes over the whole list (so that drifts of a shared
    machine reach every benchmark alike); per benchmark the median over all passes' repeats."""
    times: dict[tuple, list[float]] = {}
    extras: dict[tuple, dict] = {}

    def record(kind, nbytes, fn, **extra):
        # cheap ones more repeats against the noise of short timings: 3x at small sizes, and
        # until a pass's repeats take MIN_TIMED_MS (at most MORE_REPEATS x), as measured points
        small = nbytes <= (1 << 21)
        repeats = spec["repeats"] * (3 if small else 1)
        t = time_ranks(fn, spec["warmup"], repeats, min_total_ms=MIN_TIMED_MS,
                       max_repeats=MORE_REPEATS * spec["repeats"])
        times.setdefault((kind, nbytes), []).extend(t.times_ms)
        extras[(kind, nbytes)] = extra

    plan, step = spec["plan"], spec["step"]
    fn = build([step.kernel])[step.kernel.name]
    runner = PlanRunner(plan, rank, {step.kernel.name: CpuKernel(fn)},
                        CpuBackend().groups(plan.stages))
    overlap: dict[str, list[float]] = {}
    shm = (CpuBackend(comm="shm").communicator(comm.Group.world(), NO_STREAMS)
           if spec.get("shm") else None)
    bar = Progress([1] * spec["rounds"], label="calibrate")
    for k in range(spec["rounds"]):
        _communication(rank, world, spec, comm, record)
        if shm is not None:
            _shm_collectives(world, spec, shm, record)
        for n in spec["kernel_elements"]:
            args = _kernel_args(plan, step, n, runner)  # buffers of exactly n elements, as
            record("kernel", n * KERNEL_BYTES_PER_ELEMENT,  # a plan lowered at n has
                   lambda: fn(0, n, 0, args), flops=step.flops * n / step.kernel.numel)
            del args
        for m in spec["matmuls"]:
            a, w = torch.randn(m, m), torch.randn(m, m)
            record("matmul", 3 * m * m * 4, lambda: torch.matmul(a, w), flops=2 * m ** 3)
        for n in spec["sequence_elements"]:
            _sequence(plan, step, fn, runner, comm, n, spec, times, extras)
        for key, v in _overlap(spec, runner, step, comm).items():
            overlap.setdefault(key, []).extend(v)
        line = bar.step(f"pass {k + 1} of {spec['rounds']} over every benchmark")
        if rank == 0:
            print(line, flush=True)
    out = [{"kind": kind, "nbytes": b, "time_ms": statistics.median(ts), "time_ms_min": min(ts),
            "time_ms_max": max(ts), "world_size": world, **extras[(kind, b)]}
           for (kind, b), ts in times.items()]
    E, K = spec["overlap_exchange"], spec["overlap_kernel"] * KERNEL_BYTES_PER_ELEMENT
    return out + [{"kind": f"overlap_{k}", "nbytes": E if k == "exchange" else K,
                   "time_ms": statistics.median(v), "time_ms_min": min(v),
                   "time_ms_max": max(v), "world_size": world, "exchange_bytes": E,
                   "kernel_bytes": K} for k, v in overlap.items()]


def _sequence(plan, step, fn, runner, comm, n, spec, times, extras) -> None:
    """all_reduce(4n bytes) then the kernel on n elements, and each alone, in turns per repeat."""
    x, args = torch.randn(n), _kernel_args(plan, step, n, runner)
    kernel = lambda: fn(0, n, 0, args)  # noqa: E731
    comm_only = lambda: comm.all_reduce(x)  # noqa: E731
    cases = {"sequence": lambda: (comm_only(), kernel()), "sequence_comm": comm_only,
             "sequence_compute": kernel}
    extra = {"kernel_bytes": n * KERNEL_BYTES_PER_ELEMENT, "flops": step.flops * n /
             step.kernel.numel}
    for i in range(spec["warmup"] + 2 * spec["repeats"]):
        for kind, f in cases.items():
            t = time_ranks(f, 0, 1)
            if i >= spec["warmup"]:
                times.setdefault((kind, 4 * n), []).extend(t.times_ms)
                extras[(kind, 4 * n)] = extra


def _communication(rank, world, spec, comm, record) -> None:
    for b in spec["sizes"]:
        n = b // 4
        x, y = torch.randn(n), torch.empty(n)
        record("exchange", b, lambda: [w.wait() for w in _exchange(comm, x, y)])
        if b >= CHUNKED_FROM:
            record("exchange_chunked", b, lambda: [w.wait() for w in _exchange(
                comm, x, y, chunks=EXCHANGE_CHUNKS)], chunks=EXCHANGE_CHUNKS)
        if world > 1:
            def one_way():
                if rank == 0:
                    comm.p2p(x, None, 0, 1)
                elif rank == 1:
                    comm.p2p(None, y, 0, 1)
            record("send", b, one_way)
        record("all_reduce", b, lambda: comm.all_reduce(x))
        if n % world == 0:
            part, whole = torch.empty(n // world), torch.randn(n)
            record("reduce_scatter", b, lambda: comm.reduce_scatter(whole, part))
            record("all_gather", b, lambda: comm.all_gather(part, whole))
        record("add", b, lambda: torch.add(x, y, out=x))
        record("copy", b, lambda: y.copy_(x))


def _shm_collectives(world, spec, c, record) -> None:
    """comm=shm's all_reduce, reduce_scatter and all_gather of b bytes (the whole array)."""
    for b in spec["sizes"]:
        n = b // 4
        if n % world:
            continue
        x, part = torch.randn(n), torch.empty(n // world)
        record("shm_all_reduce", b, lambda: c.all_reduce(x, "sum"))
        record("shm_reduce_scatter", b, lambda: c.reduce_scatter(x, part, "sum"))
        record("shm_all_gather", b, lambda: c.all_gather(part, x))


def _overlap(spec, runner, step, comm) -> dict[str, list[float]]:
    """Alone and together, in turns: a kernel of K elements, an exchange of E bytes, and both
    started at once (the kernel runs while the exchange is in flight): the kernel's time inside,
    and the time until both are done (ms, the slowest rank's, per repeat)."""
    E, K = spec["overlap_exchange"], spec["overlap_kernel"]
    x, y = torch.randn(E // 4), torch.empty(E // 4)
    times = {"kernel": [], "exchange": [], "inside": [], "both": []}
    t = torch.zeros(4, dtype=torch.float64)
    for i in range(spec["warmup"] + spec["repeats"]):
        dist.barrier()
        t0 = time.perf_counter()
        runner.compute(step, 0, K)
        t[0] = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        for w in _exchange(comm, x, y, tag=1):
            w.wait()
        t[1] = time.perf_counter() - t0
        dist.barrier()
        t0 = time.perf_counter()
        works = _exchange(comm, x, y, tag=2)
        t1 = time.perf_counter()
        runner.compute(step, 0, K)
        t[2] = time.perf_counter() - t1
        for w in works:
            w.wait()
        t[3] = time.perf_counter() - t0
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i >= spec["warmup"]:
            for k, v in zip(times, t.tolist()):
                times[k].append(v * 1e3)
    return times


def measure(settings) -> list[dict]:
    """Run the microbenchmarks, fit the local topology, write topology.yaml (and the raw
    measurements, calibration.json) into the run directory; return the measured rows."""
    P, out_dir = settings.world_size, Path(settings.csv_path).parent
    szs, ksz = sizes(settings.scale), sizes(settings.scale, KERNEL_SCALES)
    plan, step = _adam_kernel(max(ksz) * P, P)
    print("building the Adam kernel ...", flush=True)
    build([step.kernel])  # compiled once here; the ranks load it from the cache
    small = settings.scale == "smoke"
    spec = {"sizes": szs, "kernel_elements": ksz, "rounds": ROUNDS[settings.scale],
            "sequence_elements": sizes(settings.scale, SEQUENCE_SCALES),
            "warmup": max(1, settings.warmup),
            "repeats": max(3, settings.repeats), "plan": plan, "step": step,
            "matmuls": [128, 256] if small else [256, 512, 1024],
            "shm": settings.comm == "shm",
            "overlap_exchange": 1 << (20 if small else 26), "overlap_kernel": 1 << (16 if small
                                                                                 else 24)}
    start = time.perf_counter()
    raw = run_ranks(rank_main, P, args=(spec,), timeout_s=settings.timeout_s)[0]
    took = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CALIBRATION).write_text(json.dumps(raw, indent=1))
    source = (f"calibrated by experiment=calibrate on {platform.node()} ({P} ranks, "
              f"{settings.scale} scale, {time.strftime('%Y-%m-%d %H:%M')})")
    topo = fit(raw, load_topology("local"), P, source=source)
    path = dump_topology(topo, out_dir / TOPOLOGY, header=source + "\nUse it with: python -m "
                         f"suite experiment=... topology=local topology.path={out_dir / TOPOLOGY}")
    print(f"calibration: {len(raw)} measurements on {P} ranks in {took:.0f} s; fitted topology "
          f"written to {path}", flush=True)
    print(describe(topo), flush=True)
    if spec["shm"]:
        shm = fit_shm(raw, topo, P, source=source + ", comm=shm")
        path = dump_topology(shm, out_dir / TOPOLOGY_SHM, header=shm.source + "\nUse it with: "
                             f"python -m suite experiment=... comm=shm topology=local "
                             f"topology.path={out_dir / TOPOLOGY_SHM}")
        print(f"comm=shm: fitted topology written to {path}\n{describe(shm)}", flush=True)
    rows = [_row(m, "measured", "cpu", m["time_ms"]) for m in raw]
    for r in rows:
        append_row(settings.csv_path, r)
    return rows


def predict(settings) -> list[dict]:
    """Every measured benchmark predicted by the fitted topology (the calibration's own check)."""
    out_dir = Path(settings.out_dir)
    if not (out_dir / CALIBRATION).exists():
        return []
    raw = json.loads((out_dir / CALIBRATION).read_text())
    topo = load_topology(path=out_dir / TOPOLOGY)
    shm = load_topology(path=out_dir / TOPOLOGY_SHM) if (out_dir / TOPOLOGY_SHM).exists() else None
    return [_row(m, "predicted", "sim", predict_ms(shm if m["kind"].startswith(SHM) else topo,
                                                   Measurement.of(m)))
            for m in raw if shm is not None or not m["kind"].startswith(SHM)]


def _row(m: dict, source: str, backend: str, time_ms: float) -> dict:
    row = {"experiment": NAME, "schedule": m["kind"], "source": source, "backend": backend,
           "topology": "local", "world_size": m["world_size"], "size": m["nbytes"],
           "shape": f"{m['nbytes']} B", "dtype": "f32", "time_ms": round(time_ms, 6)}
    if source == "measured":
        row.update(time_ms_min=round(m["time_ms_min"], 6), time_ms_max=round(m["time_ms_max"], 6),
                   verified=True)
    return row


def describe(topo) -> str:
    d, link, lib = topo.device, topo.intra.link, topo.library
    return (f"  device: memory {d.memory_bandwidth_gbps:.1f} GB/s (best), launch "
            f"{d.launch_us:.0f} us, matmul f32 {d.peak('f32') * 1e3:.0f} GFLOP/s\n"
            f"  ring send/recv: {link.bandwidth_gbps:.2f} GB/s, overhead {link.overhead_us:.0f} us"
            f" per message, latency {link.latency_us:.0f} us (small messages)\n"
            f"  gloo all_reduce: {lib.bandwidth_gbps:.2f} GB/s, latency {lib.latency_us:.0f} us\n"
            f"  overlap: compute slowdown u = {topo.compute_slowdown:.2f}, communication slowdown"
            f" v = {topo.comm_slowdown:.2f}\n"
            f"  a step beyond its operations: {topo.step_overhead_us / 1e3:.2f} ms")


EXPERIMENT = register(Experiment(
    name=NAME, figure="none (fits the cost model's local topology)", measure=measure,
    predict=predict, fits_topology=True, needs_measurement=True))
