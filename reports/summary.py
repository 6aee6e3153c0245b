"""Short summaries of a run, from the results table alone: what a run prints last, and the
reproduction report's overview.

- `schedule_summary(df, experiment)`: one row per schedule: the measured speedup over `baseline`
  at the largest measured point, the local prediction at that point, and the prediction at the
  largest point of every other topology (collectives: busbw in GB/s at the largest size instead;
  a row per transport where several were measured side by side, comm=shm).
- `experiment_summary(df, experiment)`: one row for the whole experiment: points measured and
  verified, the best measured speedup (schedule @ point), the local fidelity two ways (time error
  |predicted/measured time - 1| and speedup error |predicted/measured speedup - 1|, median and
  largest) with the machine's repeatability beside them (median 95% half-widths of the measured
  times and speedups), and the best predicted speedup per GPU topology (like for like: among
  the schedules in the baseline's precision); for the collectives, each GPU topology's
  all-reduce bus bandwidth at its largest size (`busbw_at`) and, where another size does better,
  the best with its size (`best_busbw`).
- `text_table(header, rows)` / `markdown_table(header, rows)`: either as text.
"""

from __future__ import annotations

from .predicted import _bytes, accuracy, summary
from .tables import point_label

Table = tuple[list[str], list[list[str]]]


def _largest(rows):
    """The rows of the largest point (world size, then size) of `rows`."""
    if rows.empty:
        return rows
    top = rows.sort_values(["world_size", "size"]).iloc[-1]
    return rows[
        (rows.world_size == top.world_size)
        & (rows["size"] == top["size"])
        & (rows["shape"].astype(str) == str(top["shape"]))
    ]


def _first(rows):
    """The first row as a named tuple (fields by column name: `.size` is the column)."""
    return next(rows.itertuples())


def _cell(part, schedule: str, column: str, fmt: str) -> str:
    hit = part[part.schedule == schedule][column].dropna() if column in part else part.iloc[0:0]
    return "" if hit.empty else fmt.format(float(hit.iloc[0]))


def schedule_summary(df, experiment: str) -> Table:
    rows = df[df.experiment == experiment]
    busbw = experiment == "collectives"
    if busbw and "comm" in rows and rows["comm"].dropna().nunique() > 1:  # comm=shm: a row each
        rows = rows.assign(
            schedule=rows.schedule
            + rows["comm"].map(lambda c: f" ({c})" if isinstance(c, str) else "")
        )
    meas = rows[rows.source == "measured"]
    pred = rows[rows.source == "predicted"]
    column, fmt = ("busbw_gbps", "{:.2f}") if busbw else ("speedup", "x{:.2f}")
    top = _largest(meas)
    local = pred[pred.topology == "local"]
    if not top.empty:  # the whole point: points may share a size and differ in shape (K)
        local = local[
            (local.world_size == top.world_size.iloc[0])
            & (local["size"] == top["size"].iloc[0])
            & (local["shape"].astype(str) == str(top["shape"].iloc[0]))
        ]
    header = ["collective" if busbw else "schedule"]
    cols = []
    if not top.empty:
        where = point_label(_first(top))
        cols += [(f"measured {where}", top), (f"predicted local {where}", local)]
    for topo in dict.fromkeys(pred.topology):
        if topo != "local" or top.empty:
            part = _largest(pred[pred.topology == topo])
            label = point_label(_first(part))
            cols.append((f"{topo} ({int(part.world_size.iloc[0])}) {label}", part))
    header += [name for name, _ in cols]
    ours = rows[rows.source.isin(("measured", "predicted"))]  # not the paper's published rows
    schedules = [s for s in dict.fromkeys(ours.schedule) if s != "baseline"]
    return header, [[s] + [_cell(part, s, column, fmt) for _, part in cols] for s in schedules]


def experiment_summary(df, experiment: str) -> Table:
    rows = df[df.experiment == experiment]
    meas = rows[(rows.source == "measured") & (rows.schedule != "baseline")]
    header = [
        "experiment",
        "measured points (verified)",
        "best measured speedup",
        "local time error (median, largest)",
        "local speedup error (median, largest)",
        "repeatability (time, speedup)",
        "best predicted speedup (GPUs)",
    ]
    verified = (
        int(meas.verified.astype(str).isin(["True", "true", "1"]).sum())
        if "verified" in meas
        else 0
    )
    best = ""
    if not meas.empty and "speedup" in meas and meas.speedup.notna().any():
        b = _first(meas.loc[[meas.speedup.idxmax()]])
        best = f"x{b.speedup:.2f} {b.schedule} @ {point_label(b)}"
    acc = summary(accuracy(df, experiment))
    pct = lambda x: "n/a" if x != x else f"{x:.1f}%"  # noqa: E731  (NaN: none)
    error = (
        f"{pct(100 * acc['median_abs_error'])}, {pct(100 * acc['max_abs_error'])}"
        if acc.get("points")
        else ""
    )
    sp_error = (
        f"{pct(100 * acc['median_abs_speedup_error'])}, {pct(100 * acc['max_abs_speedup_error'])}"
        if acc.get("speedup_points")
        else ""
    )
    repeat = (
        f"+-{pct(acc['time_repeatability_pct'])}, +-{pct(acc['speedup_repeatability_pct'])}"
        if acc.get("points")
        else ""
    )
    pred = rows[
        (rows.source == "predicted") & (rows.topology != "local") & (rows.schedule != "baseline")
    ]
    if "dtype" in rows:  # like for like: not a schedule in another precision than the baseline's
        base = rows[(rows.source == "predicted") & (rows.schedule == "baseline")]
        pred = pred[pred.dtype.isin(set(base.dtype))] if not base.empty else pred
    gpus = []
    if "speedup" in pred and pred.speedup.notna().any():
        for topo, part in pred.groupby("topology", sort=False):
            b = part.loc[part.speedup.idxmax()]
            gpus.append(f"{topo}: x{b.speedup:.2f} {b.schedule}")
    elif not pred.empty:  # collectives: no speedups
        gpus = [busbw_summary(t, p) for t, p in pred.groupby("topology", sort=False)]
    return header, [
        [experiment, f"{len(meas)} ({verified})", best, error, sp_error, repeat, "; ".join(gpus)]
    ]


def busbw_at(rows, size: int, collective: str = "all_reduce"):
    """The bus bandwidth (GB/s) of `collective` at exactly `size` bytes, or None."""
    hit = rows[(rows.schedule == collective) & (rows["size"] == size)].busbw_gbps.dropna()
    return None if hit.empty else float(hit.iloc[0])


def best_busbw(rows, collective: str = "all_reduce"):
    """(the largest bus bandwidth of `collective` over its sizes, that size), or None."""
    part = rows[rows.schedule == collective].dropna(subset=["busbw_gbps"])
    if part.empty:
        return None
    r = part.loc[part.busbw_gbps.idxmax()]
    return float(r.busbw_gbps), int(r["size"])


def busbw_summary(topology: str, rows) -> str:
    """'dgx_a100: all_reduce 119.5 GB/s at 1 GiB (best 155.1 at 512 MiB)': the all-reduce's bus
    bandwidth at the largest size predicted, and the best over sizes with where it is."""
    largest = (
        int(rows[rows.schedule == "all_reduce"]["size"].max())
        if (rows.schedule == "all_reduce").any()
        else None
    )
    at, best = (busbw_at(rows, largest), best_busbw(rows)) if largest else (None, None)
    if at is None or best is None:
        return f"{topology}: -"
    text = f"{topology}: all_reduce {at:.1f} GB/s at {_bytes(largest)}"
    return text + ("" if best[1] == largest else f" (best {best[0]:.1f} at {_bytes(best[1])})")


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[k])) for r in [header] + rows) for k in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"
