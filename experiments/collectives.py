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
Measured: the run's backend's communicator (with backend.comm=shm: shared memory, then gloo in the
same run, side by side; rows name it in `comm`) (cpu: `comm.all_reduce`, gloo's, and the rings over
send/recv for reduce_scatter and all_gather; cuda: NCCL's), timed by `harness.time_point` with the
backend's clock, each result
checked (every rank gives its rank + 1, so every reduced element is P(P+1)/2). Predicted: the
collective alone in the DES (`cost_model.workload.simulate_collective`, the tuner's algorithm;
the library's for the kinds the runtime leaves to it), on all the topology's devices (local:
world_size ranks), with the algorithm and protocol in `algo` and `proto` (protocol: NCCL's, on
GPU topologies).
"""
from __future__ import annotations

import time

import torch

from codegen.runtime import backend as backends
from codegen.runtime.launch import run_ranks
from cost_model.closed_form import choose
from cost_model.collectives import CollSpec, nccl_call, uses_nccl
from cost_model.topology import load_topology
from cost_model.workload import simulate_collective
from reports.table import append_row

from .api import Experiment
from .harness import time_point
from .registry import register

NAME = "collectives"
KINDS = ("all_reduce", "reduce_scatter", "all_gather")
FACTOR = {"all_reduce": lambda P: 2 * (P - 1) / P, "reduce_scatter": lambda P: (P - 1) / P,
          "all_gather": lambda P: (P - 1) / P}


def sizes(scale: str, max_bytes: int = 1 << 30) -> list[int]:
    step = 4 if scale == "smoke" else 1
    return [1 << k for k in range(10, 31, step) if 1 << k <= max_bytes]


def row(kind: str, nbytes: int, time_ms: float, P: int, source: str, backend: str,
        topology: str, **extra) -> dict:
    algbw = nbytes / (time_ms * 1e-3) / 1e9 if time_ms > 0 else 0.0
    return {"experiment": NAME, "schedule": kind, "source": source, "backend": backend,
            "topology": topology, "world_size": P, "size": nbytes, "shape": f"[{nbytes // 4}]",
            "dtype": "f32", "time_ms": round(time_ms, 6), "algbw_gbps": round(algbw, 4),
            "busbw_gbps": round(algbw * FACTOR[kind](P), 4), **extra}


def predict_rows(topo, world_size: int, scale: str, max_bytes: int = 1 << 30) -> list[dict]:
    """Every collective at every size, simulated alone on `world_size` ranks of `topo`."""
    rows = []
    group = tuple(range(world_size))
    for kind in KINDS:
        for b in sizes(scale, max_bytes):
            spec = CollSpec(kind, b, group, 1, kind in topo.library_kinds)
            algo = choose(spec, topo)
            r = simulate_collective(spec, topo, algo)
            proto = nccl_call(spec, topo, algo).proto if uses_nccl(spec, topo) else ""
            rows.append(row(kind, b, r.time_ms, world_size, "predicted", "sim", topo.name,
                            algo=algo, proto=proto))
    return rows


def table(measured: list[dict], predicted: list[dict] = ()) -> str:
    """busbw per size, one column per (collective, source)."""
    rows = list(measured) + list(predicted)

    def src(r) -> str:  # measured rows of several transports: one column each
        return r["source"] + (f"/{r['comm']}" if isinstance(r.get("comm"), str) else "")

    cols = sorted({(r["schedule"], src(r)) for r in rows},
                  key=lambda c: (KINDS.index(c[0]), c[1]))
    by = {(r["schedule"], src(r), r["size"]): r for r in rows}
    head = f"{'bytes':>12} " + " ".join(f"{k[:14] + ' ' + s[:10]:>25}" for k, s in cols)
    lines = [head + "   (busbw GB/s)"]
    for b in sorted({r["size"] for r in rows}):
        cells = [f"{by[(k, s, b)]['busbw_gbps']:25.3f}" if (k, s, b) in by else f"{'':>25}"
                 for k, s in cols]
        lines.append(f"{b:>12} " + " ".join(cells))
    return "\n".join(lines)


# -- measured on local ranks --------------------------------------------------------------------
def rank_main(rank: int, world: int, szs: list[int], warmup: int, repeats: int,
              backend_name: str = "cpu", comms: tuple = (None,)) -> list[dict]:
    """Every collective at every size through the backend's communicator for each transport in
    `comms` (None: the backend's default; cpu: the rings over gloo; cuda: NCCL), timed with the
    backend's clock; rows name the transport in `comm`."""
    out = []
    for comm in comms:
        out += _measure_comm(rank, world, szs, warmup, repeats, backend_name, comm)
    return out


def _measure_comm(rank, world, szs, warmup, repeats, backend_name, comm) -> list[dict]:
    backend = backends.get(backend_name, **({"comm": comm} if comm else {}))
    c = backend.communicator(backend.groups().world, backends.NO_STREAMS)
    label = "gloo" if comm in ("ring", "library") else comm or "default"
    out = []
    for b in szs:
        n = b // 4
        if n % world:
            continue
        full = backend.buffer((n,), torch.float32)
        part = backend.buffer((n // world,), torch.float32)
        ops = {"all_reduce": lambda: c.all_reduce(full, "sum"),
               "reduce_scatter": lambda: c.reduce_scatter(full, part, "sum"),
               "all_gather": lambda: c.all_gather(part, full)}
        for kind in KINDS:
            full.fill_(rank + 1)
            part.fill_(rank + 1)
            ops[kind]()
            expect = {"all_reduce": world * (world + 1) / 2,
                      "reduce_scatter": world * (world + 1) / 2}.get(kind)
            got = full if kind != "reduce_scatter" else part
            ok = bool((got == expect).all()) if expect is not None else bool(
                (full.view(world, -1) == torch.arange(1, world + 1, device=full.device)
                 .view(-1, 1)).all())
            t = time_point(ops[kind], warmup, repeats, backend.clock())
            out.append(row(kind, b, t.median_ms, world, "measured", backend.name, "local",
                           time_ms_min=round(t.min_ms, 6), time_ms_max=round(t.max_ms, 6),
                           verified=ok, comm=label))
    return out


def measure(settings) -> list[dict]:
    szs = sizes(settings.scale, settings.max_elements * 4)
    start = time.perf_counter()
    # comm=shm: shared memory and gloo side by side, in one run
    comms = (settings.comm, "ring") if settings.comm == "shm" else (settings.comm,)
    rows = run_ranks(rank_main, settings.world_size, args=(szs, settings.warmup,
                                                           settings.repeats, settings.backend,
                                                           comms),
                     timeout_s=settings.timeout_s)[0]
    for r in rows:
        append_row(settings.csv_path, r)
    print(f"measured {len(rows)} points on {settings.world_size} ranks in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return rows


def predict(settings) -> list[dict]:
    """backend=sim: the chosen topology, all its devices (local: world_size ranks), 1 KiB to 1 GiB;
    backend=cpu: the local topology at the measured world size and sizes, beside the measurements.
    """
    topo = settings.topology
    if settings.backend == "sim":
        world = settings.world_size if topo.name == "local" else topo.devices
        return predict_rows(topo, world, settings.scale)
    local = topo if topo.name == "local" else load_topology("local")
    return predict_rows(local, settings.world_size, settings.scale, settings.max_elements * 4)


EXPERIMENT = register(Experiment(
    name=NAME, figure="nccl-tests bandwidth (no paper figure)", measure=measure, predict=predict,
    summary=table))
