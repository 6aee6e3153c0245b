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
Each point row carries its `split` (fit: the system's constants were fitted on it; check: no fit
saw it). `summary(rows)` gives per system and split the points, the median and largest |error|,
and the thresholds the check split is held to (`reports.validation.split_summary`: median |error| <= 8%,
every point of 16 MiB and up within 15%).
"""

from __future__ import annotations

from cost_model import validation
from cost_model.topology import load_topology
from reports.validation import split_summary

from .kinds import MeasurementExperiment
from .registry import register

NAME = "validate"
CURVE_SIZES = [1 << k for k in range(10, 35)]  # 1 KiB .. 16 GiB


def _row(p: validation.Point, source: str, nbytes: int, busbw: float, **extra) -> dict:
    return {
        "experiment": NAME,
        "schedule": p.series,
        "source": source,
        "backend": "sim" if source == "predicted" else "",
        "topology": p.system,
        "world_size": p.gpus,
        "size": nbytes,
        "shape": f"[{nbytes}]",
        "dtype": "",
        "busbw_gbps": round(busbw, 3),
        "nodes": p.nodes,
        "split": p.split,
        **extra,
    }


def point_rows(p: validation.Point) -> list[dict]:
    pred = validation.predict_point(p)
    err = validation.error(pred, p) * 100
    published = _row(
        p,
        "published",
        p.bytes,
        p.busbw_gbps,
        nccl_version=p.nccl_version,
        reference=p.source,
        date=p.date,
        note=f"{p.gpu}: {p.note}",
        row_kind="point",
    )
    predicted = _row(
        p,
        "predicted",
        p.bytes,
        pred.busbw_gbps,
        time_ms=round(pred.time_us / 1e3, 6),
        algo=pred.algo,
        proto=pred.proto,
        published_busbw_gbps=p.busbw_gbps,
        error_pct=round(err, 2),
        row_kind="point",
    )
    return [published, predicted]


def curve_rows(p: validation.Point) -> list[dict]:
    topo = validation.topology_for(p)
    out = []
    for b in CURVE_SIZES:
        pred = validation.predict(p.collective, b, p.gpus, topo)
        out.append(
            _row(
                p,
                "predicted",
                b,
                pred.busbw_gbps,
                time_ms=round(pred.time_us / 1e3, 6),
                algo=pred.algo,
                proto=pred.proto,
                row_kind="curve",
            )
        )
    return out


SCALING = ("dgx_h100", "dgx_b200", "dgx_b200_roce")  # predicted across nodes, beyond the data
SCALING_NODES = (2, 4, 8, 16)
SCALING_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def scaling_rows(systems=SCALING, nodes=SCALING_NODES, kinds=SCALING_KINDS) -> list[dict]:
    """Each system's collectives over 2, 4, 8 and 16 whole nodes, 1 KiB .. 16 GiB, with the
    algorithm and protocol NCCL's tuner picks at each size (`row_kind=nodes`; no published
    point: predictions where the data end)."""
    rows = []
    for system in systems:
        for n in nodes:
            topo = load_topology(system, nodes=n)
            for kind in kinds:
                for b in CURVE_SIZES:
                    pred = validation.predict(kind, b, topo.devices, topo)
                    rows.append(
                        {
                            "experiment": NAME,
                            "schedule": f"{kind} ({n} nodes x {topo.devices_per_node})",
                            "source": "predicted",
                            "backend": "sim",
                            "topology": system,
                            "world_size": topo.devices,
                            "size": b,
                            "shape": f"[{b}]",
                            "dtype": "",
                            "busbw_gbps": round(pred.busbw_gbps, 3),
                            "time_ms": round(pred.time_us / 1e3, 6),
                            "algo": pred.algo,
                            "proto": pred.proto,
                            "nodes": n,
                            "row_kind": "nodes",
                        }
                    )
    return rows


def predict(settings) -> list[dict]:
    """Every published point and its prediction, each series' predicted curve, and the
    predictions across nodes (`scaling_rows`)."""
    points = validation.published()
    rows, seen = [], set()
    for p in points:
        rows += point_rows(p)
        if (p.system, p.series) not in seen:
            seen.add((p.system, p.series))
            rows += curve_rows(p)
    return rows + scaling_rows()


def summary(rows: list[dict]) -> list[dict]:
    """Per system: its check split's and its fit split's `validation.split_summary` (the
    thresholds are the check split's; the fit split is shown beside it)."""
    pts = [r for r in rows if r.get("source") == "predicted" and r.get("row_kind") == "point"]
    out = []
    for system in dict.fromkeys(r["topology"] for r in pts):
        mine = [r for r in pts if r["topology"] == system]
        out.append(
            {
                "system": system,
                **{
                    split: split_summary(
                        [
                            (int(r["size"]), float(r["error_pct"]))
                            for r in mine
                            if r["split"] == split
                        ]
                    )
                    for split in validation.SPLITS
                },
            }
        )
    return out


def _cell(s: dict) -> str:
    if not s["points"]:
        return f"{'-':>22s}"
    return f"{s['points']:3d} {s['median_pct']:6.1f}% {s['max_large_pct']:7.1f}%    "


def table(rows: list[dict]) -> str:
    """The console summary: one line per system, the check split (held to the thresholds) and
    the fit split beside it."""
    lines = [
        f"{'system':10s} {'check: n  median  max>=16M':>26s}  {'fit: n  median  max>=16M':>24s}"
        "  thresholds (check)"
    ]
    for s in summary(rows):
        verdict = {True: "met", False: "NOT met", None: "no check points"}[s["check"]["ok"]]
        lines.append(f"{s['system']:10s} {_cell(s['check'])} {_cell(s['fit'])} {verdict}")
    return "\n".join(lines)


EXPERIMENT = register(
    MeasurementExperiment(
        name=NAME,
        figure="published nccl-tests results (no paper figure): the cost model validated",
        predict=predict,
        summary=lambda measured, predicted: table(predicted),
    )
)
