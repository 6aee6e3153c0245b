"""Published measurements as data: nccl-tests results to validate the GPU topologies against, and
the paper's headline results (both in `cost_model/data/`, each row with its source).

`published()` reads `data/published_collectives.csv`: one row per published point (system: a
topology name in suite/conf/topology; gpus, nodes, NCCL version, collective, forced algorithm or empty
for NCCL's default, bytes as nccl-tests counts them, busbw in GB/s, source URL, date, note).
`predict_point(p)` simulates that collective alone on the first `gpus` devices of the system's
topology (the DES, the tuner's pick or the forced algorithm, as nccl-tests times one call) and
returns its time, busbw (nccl-tests' factor: all_reduce 2(n-1)/n, reduce_scatter / all_gather
(n-1)/n, broadcast / reduce 1), the algorithm and protocol and the error against the published
busbw (predicted / published - 1). `fit_pipeline(system)` is how a topology's fitted constants
`nccl.fill_us`, `nccl.slice_us` (and `nccl.ll_bw_gbps` / `nccl.ll128_bw_gbps` where the file fits
them) are found: the values on a grid with the least sum of squared relative busbw errors over
the system's published points (least squares, one value each for the whole system; nothing is
fitted per point). `paper_results()` reads
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
from .closed_collectives import choose, collective_us
from .collectives import CollSpec, nccl_call
from .topology import NCCL_ALGOS, Topology, load_topology
from .workload import simulate_collective

DATA_DIR = Path(__file__).resolve().parent / "data"
FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
SPLITS = ("fit", "check")  # what a point is for: fitting the system's constants, or checking them


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
    split: str = "fit"  # SPLITS: chosen before any fit (`check_split`), kept in the data

    @property
    def series(self) -> str:
        """The curve this point belongs to: collective, GPUs, nodes and forced algorithm, and the
        run's machine where the `gpu` column names one in parentheses (two runs of one system)."""
        algo = f", {self.algo} forced" if self.algo else ""
        nodes = f" x {self.nodes} nodes" if self.nodes > 1 else ""
        run = (
            f" [{self.gpu[self.gpu.index('(') + 1 : self.gpu.rindex(')')]}]"
            if "(" in self.gpu and ")" in self.gpu
            else ""
        )
        return f"{self.collective} ({self.gpus} GPUs{nodes}{algo}){run}"


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
                p = Point(
                    system=row["system"],
                    gpu=row["gpu"],
                    gpus=int(row["gpus"]),
                    nodes=int(row["nodes"]),
                    nccl_version=row["nccl_version"],
                    collective=row["collective"],
                    algo=row["algo"],
                    bytes=int(row["bytes"]),
                    busbw_gbps=float(row["busbw_gbps"]),
                    source=row["source"],
                    date=row["date"],
                    note=row["note"],
                    split=row["split"],
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path.name} line {i}: {e}") from None
            if (
                p.collective not in FACTOR
                or (p.algo and p.algo not in NCCL_ALGOS)
                or p.gpus < 1
                or p.bytes < 1
                or p.busbw_gbps <= 0
                or not p.source
                or p.split not in SPLITS
                or p.gpus % p.nodes
            ):
                raise ValueError(f"{path.name} line {i}: bad point {row}")
            points.append(p)
    return points


def check_split(points: list[Point]) -> list[str]:
    """The rule the data's `split` column was drawn by, before any fit: per system, its points in
    file order, every third from the first is `check` (so ceil(n / 3) of n points, at least a
    third, spread over its curves and sizes); the others `fit`."""
    seen: dict[str, int] = {}
    out = []
    for p in points:
        k = seen.get(p.system, 0)
        seen[p.system] = k + 1
        out.append("check" if k % 3 == 0 else "fit")
    return out


def topology_for(p: Point) -> Topology:
    """The system's topology for the point: its nodes, with the point's GPUs a node of them in
    the job (`Topology.with_devices_per_node`) and its forced algorithm."""
    topo = load_topology(p.system, nodes=p.nodes).with_devices_per_node(p.gpus // p.nodes)
    return dataclasses.replace(topo, algo=p.algo) if p.algo else topo


def busbw_gbps(kind: str, nbytes: float, time_us: float, ranks: int) -> float:
    return nbytes / (time_us * 1e3) * FACTOR[kind](ranks) if time_us > 0 else 0.0


def predict(kind: str, nbytes: int, ranks: int, topo: Topology, des: bool = True) -> Prediction:
    """One call of the collective on the first `ranks` devices, as nccl-tests times it (the
    DES, or with des=False the closed form; sendrecv: every rank's send to the next at once,
    `nccl.p2p_us`, the slowest pair's time)."""
    if kind == "sendrecv":  # nccl-tests' ring of pairs: each rank sends to the next at once
        t = max(nccl.p2p_us(topo, r, (r + 1) % ranks, nbytes) for r in range(ranks))
        return Prediction(t, busbw_gbps(kind, nbytes, t, ranks), "p2p", "Simple")
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


FITTED = ("fill_us", "slice_us", "ll_bw_gbps", "ll128_bw_gbps", "net_fill_us")
OPTIONAL = ("ll_bw_gbps", "ll128_bw_gbps", "net_fill_us")  # fitted only where the file gives them
GRIDS = {
    "fill_us": (0.0, 5.0, 0.01),
    "slice_us": (0.0, 10.0, 0.01),
    "ll_bw_gbps": (0.5, 40.0, 0.05),
    "ll128_bw_gbps": (0.5, 40.0, 0.05),
    "net_fill_us": (0.0, 100.0, 0.05),
}  # (lowest, highest, step)


def _depends_on(algo: str, proto: str, nodes: int) -> Optional[str]:
    """Which fitted constant a call's time depends on, beyond those fitted before it
    (`nccl.time_us`; None: none): NVLS tree across nodes on `net_fill_us` (its `fill_us` part
    fitted first, on the calls inside one node)."""
    if algo == "ring":
        return {"Simple": "slice_us", "LL": "ll_bw_gbps", "LL128": "ll128_bw_gbps"}[proto]
    if algo == "nvls_tree" and nodes > 1:
        return "net_fill_us"
    return "fill_us" if algo.startswith(("nvls", "collnet")) else None


def training_points(system: str, points: Optional[list[Point]] = None) -> list[Point]:
    """The points a system's constants are fitted on: its `split=fit` points, and only those."""
    return [p for p in (points or published()) if p.system == system and p.split == "fit"]


def fit_pipeline(system: str, points: Optional[list[Point]] = None) -> dict:
    """The system's fitted constants ({name: value} for `FITTED`), each on its grid (`GRIDS`)
    with the least sum of squared relative busbw errors over the system's training points
    (`training_points`: split=fit; the check split is never seen by a fit); an OPTIONAL one only
    where the topology file gives it (None otherwise). The tuner's pick does not depend on them
    and each call's time depends on one of them beyond those fitted before it (`_depends_on`), so
    they are fitted in two rounds over their own points: first those of calls inside a node,
    then `net_fill_us` with `fill_us` in place. Nothing is fitted per point."""
    mine = [p for p in training_points(system, points) if p.collective in nccl.TUNED]
    if not mine:  # all_to_all: NCCL's send/recv, no fitted constant
        raise ValueError(f"no published points to fit {system} on")
    base = load_topology(system).nccl
    out = {name: None for name in FITTED}
    for names in (FITTED[:4], FITTED[4:]):
        fixed = {k: v for k, v in out.items() if v is not None}
        for name in names:
            if name in OPTIONAL and getattr(base, name) is None:
                continue
            lo, hi, step = GRIDS[name]
            grid = np.round(np.arange(lo, hi + 1e-9, step), 2)
            squares, used = np.zeros(grid.size), 0
            for p in mine:
                topo = topology_for(p)
                ranks, nodes = nccl.communicator(topo, range(p.gpus))
                a, pr = nccl.pick(
                    p.collective,
                    float(p.bytes),
                    ranks,
                    nodes,
                    topo.nccl,
                    p.algo or None,
                    topo.proto,
                ).label.split("/")
                if _depends_on(a, pr, nodes) != name:
                    continue
                used += 1
                factor = p.bytes * FACTOR[p.collective](ranks) / 1e3 / p.busbw_gbps
                for i, value in enumerate(grid):
                    nc = dataclasses.replace(topo.nccl, **fixed, **{name: float(value)})
                    t = nccl.time_us(p.collective, p.bytes, a, pr, ranks, nodes, nc).time_us
                    squares[i] += (factor / t - 1.0) ** 2
            out[name] = float(grid[int(np.argmin(squares))]) if used else getattr(base, name)
    return out


def paper_results(path: Optional[Path] = None) -> list[dict]:
    """The paper's headline results (data/paper_results.csv unless `path`), one dict per row."""
    return _typed(
        Path(path) if path else DATA_DIR / "paper_results.csv",
        {"speedup_min": float, "speedup_max": float, "world_size": int},
    )


def _typed(path: Path, types: dict) -> list[dict]:
    """The rows of a CSV file with the columns of `types` converted (ValueError naming the
    file and line where one does not convert)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, start=2):
        try:
            r.update({k: convert(r[k]) for k, convert in types.items()})
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path.name} line {i}: {e}") from None
    return rows


def authors_raw(path: Optional[Path] = None) -> list[dict]:
    """The CoCoNeT authors' raw timings of the data-parallel Adam step on 128 V100 (data/
    coconet_raw_adam.csv unless `path`: their repository's logs, not published figures; each row
    names its file and commit and says how it was timed): {experiment, schedule, nccl_algo,
    world_size, size (elements), time_ms, reference, caveat}, one dict per row."""
    return _typed(
        Path(path) if path else DATA_DIR / "coconet_raw_adam.csv",
        {"world_size": int, "size": int, "time_ms": float},
    )
