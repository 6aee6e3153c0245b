"""report.md sections built from the results table alone.

`measured_section(df, experiment, out_dir)`: the measured table and the experiment's figures:
`figures/<experiment>.png` (speedup against size, Fig. 10 style) and, when the rows carry the
compute / communication split, `figures/<experiment>_breakdown.png` (Fig. 11/12 style).
"""
from __future__ import annotations

from pathlib import Path

from .figures import breakdown_figure, speedup_figure
from .tables import measured_table


def placement(rows) -> str:
    """' Ranks: 2 nodes x 1 rank per node.' from the rows' nodes and ranks_per_node columns."""
    if "ranks_per_node" not in rows or rows.ranks_per_node.isna().all():
        return ""
    pairs = sorted({(int(n), int(r), int(w)) for n, r, w in
                    zip(rows.nodes, rows.ranks_per_node, rows.world_size) if n == n and r == r})
    return " Ranks: " + "; ".join(f"{w} = {n} node{'s' if n > 1 else ''} x {r} rank"
                                  f"{'s' if r > 1 else ''} per node" for n, r, w in pairs) + "."


def measured_section(df, experiment: str, out_dir: Path) -> str:
    rows = df[(df.experiment == experiment) & (df.source == "measured")]
    if rows.empty:
        return ""
    figs = [speedup_figure(df, experiment, out_dir / "figures" / f"{experiment}.png")]
    if "compute_ms" in rows and rows.compute_ms.notna().any():
        figs.append(breakdown_figure(df, experiment,
                                     out_dir / "figures" / f"{experiment}_breakdown.png"))
    text = ["## Measured", "",
            "Median time per step [min, max over repeats] and speedup over `baseline` (same run, "
            "same ranks); each repeat's time is the maximum over ranks." + placement(rows), "",
            measured_table(df, experiment)]
    text += [f"![{f.stem}](figures/{f.name})" for f in figs]
    return "\n".join(text) + "\n"
