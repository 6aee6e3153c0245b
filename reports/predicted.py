"""Predicted against measured, from the results table alone (pure functions of a DataFrame).

- `accuracy(df, experiment, topology="local")`: one row per measured point (schedule, world size,
  size, shape) with its predicted time on the same topology and world size: measured median, min,
  max, predicted, and fidelity two ways: the time error `predicted / measured - 1` (`error`) and
  the speedup error `predicted speedup / measured speedup - 1` (`speedup_error`; NaN for the
  baseline, whose speedup is 1 by definition); a comm=shm run's rows with `speedup_gloo` on
  both sides (over the library baseline on gloo) also get `speedup_gloo_error`, the same for it;
  rows of several transports (collectives with comm=shm: `comm` on both sides) pair by transport.
- `summary(acc)`: the median and largest |time error| and |speedup error| (and |speedup_gloo
  error| where there is one), the machine's
  repeatability beside them (the median half-width, in % of the median, of the measured rows'
  95% intervals of the time and of the paired speedup: `time_ms_lo/hi`, `speedup_lo/hi`; NaN
  where the rows have none), and the ordering check: for every pair of schedules at the same
  point whose measured spreads [min, max] do not overlap (they differ by more than their
  spread), whether the prediction orders them the same way.
- `accuracy_table(acc)` / `speedup_table(df, experiment, topology)`: Markdown.
- `accuracy_figure(acc, path)`: predicted against measured time (log-log, y = x and +-25%).
- `busbw_figure(df, path)` / `busbw_table(df)`: the collectives experiment's bus bandwidth
  against size (a line / a column per source, topology and transport).
- `breakdown_table(df, experiment, topology)`: per predicted point and schedule the time split
  (compute, communication hidden and exposed) and the algorithm/protocol of each collective.
- `paper_section(df, experiment)`: the paper's published results (source `paper`) beside the
  predicted (the paper's cluster, dgx2) and measured speedups of the same schedule.
- `predicted_section(df, experiment, out_dir)`: report.md's predicted part (tables, figures; on
  GPU topologies the predicted breakdown figure, drawn as the measured one is).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from .figures import _save, breakdown_figure, colour, pyplot
from .published import authors_section
from .tables import _size
from .training import training_section
from .validation import validation_section

KEYS = ["schedule", "world_size", "size", "shape"]
BASELINE_NOTE = (
    "The predicted `baseline` is the library code a practitioner writes, run on the unscheduled "
    "program's steps (AR-C, MM-AR-C, AR-P2P-C): the library's collective, then the computation. "
    "On the local topology its computation takes the time the measured baseline's library call "
    "took at that point (e.g. torch's fused Adam). On a GPU topology nothing was measured: the "
    "baseline's computation is the generated kernel's, so it equals the unscheduled schedule "
    "(AR-C's speedup is x1.00 there by construction), with NCCL's all-reduce as NCCL's tuner "
    "picks it."
)
GLOO_BASELINE = "baseline(gloo)"  # comm=shm's library baseline on gloo (experiments.api's name)


def accuracy(df, experiment: str, topology: str = "local"):
    rows = df[df.experiment == experiment]
    meas = rows[rows.source == "measured"]
    pred = rows[(rows.source == "predicted") & (rows.topology == topology)]
    if meas.empty or pred.empty:
        return meas.iloc[0:0].assign(predicted_ms=[], error=[])
    # comm=shm runs' speedup over the gloo baseline (a table read back has the column, empty)
    gloo = all("speedup_gloo" in x and x.speedup_gloo.notna().any() for x in (pred, meas))
    # rows of several transports measured side by side (collectives with comm=shm) pair with the
    # prediction of their own transport
    keys = KEYS + (
        ["comm"] if all("comm" in x and x["comm"].notna().any() for x in (pred, meas)) else []
    )
    pred = pred[keys + ["time_ms", "speedup"] + (["speedup_gloo"] if gloo else [])].rename(
        columns={
            "time_ms": "predicted_ms",
            "speedup": "predicted_speedup",
            "speedup_gloo": "predicted_speedup_gloo",
        }
    )
    meas = meas.assign(shape=meas["shape"].astype(str))
    pred = pred.assign(shape=pred["shape"].astype(str))
    out = meas.merge(pred.drop_duplicates(keys), on=keys, how="inner")
    speedup_error = (out.predicted_speedup / out.speedup - 1.0).where(out.schedule != "baseline")
    out = out.assign(error=out.predicted_ms / out.time_ms - 1.0, speedup_error=speedup_error)
    if gloo:  # NaN for the gloo baseline itself (x1 by definition) and rows without it
        out = out.assign(
            speedup_gloo_error=(out.predicted_speedup_gloo / out.speedup_gloo - 1.0).where(
                out.schedule != GLOO_BASELINE
            )
        )
    return out


def _halfwidth_pct(acc, column: str) -> float:
    """Median half-width of the measured rows' 95% intervals of `column`, in % of the median."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in acc or hi not in acc:
        return float("nan")
    rows = acc[
        acc[lo].notna()
        & acc[hi].notna()
        & (acc.schedule != "baseline" if column == "speedup" else True)
    ]
    if rows.empty:
        return float("nan")
    width = (rows[hi] - rows[column]).abs().combine((rows[column] - rows[lo]).abs(), max)
    return float((100 * width / rows[column]).median())


def summary(acc) -> dict:
    if acc.empty:
        return {"points": 0}
    agree = total = 0
    for _, point in acc.groupby(["world_size", "size", "shape"]):
        for (_, a), (_, b) in combinations(point.iterrows(), 2):
            if a.time_ms_min > b.time_ms_max or b.time_ms_min > a.time_ms_max:
                total += 1
                agree += (a.time_ms < b.time_ms) == (a.predicted_ms < b.predicted_ms)
    err, sp = acc.error.abs(), acc.speedup_error.abs().dropna()
    sg = (
        acc.speedup_gloo_error.abs().dropna()
        if "speedup_gloo_error" in acc
        else acc.error.iloc[0:0]
    )
    return {
        "points": len(acc),
        "median_abs_error": float(err.median()),
        "max_abs_error": float(err.max()),
        "speedup_points": len(sp),
        "median_abs_speedup_error": float(sp.median()) if len(sp) else float("nan"),
        "max_abs_speedup_error": float(sp.max()) if len(sp) else float("nan"),
        "speedup_gloo_points": len(sg),
        "median_abs_speedup_gloo_error": float(sg.median()) if len(sg) else float("nan"),
        "max_abs_speedup_gloo_error": float(sg.max()) if len(sg) else float("nan"),
        "time_repeatability_pct": _halfwidth_pct(acc, "time_ms"),
        "speedup_repeatability_pct": _halfwidth_pct(acc, "speedup"),
        "ordered_pairs": total,
        "ordered_agree": agree,
    }


def summary_line(s: dict) -> str:
    if not s.get("points"):
        return "no measured point has a prediction"
    pct = lambda x: "n/a" if x != x else f"{x:.1f}%"  # noqa: E731  (NaN: not measured)
    speedup = (
        f"speedup error (predicted/measured speedup - 1) median "
        f"{pct(100 * s['median_abs_speedup_error'])}, largest "
        f"{pct(100 * s['max_abs_speedup_error'])}"
        if s.get("speedup_points")
        else "no speedup to compare"
    )
    if s.get("speedup_gloo_points"):
        speedup += (
            f"; over the gloo baseline median "
            f"{pct(100 * s['median_abs_speedup_gloo_error'])}, largest "
            f"{pct(100 * s['max_abs_speedup_gloo_error'])}"
        )
    return (
        f"{s['points']} points: time error median {pct(100 * s['median_abs_error'])}, "
        f"largest {pct(100 * s['max_abs_error'])}; {speedup}; machine repeatability "
        f"(median 95% interval) time +-{pct(s['time_repeatability_pct'])}, speedup "
        f"+-{pct(s['speedup_repeatability_pct'])}; schedules ordered as measured in "
        f"{s['ordered_agree']} of {s['ordered_pairs']} pairs whose measured spreads do not "
        f"overlap"
    )


def _pct(x) -> str:
    return "" if x != x else f"{100 * x:+.1f}%"


def _x(x) -> str:
    """A speedup, or nothing where the experiment has none (calibrate's benchmarks)."""
    return "" if x != x else f"x{x:.3f}"


def accuracy_table(acc) -> str:
    gloo = "speedup_gloo_error" in acc
    lines = [
        "| schedule | ranks | size | measured ms [min, max] | predicted ms | time error "
        "| measured speedup [95%] | predicted speedup | speedup error |"
        + (" measured / predicted over gloo | error |" if gloo else ""),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if gloo else ""),
    ]
    several = "comm" in acc and acc["comm"].dropna().nunique() > 1  # comm=shm's collectives
    for _, r in acc.sort_values(["world_size", "size", "schedule"]).iterrows():
        name = f"{r.schedule} ({r['comm']})" if several else r.schedule
        ci = (
            f" [{r.speedup_lo:.3f}, {r.speedup_hi:.3f}]"
            if "speedup_lo" in r and r.speedup_lo == r.speedup_lo
            else ""
        )
        over = (
            f" x{r.speedup_gloo:.3f} / x{r.predicted_speedup_gloo:.3f} | "
            f"{_pct(r.speedup_gloo_error)} |"
            if gloo
            else ""
        )
        size = _bytes(r["size"]) if r.experiment == "collectives" else _size(r["size"])
        lines.append(
            f"| {name} | {r.world_size} | {size} | "
            f"{r.time_ms:.2f} [{r.time_ms_min:.2f}, {r.time_ms_max:.2f}] | "
            f"{r.predicted_ms:.2f} | {100 * r.error:+.1f}% | {_x(r.speedup)}{ci} | "
            f"{_x(r.predicted_speedup)} | {_pct(r.speedup_error)} |{over}"
        )
    return "\n".join(lines) + "\n"


def speedup_table(df, experiment: str, topology: str) -> str:
    """Predicted speedup over baseline per point (rows) and schedule (columns)."""
    rows = df[
        (df.experiment == experiment) & (df.source == "predicted") & (df.topology == topology)
    ]
    if rows.empty:
        return ""
    schedules = [s for s in dict.fromkeys(rows.schedule) if s != "baseline"]
    head = "| ranks | point | baseline ms | " + " | ".join(schedules) + " |"
    lines = [head, "|---:|---|---:|" + "---:|" * len(schedules)]
    for (ws, size, shape), point in rows.groupby(["world_size", "size", "shape"], sort=True):
        by = point.set_index("schedule")
        base = by.time_ms.get("baseline", float("nan"))
        label = _size(size) if str(shape).startswith("[") else str(shape)
        cells = [f"x{by.speedup[s]:.2f}" if s in by.index else "" for s in schedules]
        lines.append(f"| {ws} | {label} | {base:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def accuracy_figure(acc, path, title: str = "") -> Path:
    fig, ax = pyplot().subplots(figsize=(5.5, 5))
    for schedule, part in acc.groupby("schedule"):
        ax.errorbar(
            part.time_ms,
            part.predicted_ms,
            fmt="o",
            color=colour(schedule),
            xerr=[part.time_ms - part.time_ms_min, part.time_ms_max - part.time_ms],
            label=schedule,
            ms=4,
            capsize=2,
        )
    if not acc.empty:
        lo = min(acc.time_ms_min.min(), acc.predicted_ms.min()) * 0.8
        hi = max(acc.time_ms_max.max(), acc.predicted_ms.max()) * 1.25
        xs = [lo, hi]
        ax.plot(xs, xs, color="black", lw=0.8)
        for f in (0.75, 1.25):
            ax.plot(xs, [f * x for x in xs], color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured time per step (ms; bars: min..max)")
    ax.set_ylabel("predicted time per step (ms)")
    ax.set_title(title or "predicted vs measured (dashed: +-25%)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)


def busbw_figure(df, path) -> Path:
    rows = df[df.experiment == "collectives"]
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2))
    comm = rows["comm"].fillna("") if "comm" in rows else ""  # comm=shm: a line per transport
    for (kind, source, topo, via), part in rows.assign(via=comm).groupby(
        ["schedule", "source", "topology", "via"]
    ):
        part = part.sort_values("size")
        ax.plot(
            part["size"],
            part.busbw_gbps,
            marker="o",
            ms=3,
            ls="-" if source == "measured" else "--",
            label=f"{kind} {source}{' ' + via if via else ''} ({topo})",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes, nccl-tests convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, path)


def busbw_table(df) -> str:
    """Bus bandwidth (GB/s) per collective and size: measured and predicted side by side."""
    rows = df[df.experiment == "collectives"]
    out = []
    for kind, part in rows.groupby("schedule", sort=False):
        via = (
            part["comm"].map(lambda c: f" {c}" if isinstance(c, str) else "")
            if "comm" in part
            else ""
        )  # comm=shm: a column per transport, never averaged
        part = part.assign(
            column=part.source
            + via
            + " "
            + part.topology
            + " ("
            + part.world_size.astype(str)
            + ")"
        )
        pivot = part.pivot_table(index="size", columns="column", values="busbw_gbps", sort=False)
        cols = list(pivot.columns)
        out += [
            f"### {kind}: bus bandwidth (GB/s)",
            "",
            "| bytes | " + " | ".join(cols) + " |",
            "|---:|" + "---:|" * len(cols),
        ]
        for size, r in pivot.sort_index().iterrows():
            cells = ["" if r[c] != r[c] else f"{r[c]:.3g}" for c in cols]
            out.append(f"| {_bytes(size)} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def _bytes(n) -> str:
    n = int(n)
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def breakdown_table(df, experiment: str, topology: str) -> str:
    rows = df[
        (df.experiment == experiment) & (df.source == "predicted") & (df.topology == topology)
    ]
    if rows.empty or "algo" not in rows or rows.algo.isna().all():
        return ""
    lines = [
        "| ranks | point | schedule | speedup | compute ms | comm hidden ms | comm exposed ms "
        "| collectives (algorithm/protocol) |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows.fillna({"overlapped_ms": 0.0, "algo": "", "proto": ""}).itertuples():
        label = _size(r.size) if str(r.shape).startswith("[") else str(r.shape)
        picks = ", ".join(
            f"{a}/{p}" if p else a
            for a, p in zip(str(r.algo).split(";"), str(r.proto).split(";"))
            if a
        )
        lines.append(
            f"| {r.world_size} | {label} | {r.schedule} | x{r.speedup:.2f} | "
            f"{r.compute_ms:.3f} | {r.overlapped_ms:.3f} | {r.comm_ms:.3f} | {picks} |"
        )
    return "\n".join(lines) + "\n"


def paper_section(df, experiment: str) -> str:
    paper = df[(df.experiment == experiment) & (df.source == "paper")]
    if paper.empty:
        return ""
    lines = [
        "## The paper's published results",
        "",
        "From secondary sources (see each caveat): beside them, this run's predicted speedup "
        "of the same schedule on the paper's cluster (dgx2) and its measured one, over "
        "their points (min .. max).",
        "",
        "| schedule | paper | predicted (dgx2) | measured | result | where | caveat |",
        "|---|---:|---:|---:|---|---|---|",
    ]

    def span(source: str, schedule: str, **where) -> str:
        rows = df[(df.experiment == experiment) & (df.source == source) & (df.schedule == schedule)]
        for k, v in where.items():
            rows = rows[rows[k] == v]
        if rows.empty:
            return "-"
        return f"x{rows.speedup.min():.2f} .. x{rows.speedup.max():.2f}"

    for r in paper.itertuples():
        top = r.speedup_max if r.speedup_max == r.speedup_max else r.speedup
        value = f"x{r.speedup:.2f}" + (f" .. x{top:.2f}" if top != r.speedup else "")
        lines.append(
            f"| {r.schedule} | {value} | {span('predicted', r.schedule, topology='dgx2')}"
            f" | {span('measured', r.schedule)} | {r.note} | {r.reference} | "
            f"{r.caveat} |"
        )
    return "\n".join(lines) + "\n"


def scales_note(rows) -> str:
    """What the local prediction did about the machine's spells (`note` "memory xS comm xC" of
    its rows: `experiments.predict.memory_scale`, `comm_scale`), or nothing where no point was
    scaled."""
    local = rows[rows.topology == "local"]
    if "note" not in local or local.empty:
        return ""
    text = ""
    for word, what in (
        (
            "memory",
            "Memory rate: at {n} point(s) the local prediction scaled the "
            "calibrated memory rates by how fast the run's own baseline ran its "
            "optimizer step (or the library step timed beside it, `probe_ms`) "
            "against calibration's (`library_<routine>`): {span} "
            "(`experiments.predict.memory_scale`).\n",
        ),
        (
            "comm",
            "Communication rate: at {n} point(s) the local prediction scaled "
            "the calibrated links by how fast an all-reduce of 8 MiB timed in the "
            "point's rounds ran (`comm_probe_ms`) against calibration's measured time "
            "for it: {span} (`experiments.predict.comm_scale`).\n",
        ),
    ):
        got = local.note.astype(str).str.extract(rf"\b{word} x([0-9.]+)")[0].dropna()
        if got.empty:
            continue
        scales = got.astype(float)
        n = len(local.loc[got.index, ["world_size", "shape"]].drop_duplicates())
        text += what.format(n=n, span=f"x{scales.min():.2f} .. x{scales.max():.2f}")
    return text


def predicted_section(df, experiment: str, out_dir: Path) -> str:
    """report.md's predicted part: speedup tables per topology, predicted vs measured."""
    if experiment == "validate":
        return validation_section(df, out_dir)
    if experiment == "training":
        return training_section(df, out_dir)
    rows = df[(df.experiment == experiment) & (df.source == "predicted")]
    if rows.empty:
        return ""
    if experiment == "collectives":  # bus bandwidth, not speedups: measured beside predicted
        fig = busbw_figure(df, out_dir / "figures" / "busbw.png")
        text = [
            "## Bus bandwidth",
            "",
            "Measured on local ranks and predicted by the cost model "
            "(`cost_model/`, SimPy) on each topology, as nccl-tests counts it:",
            "",
            busbw_table(df),
            f"![busbw](figures/{fig.name})",
            "",
        ]
        return "\n".join(text + _accuracy_section(df, experiment, out_dir, rows)) + "\n"
    text = [
        "## Predicted",
        "",
        "The cost model (`cost_model/`, SimPy) on each topology: speedup over the predicted "
        "`baseline` at the same point.",
        "",
        BASELINE_NOTE,
        "",
    ]
    if "speedup" in rows and rows.speedup.notna().any():
        for topo in dict.fromkeys(rows.topology):
            text += [f"### {topo}", "", speedup_table(df, experiment, topo)]
            if topo == "local":
                continue
            part = df[df.topology == topo]
            fig = breakdown_figure(
                part,
                experiment,
                out_dir / "figures" / f"{experiment}_{topo}_breakdown.png",
                source="predicted",
            )
            notes = part.note.dropna().astype(str) if "note" in part else []
            fabric = next((n for n in notes if n.startswith("fabric: ")), "")
            text += [
                f"Where the time goes on {topo} (predicted; compute, communication hidden "
                "behind it, communication exposed; the algorithm and protocol NCCL's tuner "
                "picks for each collective):",
                "",
                breakdown_table(df, experiment, topo),
                *([fabric[0].upper() + fabric[1:] + ".", ""] if fabric else []),
                f"![{topo} breakdown](figures/{fig.name})",
                "",
            ]
    text += [paper_section(df, experiment), authors_section(df, experiment, out_dir)]
    return "\n".join(text + _accuracy_section(df, experiment, out_dir, rows)) + "\n"


def _accuracy_section(df, experiment: str, out_dir: Path, rows) -> list[str]:
    """## Predicted vs measured (local topology): the summary line, the table, the figure."""
    acc = accuracy(df, experiment)
    if acc.empty:
        return []
    fig = accuracy_figure(
        acc, out_dir / "figures" / "predicted_vs_measured.png", f"{experiment}: local topology"
    )
    return [
        "## Predicted vs measured",
        "",
        summary_line(summary(acc)),
        "",
        scales_note(rows),
        accuracy_table(acc),
        f"![predicted vs measured](figures/{fig.name})",
        "",
    ]
