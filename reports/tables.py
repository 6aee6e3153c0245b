"""Tables from the results table alone: Markdown for report.md.

`measured_table(df, experiment)`: per schedule and size, the median time in ms with the spread
[min, max] over repeats, the speedup over `baseline`, and whether the point was verified.
"""

from __future__ import annotations

from math import log2


def _size(n) -> str:
    n = int(n)
    k = log2(n) if n > 0 else 0
    return f"2^{int(k)}" if k == int(k) else str(n)


def point_label(row) -> str:
    """A measured point's column heading: 2^k for a 1-D size, else the shape spelled out; with
    the world size when a table mixes several."""
    shape = str(row.shape)
    return _size(row.size) if shape.startswith("[") or shape == "nan" else shape


def measured_table(df, experiment: str, source: str = "measured") -> str:
    rows = df[(df.experiment == experiment) & (df.source == source)].copy()
    if rows.empty:
        return f"_no {source} rows for {experiment}_\n"
    several = rows.world_size.nunique() > 1
    rows["point"] = [
        (f"{r.world_size} ranks: " if several else "") + point_label(r) for r in rows.itertuples()
    ]
    points = list(dict.fromkeys(rows.sort_values(["world_size", "size"]).point))
    schedules = list(dict.fromkeys(rows.schedule))
    out = ["| schedule | " + " | ".join(points) + " |", "|" + "---|" * (len(points) + 1)]
    for sched in schedules:
        cells = []
        for pt in points:
            r = rows[(rows.schedule == sched) & (rows.point == pt)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            mark = "" if str(r.verified) in ("True", "true", "1") else " (NOT VERIFIED)"
            ci = (
                f" [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]"
                if sched != "baseline" and "speedup_lo" in r and r.speedup_lo == r.speedup_lo
                else ""
            )
            cells.append(
                f"{r.time_ms:.2f} ms [{r.time_ms_min:.2f}, {r.time_ms_max:.2f}]"
                f" x{r.speedup:.2f}{ci}{mark}"
            )
        out.append(f"| {sched} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
