"""report.md sections built from the results table alone.

`measured_section(df, experiment, out_dir)`: the measured table and the experiment's figures:
`figures/<experiment>.png` (speedup against size, Fig. 10 style) and, when the rows carry the
compute / communication split, `figures/<experiment>_breakdown.png` (Fig. 11/12 style).
"""
from __future__ import annotations

from pathlib import Path

from .figures import breakdown_figure, speedup_figure
from .tables import measured_table


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
            "same ranks); each repeat's time is the maximum over ranks.", "",
            measured_table(df, experiment)]
    text += [f"![{f.stem}](figures/{f.name})" for f in figs]
    return "\n".join(text) + "\n"
