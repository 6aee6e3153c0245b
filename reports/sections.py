"""report.md sections built from the results table alone.

`measured_section(df, experiment, out_dir)`: the measured table (speedups with their 95% intervals
and a note naming the points whose rounds stopped on the time budget) and the experiment's figures:
`figures/<experiment>.png` (speedup against size, Fig. 10 style) and, when the rows carry the
compute / communication split, `figures/<experiment>_breakdown.png` (Fig. 11/12 style).
"""

from __future__ import annotations

from pathlib import Path

from .figures import breakdown_figure, speedup_figure
from .tables import measured_table, point_label


def rounds_note(rows) -> str:
    """How the interleaved rounds ended: the points that stopped on their time budget (their
    speedups' 95% intervals wider than the target), named."""
    points = rows.drop_duplicates(["world_size", "size", "shape"])
    budget = [
        f"{point_label(r)} ({int(r.rounds)} rounds)"
        for r in points.itertuples()
        if r.stopped == "budget"
    ]
    text = (
        "Interleaved measurement (`experiments.rounds`): at each point the baseline and every "
        "schedule ran once per round in a fresh random order; the speedup is the median of "
        "the per-round (paired) speedups, [in brackets] its bootstrap 95% interval. "
        f"Rounds per point: {int(points.rounds.min())} to {int(points.rounds.max())}."
    )
    if budget:
        text += (
            f" {len(budget)} of {len(points)} points stopped on their time budget "
            "(scale.budget_s; long steps: scale.long_budget_s) before every interval was "
            "within the target: " + ", ".join(budget) + "."
        )
    else:
        text += " Every point's intervals reached the target (scale.ci_pct)."
    return text


def placement(rows) -> str:
    """' Ranks: 2 nodes x 1 rank per node.' from the rows' nodes and ranks_per_node columns."""
    if "ranks_per_node" not in rows or rows.ranks_per_node.isna().all():
        return ""
    pairs = sorted(
        {
            (int(n), int(r), int(w))
            for n, r, w in zip(rows.nodes, rows.ranks_per_node, rows.world_size)
            if n == n and r == r
        }
    )
    return (
        " Ranks: "
        + "; ".join(
            f"{w} = {n} node{'s' if n > 1 else ''} x {r} rank{'s' if r > 1 else ''} per node"
            for n, r, w in pairs
        )
        + "."
    )


def measured_section(df, experiment: str, out_dir: Path) -> str:
    rows = df[(df.experiment == experiment) & (df.source == "measured")]
    if rows.empty:
        return ""
    figs = [speedup_figure(df, experiment, out_dir / "figures" / f"{experiment}.png")]
    if "compute_ms" in rows and rows.compute_ms.notna().any():
        figs.append(
            breakdown_figure(df, experiment, out_dir / "figures" / f"{experiment}_breakdown.png")
        )
    text = [
        "## Measured",
        "",
        "Median time per step [min, max over repeats] and speedup over `baseline` (same run, "
        "same ranks); each repeat's time is the maximum over ranks." + placement(rows),
        "",
    ]
    if "rounds" in rows and rows.rounds.notna().any():
        text += [rounds_note(rows), ""]
    text += [measured_table(df, experiment)]
    text += [f"![{f.stem}](figures/{f.name})" for f in figs]
    return "\n".join(text) + "\n"
