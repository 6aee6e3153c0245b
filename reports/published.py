"""The paper's cluster: the authors' own timings beside this run's predictions, per size.

From the results table alone: rows with source `published` (the CoCoNeT authors' raw logs of
their baseline and fused step on DGX-2 nodes, `experiments.predict.authors_rows`) and the
predicted rows on topology dgx2 at the same world size and sizes.

`authors_section(df, experiment, out_dir)` -> markdown: a table per size (their baseline and
fused times and speedup; predicted, like for like in f32, and as published where the run
predicted `fuse(RS-C-AG)+as_slice+f16`; the speedup's error), the breakdown of every point whose
predicted speedup differs from theirs by more than `EXPLAIN_PCT` (where the model puts each
schedule's time: computation, communication exposed, the algorithm and protocol NCCL picks), and
the figure `figures/<experiment>_authors.png` (speedup against size). Nothing where the table
has no published rows. Units: ms, %.
"""

from __future__ import annotations

from pathlib import Path

from .figures import _save, pyplot
from .tables import _size

EXPLAIN_PCT = 15.0  # a point whose speedup error exceeds this gets its breakdown
FUSED = "fuse(RS-C-AG)+as_slice"
AS_PUBLISHED = "fuse(RS-C-AG)+as_slice+f16"


def points(df, experiment: str) -> list[dict]:
    """Per (world size, size) the authors have both schedules at: their times and speedup, and
    the predicted ones on dgx2 at that world size (None where not predicted)."""
    ours = df[(df.experiment == experiment) & (df.topology == "dgx2")]
    theirs = ours[ours.source == "published"].drop_duplicates(["world_size", "size", "schedule"])
    pred = (
        ours[ours.source == "predicted"]
        .drop_duplicates(["world_size", "size", "schedule"])
        .set_index(["world_size", "size", "schedule"])
    )
    out = []
    for (world, size), at in theirs.groupby(["world_size", "size"], sort=True):
        by = at.set_index("schedule")
        if "baseline" not in by.index or FUSED not in by.index:
            continue

        def p(schedule, col="time_ms", key=(world, size)):
            k = (*key, schedule)
            return float(pred.loc[k, col]) if k in pred.index else None

        out.append(
            {
                "world": int(world),
                "size": int(size),
                "base_ms": float(by.time_ms["baseline"]),
                "fused_ms": float(by.time_ms[FUSED]),
                "speedup": float(by.speedup[FUSED]),
                "p_base_ms": p("baseline"),
                "p_fused_ms": p(FUSED),
                "p_speedup": p(FUSED, "speedup"),
                "p_published": p(AS_PUBLISHED, "speedup"),
            }
        )
    return out


def _fmt(x, spec: str, prefix: str = "") -> str:
    return "-" if x is None else f"{prefix}{x:{spec}}"


def _error(pt: dict):
    return None if pt["p_speedup"] is None else 100 * (pt["p_speedup"] / pt["speedup"] - 1)


def _gap(theirs: float, predicted) -> str:
    return "-" if predicted is None else f"{100 * (theirs / predicted - 1):+.0f}% over"


def breakdown(df, experiment: str, pt: dict) -> str:
    """How far their times are from the predicted ones, then 'schedule t ms = compute a +
    communication exposed b (algo/proto, ...)' of each predicted schedule at the point."""
    rows = df[
        (df.experiment == experiment)
        & (df.source == "predicted")
        & (df.topology == "dgx2")
        & (df.world_size == pt["world"])
        & (df["size"] == pt["size"])
    ]
    parts = [
        f"their baseline {_gap(pt['base_ms'], pt['p_base_ms'])} and fused step "
        f"{_gap(pt['fused_ms'], pt['p_fused_ms'])} the predicted time"
    ]
    for r in rows[rows.schedule.isin(("baseline", FUSED))].fillna({"proto": ""}).itertuples():
        picks = ", ".join(
            f"{a}/{p}" if p else a
            for a, p in zip(str(r.algo).split(";"), str(r.proto).split(";"))
            if a
        )
        parts.append(
            f"{r.schedule} {r.time_ms:.3f} ms = compute {r.compute_ms:.3f} + "
            f"communication exposed {r.comm_ms:.3f} ({picks})"
        )
    return "; ".join(parts)


def authors_figure(pts: list[dict], experiment: str, path) -> Path:
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    for world in sorted({p["world"] for p in pts}):
        mine = [p for p in pts if p["world"] == world]
        xs = [p["size"] for p in mine]
        ax.plot(xs, [p["speedup"] for p in mine], "ko-", label=f"authors' logs ({world} V100)")
        for key, style, what in (
            ("p_speedup", "s--", "predicted, f32"),
            ("p_published", "^:", "predicted, f16 as published"),
        ):
            got = [(x, p[key]) for x, p in zip(xs, mine) if p[key] is not None]
            if got:
                ax.plot(*zip(*got), style, label=f"{what} ({world} V100)")
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("gradient elements")
    ax.set_ylabel(f"{FUSED} speedup over baseline")
    ax.set_title(f"{experiment}: the paper's cluster (dgx2)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def authors_section(df, experiment: str, out_dir: Path) -> str:
    pts = points(df, experiment)
    if any(p["p_speedup"] is not None for p in pts):  # the sizes predicted
        pts = [p for p in pts if p["p_speedup"] is not None]
    if not pts:
        return ""
    ref = df[(df.experiment == experiment) & (df.source == "published")]
    lines = [
        "## The paper's cluster: the authors' timings and the prediction",
        "",
        "The authors' own logs of the baseline (all-reduce + Apex FusedAdam, f32) and of "
        f"their fused kernel (f32) on DGX-2 nodes, NCCL's default algorithm, beside this "
        f"run's prediction on dgx2 at the same size: {FUSED} in f32 (like for like) and, "
        f"where predicted, {AS_PUBLISHED} (the precision the paper's fused binary ran: "
        "f16 gradient and weight copy, f32 state, against the same f32 baseline). Sources: "
        + "; ".join(sorted(set(ref.reference.astype(str))))
        + ". Caveats: "
        + " / ".join(sorted(set(ref.caveat.astype(str))))
        + ".",
        "",
        "| ranks | size | their baseline ms | predicted | their fused ms | predicted | "
        "their speedup | predicted f32 | error | predicted f16 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in pts:
        lines.append(
            f"| {p['world']} | {_size(p['size'])} | {p['base_ms']:.3f} | "
            f"{_fmt(p['p_base_ms'], '.3f')} | {p['fused_ms']:.3f} | {_fmt(p['p_fused_ms'], '.3f')}"
            f" | x{p['speedup']:.2f} | {_fmt(p['p_speedup'], '.2f', 'x')} | "
            f"{_fmt(_error(p), '+.1f')}% | {_fmt(p['p_published'], '.2f', 'x')} |"
        )
    far = [p for p in pts if _error(p) is not None and abs(_error(p)) > EXPLAIN_PCT]
    if far:
        lines += [
            "",
            f"Points whose predicted speedup differs from theirs by more than "
            f"{EXPLAIN_PCT:g}%, with the predicted breakdown:",
            "",
        ]
        lines += [
            f"- {p['world']} ranks, {_size(p['size'])} ({_error(p):+.1f}%): "
            + breakdown(df, experiment, p)
            for p in far
        ]
    fig = authors_figure(pts, experiment, out_dir / "figures" / f"{experiment}_authors.png")
    return "\n".join(lines + ["", f"![authors' timings](figures/{fig.name})", ""]) + "\n"
