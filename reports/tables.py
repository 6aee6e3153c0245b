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


def measured_table(df, experiment: str, source: str = "measured") -> str:
    rows = df[(df.experiment == experiment) & (df.source == source)]
    if rows.empty:
        return f"_no {source} rows for {experiment}_\n"
    sizes = sorted(set(rows["size"]))
    schedules = list(dict.fromkeys(rows.schedule))
    head = "| schedule | " + " | ".join(_size(n) for n in sizes) + " |"
    out = [head, "|" + "---|" * (len(sizes) + 1)]
    for sched in schedules:
        cells = []
        for n in sizes:
            r = rows[(rows.schedule == sched) & (rows["size"] == n)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            mark = "" if str(r.verified) in ("True", "true", "1") else " (NOT VERIFIED)"
            cells.append(f"{r.time_ms:.2f} ms [{r.time_ms_min:.2f}, {r.time_ms_max:.2f}]"
                         f" x{r.speedup:.2f}{mark}")
        out.append(f"| {sched} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
