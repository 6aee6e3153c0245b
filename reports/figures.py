"""Figures from the results table alone (pure functions of a DataFrame; nothing is re-run).

`speedup_figure(df, experiment, path)`: the paper's Fig. 10 style: speedup over `baseline`
against the principal tensor's size (log2 axis), one line per schedule, one panel per source and
topology present (measured on local ranks, predicted on local, dgx2, ...); experiments whose
points are shapes (model and pipeline parallel) get grouped bars, one group per point. Colours are fixed per schedule across all figures.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

# the suite's cache (codegen.cache, which suite exports as COCONET_CACHE_DIR), else the checkout's
_CACHE = Path(
    os.environ.get("COCONET_CACHE_DIR") or Path(__file__).resolve().parent.parent / ".cache"
)
os.environ.setdefault("MPLCONFIGDIR", str(_CACHE / "matplotlib"))

import matplotlib  # noqa: E402
import matplotlib.colors  # noqa: E402

matplotlib.use("Agg")


def pyplot():
    """matplotlib.pyplot, imported when a figure is drawn: 0.3 s that a command refused before
    any work (and every rank) does not pay."""
    import matplotlib.pyplot

    return matplotlib.pyplot


ORDER = [
    "baseline",
    "AR-C",
    "RS-C-AG",
    "RS-C-AG+as_slice",
    "fuse(RS-C-AG)",
    "fuse(RS-C-AG)+as_slice",
    "MM-AR-C",
    "MM-RS-C-AG",
    "ol(MM,fuse(RS-C-AG))",
    "AR-C-P2P",
    "AR-P2P-C",
    "RS-P2P-C-AG",
    "ol(RS,fuse(P2P-C-AG))",
]


def colour(schedule: str) -> str:
    """A fixed colour per schedule: ORDER's, else one picked by a stable hash of the name (the
    same in every run and process: Python's own `hash` of a string is salted per process)."""
    palette = pyplot().get_cmap("tab20").colors
    k = (
        ORDER.index(schedule)
        if schedule in ORDER
        else len(ORDER) + zlib.crc32(schedule.encode()) % 8
    )
    return matplotlib.colors.to_hex(palette[k % len(palette)])


def _save(fig, path) -> Path:
    """PNG (and SVG beside it) of a finished figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".svg"))
    pyplot().close(fig)
    return path


def _rank(schedule: str) -> int:
    return ORDER.index(schedule) if schedule in ORDER else len(ORDER)


def panels(rows) -> list[tuple[str, str]]:
    """(source, topology) of each speedup panel: measured first, then each predicted topology."""
    keys = dict.fromkeys(zip(rows.source, rows.topology))  # not the paper's published rows
    keys = [k for k in keys if k[0] in ("measured", "predicted")]
    return sorted(keys, key=lambda k: (k[0] != "measured", k[0]))


def _sweep(ax, part) -> None:
    """One line per schedule against the size (a 1-D sweep, Fig. 10 style)."""
    for schedule in sorted(set(part.schedule), key=_rank):
        line = part[part.schedule == schedule].sort_values(["world_size", "size"])
        ax.plot(line["size"], line["speedup"], marker="o", label=schedule, color=colour(schedule))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements of the principal tensor (log2)")


def _bars(ax, part) -> None:
    """One group of bars per point (shape and ranks), one bar per schedule (Fig. 11/12 style)."""
    points = list(dict.fromkeys(zip(part.world_size, part["shape"].astype(str))))
    schedules = sorted(set(part.schedule), key=_rank)
    width = 0.8 / len(schedules)
    for j, schedule in enumerate(schedules):
        xs, ys = [], []
        for i, (world, shape) in enumerate(points):
            hit = part[
                (part.schedule == schedule)
                & (part.world_size == world)
                & (part["shape"].astype(str) == shape)
            ]
            if not hit.empty:
                xs.append(i + j * width)
                ys.append(float(hit.speedup.iloc[0]))
        ax.bar(xs, ys, width, label=schedule, color=colour(schedule))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(points))])
    ax.set_xticklabels(
        [f"{shape.replace(',', ' ')}\n{world} ranks" for world, shape in points], fontsize=6
    )
    ax.set_xlabel("point (shape, ranks)")


def speedup_figure(df, experiment: str, path) -> Path:
    rows = df[df.experiment == experiment]
    keys = panels(rows) or [("measured", "local")]
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = pyplot().subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, (source, topo) in zip(axes.flat, keys):
        part = rows[(rows.source == source) & (rows.topology == topo)]
        if part["shape"].astype(str).str.startswith("[").all():
            _sweep(ax, part)
        else:
            _bars(ax, part)
        worlds = "/".join(str(w) for w in sorted(set(part.world_size)))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("speedup over baseline (x)")
        ax.set_title(f"{experiment}: {source} on {topo}, {worlds} ranks", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def breakdown_figure(df, experiment: str, path, source: str = "measured") -> Path:
    """The paper's Fig. 11/12 style: per point, one bar per schedule of its time normalised to
    `baseline`, stacked into computation not overlapped, communication hidden behind computation
    (overlapped_ms), and communication exposed (comm_ms)."""
    rows = df[(df.experiment == experiment) & (df.source == source)].fillna({"overlapped_ms": 0})
    points = list(dict.fromkeys(zip(rows.world_size, rows["shape"])))
    schedules = sorted(set(rows.schedule), key=_rank)
    fig, ax = pyplot().subplots(figsize=(max(6, 1.6 * len(points) * len(schedules) / 3), 4.2))
    width = 0.8 / len(schedules)
    parts = (
        ("compute", "#4c72b0", None),
        ("overlapped", "#55a868", "//"),
        ("exposed comm", "#dd8452", None),
    )
    for i, (world, shape) in enumerate(points):
        at = rows[(rows.world_size == world) & (rows["shape"] == shape)]
        base = at[at.schedule == "baseline"].time_ms
        scale = float(base.iloc[0]) if len(base) else float(at.time_ms.max())
        for j, sched in enumerate(schedules):
            r = at[at.schedule == sched]
            if r.empty:
                continue
            r = r.iloc[0]
            hidden = min(float(r.overlapped_ms or 0), float(r.compute_ms))
            heights = (float(r.compute_ms) - hidden, hidden, float(r.comm_ms))
            bottom = 0.0
            for (label, col, hatch), h in zip(parts, heights):
                ax.bar(
                    i + j * width,
                    h / scale,
                    width,
                    bottom=bottom,
                    color=col,
                    hatch=hatch,
                    edgecolor=colour(sched),
                    linewidth=1.2,
                    label=label if (i, j) == (0, 0) else None,
                )
                bottom += h / scale
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(points))])
    ax.set_xticklabels([f"{s}\n{w} ranks" for w, s in points], fontsize=7)
    ax.set_ylabel("time / baseline time")
    ax.set_title(f"{experiment} ({source}): bars left to right: {', '.join(schedules)}", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.legend(fontsize=8)
    return _save(fig, path)
