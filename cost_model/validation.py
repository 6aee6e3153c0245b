"""Published measurements as data: nccl-tests results to validate the GPU topologies against, and
the paper's headline results (both in `cost_model/data/`, each row with its source).

`published()` reads `data/published_collectives.csv`: one row per published point (system: a
topology name in conf/topology; gpus, nodes, NCCL version, collective, forced algorithm or empty
for NCCL's default, bytes as nccl-tests counts them, busbw in GB/s, source URL, date, note).
`predict_point(p)` simulates that collective alone on the first `gpus` devices of the system's
topology (the DES, the tuner's pick or the forced algorithm, as nccl-tests times one call) and
returns its time, busbw (nccl-tests' factor: all_reduce 2(n-1)/n, reduce_scatter / all_gather
(n-1)/n, broadcast / reduce 1), the algorithm and protocol and the error against the published
busbw (predicted / published - 1). `fit_pipeline(system)` is how a topology's fitted constants
`nccl.fill_us`, `nccl.slice_us` (and `nccl.ll128_bw_gbps` where the file fits it) are found: the
values on a grid with the least sum of squared relative busbw errors over the system's published
points (least squares; nothing is fitted per point; the tuner's pick does not depend on them and
a call's time is affine in sqrt(fill_us) and slice_us, `nccl.parts`, so the grid is a few array
operations per point). `paper_results()` reads
`data/paper_results.csv` (the paper's published speedups, with where they come from and the
caveat). Bad data raises `ValueError` naming the row.
"""
from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from . import nccl
from .closed_form import choose, collective_us
from .collectives import CollSpec, nccl_call
from .topology import NCCL_ALGOS, Topology, load_topology
from .workload import simulate_collective

DATA_DIR = Path(__file__).resolve().parent / "data"
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
          "reduce": lambda n: 1.0}


@dataclass(frozen=True)
class Point:
    system: str
    gpu: str
    gpus: int
    nodes: int
    nccl_version: str
    collective: str
    algo: str  # forced (NCCL_ALGO), or "" for NCCL's default
    bytes: int
    busbw_gbps: float
    source: str
    date: str
    note: str

    @property
    def series(self) -> str:
        """The curve this point belongs to: collective, GPUs, nodes and forced algorithm."""
        algo = f", {self.algo} forced" if self.algo else ""
        nodes = f" x {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.collective} ({self.gpus} GPUs{nodes}{algo})"


@dataclass(frozen=True)
class Prediction:
    time_us: float
    busbw_gbps: float
    algo: str
    proto: str


def published(path: Optional[Path] = None) -> list[Point]:
    """The published points (data/published_collectives.csv unless `path`)."""
    path = Path(path) if path else DATA_DIR / "published_collectives.csv"
    points = []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                p = Point(system=row["system"], gpu=row["gpu"], gpus=int(row["gpus"]),
                          nodes=int(row["nodes"]), nccl_version=row["nccl_version"],
                          collective=row["collective"], algo=row["algo"],
                          bytes=int(row["bytes"]), busbw_gbps=float(row["busbw_gbps"]),
                          source=row["source"], date=row["date"], note=row["note"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path.name} line {i}: {e}") from None
            if p.collective not in FACTOR or (p.algo and p.algo not in NCCL_ALGOS) or \
                    p.gpus < 1 or p.bytes < 1 or p.busbw_gbps <= 0 or not p.source:
                raise ValueError(f"{path.name} line {i}: bad point {row}")
            points.append(p)
    return points


def topology_for(p: Point) -> Topology:
    topo = load_topology(p.system, nodes=p.nodes)
    return dataclasses.replace(topo, algo=p.algo) if p.algo else topo


def busbw_gbps(kind: str, nbytes: float, time_us: float, ranks: int) -> float:
    return nbytes / (time_us * 1e3) * FACTOR[kind](ranks) if time_us > 0 else 0.0


def predict(kind: str, nbytes: int, ranks: int, topo: Topology, des: bool = True) -> Prediction:
    """One call of the collective on the first `ranks` devices, as nccl-tests times it (the
    DES, or with des=False the closed form)."""
    spec = CollSpec(kind, int(nbytes), tuple(range(ranks)))
    algo = choose(spec, topo)
    t = simulate_collective(spec, topo, algo).time_us if des else collective_us(spec, algo, topo)
    call = nccl_call(spec, topo, algo) if topo.nccl is not None else None
    return Prediction(t, busbw_gbps(kind, nbytes, t, ranks), algo, call.proto if call else "")


def predict_point(p: Point, topo: Optional[Topology] = None, des: bool = True) -> Prediction:
    return predict(p.collective, p.bytes, p.gpus, topo or topology_for(p), des)


def error(pred: Prediction, p: Point) -> float:
    """predicted / published busbw - 1."""
    return pred.busbw_gbps / p.busbw_gbps - 1.0


def fit_pipeline(system: str, points: Optional[list[Point]] = None, top_fill_us: float = 5.0,
                 top_slice_us: float = 10.0) -> tuple[float, float, Optional[float]]:
    """The system's fitted constants (`nccl.fill_us`, `nccl.slice_us`, `nccl.ll128_bw_gbps`):
    fill and slice on a 0.01 us grid, the LL128 rate on a 0.1 GB/s grid from 1 to NCCL's table
    (fitted only where the topology file gives one; else None), with the least sum of squared
    relative busbw errors over the system's published points. The tuner's pick does not depend
    on them, so each point's time depends on slice_us (a Simple ring) or on fill_us and the LL128
    rate (the rest), and the two sums are minimized apart (exactly)."""
    mine = [p for p in (points or published()) if p.system == system]
    if not mine:
        raise ValueError(f"no published points for {system}")
    fill = np.round(np.arange(0, top_fill_us + 1e-9, 0.01), 2)
    slice_ = np.round(np.arange(0, top_slice_us + 1e-9, 0.01), 2)
    fitted_ll128 = load_topology(system).nccl.ll128_bw_gbps is not None
    top_ll128 = nccl.RING_LL128_PER_CH[nccl.ARCH_INDEX[load_topology(system).nccl.arch]][0]
    ll128 = (list(np.round(np.arange(1.0, top_ll128 + 1e-9, 0.1), 1)) if fitted_ll128
             else [None])
    sq_slice = np.zeros(slice_.size)
    sq_fill = np.zeros((len(ll128), fill.size))
    for p in mine:
        topo = topology_for(p)
        ranks, nodes = nccl.communicator(topo, range(p.gpus))
        a, pr = nccl.pick(p.collective, float(p.bytes), ranks, nodes, topo.nccl, p.algo or None,
                          topo.proto).label.split("/")
        factor = p.bytes * FACTOR[p.collective](ranks) / 1e3 / p.busbw_gbps
        for k, rate in enumerate(ll128):
            nc = dataclasses.replace(topo.nccl, ll128_bw_gbps=rate)
            fixed, ca, cb, _, _ = nccl.parts(p.collective, p.bytes, a, pr, ranks, nodes, nc)
            if cb:
                sq_slice += (factor / (fixed + cb * slice_) - 1.0) ** 2
                break
            sq_fill[k] += (factor / (fixed + ca * np.sqrt(fill)) - 1.0) ** 2
    k, i = np.unravel_index(np.argmin(sq_fill), sq_fill.shape)
    rate = None if ll128[k] is None else float(ll128[k])
    return float(fill[i]), float(slice_[np.argmin(sq_slice)]), rate


def paper_results(path: Optional[Path] = None) -> list[dict]:
    """The paper's headline results (data/paper_results.csv unless `path`), one dict per row."""
    path = Path(path) if path else DATA_DIR / "paper_results.csv"
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, start=2):
        try:
            r["speedup_min"], r["speedup_max"] = float(r["speedup_min"]), float(r["speedup_max"])
            r["world_size"] = int(r["world_size"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path.name} line {i}: {e}") from None
    return rows
