"""Tables for a paper: the measured (or predicted) table of an experiment as CSV and as LaTeX
(booktabs), from the results table alone.

`latex_table(df, experiment, source)` -> a `tabular` with \\toprule/\\midrule/\\bottomrule, one row
per schedule and one column per point, cells `time ms (speedup x)`. `write_tables(df, out_dir)`
writes `tables/<experiment>_<source>.{csv,tex}` for every experiment and source present.
"""

from __future__ import annotations

from pathlib import Path

from .tables import point_label

_ESCAPE = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "^": r"\^{}"}


def _tex(s: str) -> str:
    return "".join(_ESCAPE.get(c, c) for c in str(s))


def pivot(df, experiment: str, source: str):
    rows = df[(df.experiment == experiment) & (df.source == source)].copy()
    rows["point"] = [
        (f"{r.world_size}r " if rows.world_size.nunique() > 1 else "") + point_label(r)
        for r in rows.itertuples()
    ]
    return rows


def latex_table(df, experiment: str, source: str = "measured") -> str:
    rows = pivot(df, experiment, source)
    points = list(dict.fromkeys(rows.point))
    lines = [
        r"\begin{tabular}{l" + "r" * len(points) + "}",
        r"\toprule",
        "schedule & " + " & ".join(_tex(p) for p in points) + r" \\",
        r"\midrule",
    ]
    for sched in dict.fromkeys(rows.schedule):
        cells = []
        for p in points:
            r = rows[(rows.schedule == sched) & (rows.point == p)]
            cells.append(
                "" if r.empty else f"{r.iloc[0].time_ms:.2f} ({r.iloc[0].speedup:.2f}$\\times$)"
            )
        lines.append(_tex(sched) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_tables(df, out_dir) -> list[Path]:
    out = Path(out_dir) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (experiment, source), part in df.groupby(["experiment", "source"], sort=False):
        stem = out / f"{experiment}_{source}"
        part.to_csv(stem.with_suffix(".csv"), index=False)
        stem.with_suffix(".tex").write_text(latex_table(df, experiment, source))
        written += [stem.with_suffix(".csv"), stem.with_suffix(".tex")]
    return written
