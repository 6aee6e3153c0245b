"""Collectives as an experiment: nccl-tests-style bandwidth of all_reduce, reduce_scatter and
all_gather, predicted on any topology and measured on local ranks.

    python -m suite experiment=collectives backend=sim topology=dgx_a100
    python -m suite experiment=collectives backend=sim topology=dgx2 topology.nodes=1
    python -m suite experiment=collectives            # measured on local ranks, and predicted

Sizes are whole messages in bytes as nccl-tests counts them (reduce_scatter: the input of every
rank; all_gather: the output), f32, powers of two from 1 KiB to 1 GiB (measured: up to the
scale's max_elements x 4 bytes; smoke: every fourth power). Rows: `schedule` = the collective,
`size` = bytes, `time_ms`, `algbw_gbps` = bytes / time, `busbw_gbps` = algbw x the nccl-tests
factor (all_reduce 2(P-1)/P, reduce_scatter and all_gather (P-1)/P), in GB/s (1e9 bytes/s).
Measured: the run's backend's communicator (cpu: `comm.all_reduce`, gloo's, and the rings over
send/recv for reduce_scatter and all_gather; cuda: NCCL's), with the backend's clock, in
interleaved rounds (`experiments.rounds`). One transport: every (collective, size) one function
of one set of rounds, each sample the median of its calls, each after a barrier (the
slowest rank's), as `experiments.calibration.measure` samples the same calls to fit the model and the
experiments sample their steps, until every
time's 95% interval is within +-scale.ci_pct% or scale.budget_s runs out, and
scale.long_budget_s where it has fewer than scale.long_rounds rounds by then (rows: `time_ms` the
median over rounds, `time_ms_lo/hi` its interval, `rounds`, `stopped`); with comm=shm, gloo and shared memory in the
same run, each (size, collective) timed in its own rounds (at most min(scale.budget_s,
POINT_BUDGET_S) s per point), rows naming the transport in `comm`, a shm row's `speedup`
(`speedup_lo/hi`: its 95% interval) gloo's time over its own, paired per round. Each result
checked (every rank gives its rank + 1, so every reduced element is P(P+1)/2). Predicted: the
collective alone in the DES (`cost_model.workload.simulate_collective`, the tuner's algorithm;
the library's for the kinds the runtime leaves to it), on all the topology's devices (local:
world_size ranks; a calibrated topology's time times its `alone_scale`), with the algorithm
and protocol in `algo` and `proto` (protocol: NCCL's, on
GPU topologies).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

from codegen.runtime import backend as backends
from codegen.runtime.launch import run_ranks
from cost_model.closed_collectives import choose
from cost_model.collectives import CollSpec, nccl_call, uses_nccl
from cost_model.topology import load_topology
from cost_model.workload import simulate_collective
from reports.results import append_row

from .kinds import MeasurementExperiment
from .registry import register
from .rounds import Budget, interleave

log = logging.getLogger(__name__)

NAME = "collectives"
POINT_BUDGET_S = 5.0  # interleaved rounds (several transports): at most this long per point
KINDS = ("all_reduce", "reduce_scatter", "all_gather")
FACTOR = {
    "all_reduce": lambda P: 2 * (P - 1) / P,
    "reduce_scatter": lambda P: (P - 1) / P,
    "all_gather": lambda P: (P - 1) / P,
}


def sizes(scale: str, max_bytes: int = 1 << 30) -> list[int]:
    step = 4 if scale == "smoke" else 1
    return [1 << k for k in range(10, 31, step) if 1 << k <= max_bytes]


def row(
    kind: str,
    nbytes: int,
    time_ms: float,
    P: int,
    source: str,
    backend: str,
    topology: str,
    **extra,
) -> dict:
    algbw = nbytes / (time_ms * 1e-3) / 1e9 if time_ms > 0 else 0.0
    return {
        "experiment": NAME,
        "schedule": kind,
        "source": source,
        "backend": backend,
        "topology": topology,
        "world_size": P,
        "size": nbytes,
        "shape": f"[{nbytes // 4}]",
        "dtype": "f32",
        "time_ms": round(time_ms, 6),
        "algbw_gbps": round(algbw, 4),
        "busbw_gbps": round(algbw * FACTOR[kind](P), 4),
        **extra,
    }


def predict_rows(topo, world_size: int, scale: str, max_bytes: int = 1 << 30) -> list[dict]:
    """Every collective at every size, simulated alone on `world_size` ranks of `topo` (its
    links for a lone call's median, `Topology.lone`, as the rows measure), times the topology's
    `alone_scale` (a calibrated one's: these collectives are timed among collectives only, the
    links were fitted among calibration's other benchmarks; 1 elsewhere)."""
    rows, topo = [], topo.lone()
    group = tuple(range(world_size))
    for kind in KINDS:
        for b in sizes(scale, max_bytes):
            spec = CollSpec(kind, b, group, 1, kind in topo.library_kinds)
            algo = choose(spec, topo)
            r = simulate_collective(spec, topo, algo)
            proto = nccl_call(spec, topo, algo).proto if uses_nccl(spec, topo) else ""
            rows.append(
                row(
                    kind,
                    b,
                    r.time_ms * topo.alone_scale,
                    world_size,
                    "predicted",
                    "sim",
                    topo.name,
                    algo=algo,
                    proto=proto,
                )
            )
    return rows


def table(measured: list[dict], predicted: list[dict] = ()) -> str:
    """busbw per size, one column per (collective, source)."""
    rows = list(measured) + list(predicted)

    def src(r) -> str:  # measured rows of several transports: one column each
        return r["source"] + (f"/{r['comm']}" if isinstance(r.get("comm"), str) else "")

    cols = sorted({(r["schedule"], src(r)) for r in rows}, key=lambda c: (KINDS.index(c[0]), c[1]))
    by = {(r["schedule"], src(r), r["size"]): r for r in rows}
    head = f"{'bytes':>12} " + " ".join(f"{k[:14] + ' ' + s[:13]:>28}" for k, s in cols)
    lines = [head + "   (busbw GB/s)"]
    for b in sorted({r["size"] for r in rows}):
        cells = [
            f"{by[(k, s, b)]['busbw_gbps']:28.3f}" if (k, s, b) in by else f"{'':>28}"
            for k, s in cols
        ]
        lines.append(f"{b:>12} " + " ".join(cells))
    return "\n".join(lines)


# -- measured on local ranks --------------------------------------------------------------------
def rank_main(
    rank: int,
    world: int,
    szs: list[int],
    warmup: int,
    repeats: int,
    backend_name: str = "cpu",
    comms: tuple = (None,),
    budget: Optional[Budget] = None,
    seed: int = 0,
) -> list[dict]:
    """Every collective at every size through the backend's communicator for each transport in
    `comms` (None: the backend's default; cpu: the rings over gloo; cuda: NCCL), timed with the
    backend's clock in interleaved rounds (`experiments.rounds.interleave` with `budget`); rows
    name the transport in `comm`. One transport: every (collective, size) one function of the
    same rounds, as `experiments.calibration.measure` times the same calls (so the model it fits is
    compared with these on equal terms). Several (comm=shm: gloo, then shm): each (size,
    collective) its own rounds, the first transport the reference whose paired per-round time
    ratio over each other's is that one's `speedup` (with its 95% interval); the reference's own
    rows have speedup 1."""
    budget = budget or Budget(warmup=warmup)
    szs = [b for b in szs if (b // 4) % world == 0]
    targets = _transports(backend_name, comms)
    if len(targets) == 1:
        return _one_transport(targets[0], szs, rank, world, budget, seed)
    return _transports_paired(targets, szs, rank, world, budget, seed)


def _transports(backend_name: str, comms: tuple) -> list[tuple]:
    """(label, backend, the world's communicator) per transport; gloo's rings and gloo's own
    calls are both labelled gloo."""
    targets = []
    for comm in comms:
        backend = backends.get(backend_name, **({"comm": comm} if comm else {}))
        label = "gloo" if comm in ("ring", "library") else comm or "default"
        targets.append(
            (label, backend, backend.communicator(backend.groups().world, backends.NO_STREAMS))
        )
    return targets


def _one_transport(target: tuple, szs: list[int], rank, world, budget, seed) -> list[dict]:
    """Every (collective, size) one function of the same interleaved rounds."""
    label, backend, c = target
    top = max(szs, default=0) // 4  # every size's buffers: views of one pair of the largest
    full_ = backend.buffer((top,), torch.float32)
    part_ = backend.buffer((top // world,), torch.float32)
    fns, ok = {}, {}
    for b in szs:
        full, part = full_[: b // 4], part_[: b // 4 // world]
        for kind in KINDS:
            fns[(kind, b)] = _op(kind, c, full, part)
            ok[(kind, b)] = _check(kind, fns[(kind, b)], full, part, rank, world)
    rounds = interleave(
        {f"{k} {b}": f for (k, b), f in fns.items()},
        budget,
        key=(seed, NAME),
        clock=backend.clock(),
        baseline=None,
    )
    return [
        _row(kind, b, f"{kind} {b}", rounds, world, backend, ok[(kind, b)], label)
        for kind, b in fns
    ]


def _transports_paired(targets: list, szs: list[int], rank, world, budget, seed) -> list[dict]:
    """Each (size, collective) in rounds of its own over every transport, the first the
    reference the others' speedups are paired with."""
    backend = targets[0][1]
    clock, ref, out = backend.clock(), targets[0][0], []
    for b in szs:
        full = backend.buffer((b // 4,), torch.float32)  # shared by the transports, used in turn
        part = backend.buffer((b // 4 // world,), torch.float32)
        for kind in KINDS:
            ops = {label: _op(kind, c, full, part) for label, _, c in targets}
            ok = {label: _check(kind, ops[label], full, part, rank, world) for label in ops}
            fns = {("baseline" if label == ref else label): op for label, op in ops.items()}
            rounds = interleave(fns, budget, key=(seed, kind, b), clock=clock)
            for label in ops:
                name = "baseline" if label == ref else label
                out.append(_row(kind, b, name, rounds, world, backend, ok[label], label, True))
    return out


def _row(kind, b, name, rounds, world, backend, verified, label, paired=False) -> dict:
    """One measured row of `name` in `rounds`; `paired`: with its speedup over the reference."""
    t, ts = rounds.time(name), rounds.times_ms[name]
    speedup = {}
    if paired:
        x = rounds.speedup(name)
        speedup = {
            "speedup": round(x.median, 4),
            "speedup_lo": round(x.lo, 4),
            "speedup_hi": round(x.hi, 4),
        }
    return row(
        kind,
        b,
        t.median,
        world,
        "measured",
        backend.name,
        "local",
        time_ms_min=round(min(ts), 6),
        time_ms_max=round(max(ts), 6),
        time_ms_lo=round(t.lo, 6),
        time_ms_hi=round(t.hi, 6),
        **speedup,
        rounds=rounds.rounds,
        stopped=rounds.stopped,
        verified=verified,
        comm=label,
    )


def _op(kind: str, c, full, part) -> Callable[[], None]:
    return {
        "all_reduce": lambda: c.all_reduce(full, "sum"),
        "reduce_scatter": lambda: c.reduce_scatter(full, part, "sum"),
        "all_gather": lambda: c.all_gather(part, full),
    }[kind]


def _check(kind: str, op, full, part, rank: int, world: int) -> bool:
    """One call on inputs rank + 1 everywhere: reduced elements P(P+1)/2, gathered blocks i+1."""
    full.fill_(rank + 1)
    part.fill_(rank + 1)
    op()
    if kind == "all_gather":
        return bool(
            (
                full.view(world, -1) == torch.arange(1, world + 1, device=full.device).view(-1, 1)
            ).all()
        )
    got = full if kind == "all_reduce" else part
    return bool((got == world * (world + 1) / 2).all())


def sweep_budget(settings, transports: int) -> Budget:
    """The rounds' budget of a measured sweep. One transport: the whole sweep in one set of
    rounds, the scale's budget for a point and its long-step extension (scale.long_rounds,
    long_budget_s): a round of every size up to 128 MiB takes 1.5-2 s, so budget_s alone stopped
    the default sweep at 10-13 rounds, where a small collective's median flips between gloo's
    two modes from run to run (the time error's largest 55-66% in three paper runs on the Intel
    VM); with the extension it takes 55 (41.9-49.6% in three runs). Several transports
    (comm=shm): each (size, collective) its own rounds, at most POINT_BUDGET_S, no extension."""
    one = transports == 1
    return Budget(
        warmup=settings.warmup,
        min_rounds=settings.min_rounds,
        max_rounds=max(settings.min_rounds, settings.max_rounds),
        budget_s=(settings.point_budget_s if one else min(settings.point_budget_s, POINT_BUDGET_S)),
        ci_pct=settings.ci_pct,
        long_rounds=settings.long_rounds if one else 0,
        long_budget_s=settings.long_budget_s if one else 0.0,
    )


def measure(settings) -> list[dict]:
    szs = sizes(settings.scale, settings.max_elements * 4)
    start = time.perf_counter()
    # comm=shm: gloo and shared memory side by side, in one run, in interleaved rounds
    comms = ("ring", settings.comm) if settings.comm == "shm" else (settings.comm,)
    budget = sweep_budget(settings, len(comms))
    rows = run_ranks(
        rank_main,
        settings.world_size,
        args=(
            szs,
            settings.warmup,
            settings.repeats,
            settings.backend,
            comms,
            budget,
            settings.seed,
        ),
        timeout_s=settings.timeout_s,
        collective_timeout_s=settings.collective_timeout_s,
    )[0]
    for r in rows:
        append_row(settings.csv_path, r)
    log.info(
        f"measured {len(rows)} points on {settings.world_size} ranks in "
        f"{time.perf_counter() - start:.0f} s"
    )
    return rows


def predict(settings) -> list[dict]:
    """backend=sim: the chosen topology, all its devices (local: world_size ranks), 1 KiB to 1 GiB;
    backend=cpu: the local topology at the measured world size and sizes, beside the measurements;
    a shared-memory topology's rows name it in `comm` ("shm"); with comm=shm and a
    `gloo_topology` (the same calibration's gloo one) gloo's rows too ("gloo"), as the two were
    measured side by side; backend=cuda, none: the local topology models CPU ranks, and no
    calibrated topology of the GPU at hand exists to set NCCL's times beside (as
    `experiments.predict` leaves GPU measurements unpredicted)."""
    topo = settings.topology
    if settings.backend == "sim":
        world = settings.world_size if topo.name == "local" else topo.devices
        return predict_rows(topo, world, settings.scale)
    if settings.backend != "cpu":
        return []
    local = topo if topo.name == "local" else load_topology("local")
    rows = predict_rows(local, settings.world_size, settings.scale, settings.max_elements * 4)
    if local.peer_reads:  # a shared-memory topology: its rows are shm's (topology.path=FILE too)
        rows = [dict(r, comm="shm") for r in rows]
    if settings.gloo_topology is None:
        return rows
    return rows + [
        dict(r, comm="gloo")
        for r in predict_rows(
            settings.gloo_topology, settings.world_size, settings.scale, settings.max_elements * 4
        )
    ]


EXPERIMENT = register(
    MeasurementExperiment(
        name=NAME,
        figure="nccl-tests bandwidth (no paper figure)",
        measure=measure,
        predict=predict,
        summary=table,
    )
)
