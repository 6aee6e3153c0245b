"""Validation: every published collective measurement (cost_model/data/published_collectives.csv)
predicted by the cost model on its system's topology, with the error.

    python -m suite experiment=validate

No ranks and no measurement: the rows are the published points (`source=published`, with their
source URL, NCCL version, date and note), the model's prediction at each (`source=predicted`,
`row_kind=point`: busbw, time, the algorithm and protocol NCCL's tuner picks, `error_pct` =
predicted / published busbw - 1 in %), and the predicted curve of each published series from
1 KiB to 16 GiB (`row_kind=curve`, every power of two, with its algorithm and protocol) that the
report draws through the published points. `schedule` is the series: the collective, GPUs,
nodes and forced algorithm (`all_reduce (8 GPUs, ring forced)`); `topology` the system.
`summary(rows)` gives per system the points, the median and largest |error|, and the thresholds
(|error| <= 10% from 1 MiB up, <= 25% below, median <= 5%).
"""
from __future__ import annotations

import statistics

from cost_model import validation

from .api import Experiment
from .registry import register

NAME = "validate"
CURVE_SIZES = [1 << k for k in range(10, 35)]  # 1 KiB .. 16 GiB
LIMIT_LARGE, LIMIT_SMALL, LIMIT_MEDIAN = 10.0, 25.0, 5.0  # %
MIB = 1 << 20


def _row(p: validation.Point, source: str, nbytes: int, busbw: float, **extra) -> dict:
    return {"experiment": NAME, "schedule": p.series, "source": source, "backend": "sim"
            if source == "predicted" else "", "topology": p.system, "world_size": p.gpus,
            "size": nbytes, "shape": f"[{nbytes}]", "dtype": "", "busbw_gbps": round(busbw, 3),
            "nodes": p.nodes, **extra}


def point_rows(p: validation.Point) -> list[dict]:
    pred = validation.predict_point(p)
    err = validation.error(pred, p) * 100
    published = _row(p, "published", p.bytes, p.busbw_gbps, nccl_version=p.nccl_version,
                     reference=p.source, date=p.date, note=f"{p.gpu}: {p.note}",
                     row_kind="point")
    predicted = _row(p, "predicted", p.bytes, pred.busbw_gbps, time_ms=round(pred.time_us / 1e3, 6),
                     algo=pred.algo, proto=pred.proto, published_busbw_gbps=p.busbw_gbps,
                     error_pct=round(err, 2), row_kind="point")
    return [published, predicted]


def curve_rows(p: validation.Point) -> list[dict]:
    topo = validation.topology_for(p)
    out = []
    for b in CURVE_SIZES:
        pred = validation.predict(p.collective, b, p.gpus, topo)
        out.append(_row(p, "predicted", b, pred.busbw_gbps, time_ms=round(pred.time_us / 1e3, 6),
                        algo=pred.algo, proto=pred.proto, row_kind="curve"))
    return out


def predict(settings) -> list[dict]:
    """Every published point and its prediction, and each series' predicted curve."""
    points = validation.published()
    rows, seen = [], set()
    for p in points:
        rows += point_rows(p)
        if (p.system, p.series) not in seen:
            seen.add((p.system, p.series))
            rows += curve_rows(p)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per system: points, median and largest |error| (%), and whether each threshold holds."""
    out = []
    pts = [r for r in rows if r.get("source") == "predicted" and r.get("row_kind") == "point"]
    for system in dict.fromkeys(r["topology"] for r in pts):
        mine = [r for r in pts if r["topology"] == system]
        errs = [abs(r["error_pct"]) for r in mine]
        large = [abs(r["error_pct"]) for r in mine if r["size"] >= MIB]
        small = [abs(r["error_pct"]) for r in mine if r["size"] < MIB]
        out.append({"system": system, "points": len(mine),
                    "median_pct": statistics.median(errs), "max_pct": max(errs),
                    "max_large_pct": max(large, default=0.0),
                    "max_small_pct": max(small, default=0.0),
                    "ok": max(large, default=0.0) <= LIMIT_LARGE and
                    max(small, default=0.0) <= LIMIT_SMALL and
                    statistics.median(errs) <= LIMIT_MEDIAN})
    return out


def table(rows: list[dict]) -> str:
    """The console summary: one line per system."""
    lines = [f"{'system':10s} {'points':>6s} {'median |err|':>13s} {'max |err|':>10s}  thresholds"]
    for s in summary(rows):
        lines.append(f"{s['system']:10s} {s['points']:6d} {s['median_pct']:12.1f}% "
                     f"{s['max_pct']:9.1f}%  {'met' if s['ok'] else 'NOT met'}")
    return "\n".join(lines)


EXPERIMENT = register(Experiment(
    name=NAME, figure="published nccl-tests results (no paper figure): the cost model validated",
    predict=predict, summary=lambda measured, predicted: table(predicted)))
