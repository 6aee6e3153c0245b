"""The autotune report section and its figure, from two tables alone (nothing is re-run).

    text = autotune_section(results, ranking, out_dir, top_m)

`results` is the run's results table (measured and predicted rows of the tuned experiment);
`ranking` is the autotuner's table (`autotune.csv`: per point, every candidate with its predicted
rank and time in microseconds, whether it is a named schedule of the paper, the space's size, the
candidates ranked, the closed form's and the DES's wall seconds and the DES's count, the whole
search's seconds). The section gives:

- the search per point: schedules in the space, candidates ranked by the closed form and its time,
  candidates re-ranked by the DES and its time, the whole search (enumerate, verify, lower, rank);
- per point the predicted best (rank 0) and the chosen schedule: where the point was measured,
  the measured best of the schedules of the space measured there (the point's top `top_m`, the
  other points' top `top_m` and the paper's named schedules, side by side in one run), else the
  predicted best; its predicted time (the autotuner's) and measured time (median, 95% interval);
  the runner-up (a schedule whose measured result did not verify is neither chosen nor
  compared, and is listed); its speedup over the baseline (predicted on the ranking's topology, and
  measured); the best named schedule (measured where measured, else predicted) and its time; how
  far the predicted best and the measured best of the point's own top `top_m` are from the chosen
  (the best measured);
- the predicted rank against the measured rank of every measured schedule;
- per point, the best schedule outside the paper's named ones that beats all of them, predicted
  and measured (and how many others do), with its path of transforms and its printed program.

`tables/autotune_chosen.csv` holds the per-point table. The figure (`figures/autotune.png`) draws
the best-of-schedules speedup over the baseline against the point (the paper's "CoCoNeT" line,
Fig. 10), predicted and measured, beside each named schedule.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .figures import _save, colour, pyplot


def _rows(results: pd.DataFrame, source: str, shape: str, world: int, topology=None):
    r = results[
        (results.source == source)
        & (results["shape"].astype(str) == shape)
        & (results.world_size == world)
    ]
    return r if topology is None else r[r.topology == topology]


def _point(results: pd.DataFrame, part: pd.DataFrame, top_m: int) -> dict:
    shape, world = str(part["shape"].iloc[0]), int(part.world_size.iloc[0])
    topo = part.topology.iloc[0]
    part = part.sort_values("predicted_rank")
    meas = _rows(results, "measured", shape, world)
    wrong = (
        meas.verified.astype(str).str.lower() == "false"
        if "verified" in meas
        else pd.Series(False, index=meas.index)
    )
    failed = sorted(set(meas[wrong & (meas.schedule != "baseline")].schedule))
    ok = meas[~wrong & (meas.schedule != "baseline")]
    measured = ok.groupby("schedule").time_ms.median()  # a wrong result is never chosen
    pred = _rows(results, "predicted", shape, world, topo)
    predicted_ms = dict(zip(part.schedule, part.predicted_us / 1e3))
    runs = part[part.measurable.astype(bool)] if "measurable" in part else part
    top = list(runs.schedule[:top_m])  # the point's top m of those the run can measure
    tried = [s for s in part.schedule if s in measured.index]  # the space's measured schedules
    order = sorted(tried, key=lambda s: measured[s]) if tried else list(part.schedule[:2])
    top_best = min((s for s in top if s in measured.index), key=lambda s: measured[s], default=None)
    lo_hi = (
        meas.set_index("schedule")[["time_ms_lo", "time_ms_hi"]]
        if {"time_ms_lo", "time_ms_hi"} <= set(meas.columns)
        else None
    )
    named = list(part[part.named.astype(bool)].schedule)
    times = measured if tried else pd.Series(predicted_ms)
    order_of = dict(measured) if tried else dict(zip(part.schedule, part.predicted_rank))
    best_named = min(named, key=lambda s: order_of.get(s, float("inf")), default=None)
    ranks = {
        s: (int(part.set_index("schedule").predicted_rank[s]), k)
        for k, s in enumerate(sorted(measured.index, key=lambda s: measured[s]))
        if s in set(part.schedule)
    }
    best_any = measured.idxmin() if len(measured) else None
    chosen, predicted_best = order[0], part.schedule.iloc[0]

    def gap(s):
        return measured[s] / measured[best_any] - 1 if s in measured.index else None

    def interval(s):
        if lo_hi is None or s not in lo_hi.index:
            return None
        lo, hi = lo_hi.loc[s] if lo_hi.loc[s].ndim == 1 else lo_hi.loc[s].iloc[0]
        return None if pd.isna(lo) or pd.isna(hi) else (float(lo), float(hi))

    def speedup(rows, s):
        v = rows[rows.schedule == s].speedup
        return float(v.median()) if len(v.dropna()) else None

    first = part.iloc[0]
    return {
        "shape": shape,
        "world": world,
        "predicted_best": predicted_best,
        "chosen": chosen,
        "runner_up": order[1] if len(order) > 1 else "",
        "predicted_ms": predicted_ms.get(chosen),
        "measured_ms": measured.get(chosen),
        "measured_ci": interval(chosen),
        "top_best": top_best,
        "speedup_predicted": speedup(pred, chosen),
        "speedup_measured": speedup(meas, chosen),
        "best_named": best_named,
        "best_named_ms": times.get(best_named),
        "best_measured": best_any,
        "gap_predicted_best": gap(predicted_best),
        "gap_top_best": gap(top_best) if top_best else None,
        "gap_chosen": gap(chosen),
        "ranks": ranks,
        "failed": failed,
        "beyond_predicted": _beyond(
            dict(zip(part.schedule, part.predicted_rank)), predicted_ms, set(named)
        ),
        "beyond_measured": _beyond(dict(measured), dict(measured), set(named)),
        "found": int(first.found),
        "candidates": int(first.candidates),
        "closed_s": float(first.get("closed_s", float("nan"))),
        "des_count": int(first.get("des_count", 0)),
        "des_s": float(first.get("des_s", float("nan"))),
        "search_s": float(first.search_s),
        "paths": dict(zip(part.schedule, part.path)),
    }


def _beyond(order: dict, times: dict, named: set) -> list[tuple[str, float]]:
    """Schedules outside `named` ahead of every named one in `order` (the predicted rank: DES
    times for the best, closed-form times after them; or the measured time), best first:
    (name, its time / the best named one's)."""
    best = min((s for s in order if s in named), key=lambda s: order[s], default=None)
    if best is None:
        return []
    ahead = sorted(
        (s for s in order if s not in named and order[s] < order[best]), key=lambda s: order[s]
    )
    return [(s, times[s] / times[best]) for s in ahead]


def _ms(x) -> str:
    return "" if x is None or pd.isna(x) else f"{x:.3f}"


def _x(x) -> str:
    return "" if x is None or pd.isna(x) else f"x{x:.2f}"


def _pct(x) -> str:
    return "" if x is None or pd.isna(x) else f"{x * 100:+.1f}%"


def autotune_section(
    results: pd.DataFrame, ranking: pd.DataFrame, out_dir: Path, top_m: int
) -> str:
    if ranking.empty:
        return ""
    points = [
        _point(results, part, top_m)
        for _, part in ranking.groupby(["world_size", "shape"], sort=False)
    ]
    measured = any(p["measured_ms"] is not None and not pd.isna(p["measured_ms"]) for p in points)
    topo, world = ranking.topology.iloc[0], int(ranking.world_size.iloc[0])
    lines = [
        "## Autotune",
        "",
        f"The space of {ranking.experiment.iloc[0]}: the schedules split, reorder, as_slice, "
        f"fuse and overlap reach, deduplicated by printed IR and verified; per point on "
        f"{topo} ({world} ranks) the closed form ranks every candidate, the DES re-ranks "
        "the best. "
        + (
            f"The top {top_m} of every point and the paper's named schedules "
            "were measured side by side at every point (interleaved rounds, one "
            "run); the chosen schedule is the measured best of them, the "
            "predicted best is the cost model's rank 0."
            if measured
            else "Nothing was measured: the chosen schedule is the predicted best."
        ),
        "",
        "| point | schedules | candidates | closed form | DES re-rank | search |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p['shape']} | {p['found']} | {p['candidates']} | {p['candidates']} in "
            f"{p['closed_s']:.3f} s | {p['des_count']} in {p['des_s']:.3f} s | "
            f"{p['search_s']:.2f} s |"
        )
    lines += [
        "",
        "(search: enumerate, verify, lower and rank, wall seconds; verification is "
        "cached across points.)",
        "",
        "| point | predicted best | chosen | predicted ms | measured ms [95%] | runner-up "
        "| speedup (predicted) | speedup (measured) | best named | its ms | predicted best "
        f"vs chosen | best of own top {top_m} vs chosen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        ci = p["measured_ci"]
        ms = _ms(p["measured_ms"]) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        own = "" if p["top_best"] is None else f"{p['top_best']} {_pct(p['gap_top_best'])}"
        lines.append(
            f"| {p['shape']} | {p['predicted_best']} | {p['chosen']} | "
            f"{_ms(p['predicted_ms'])} | {ms} | {p['runner_up']} | "
            f"{_x(p['speedup_predicted'])} | {_x(p['speedup_measured'])} | "
            f"{p['best_named']} | {_ms(p['best_named_ms'])} | "
            f"{_pct(p['gap_predicted_best'])} | {own} |"
        )
    if measured:

        def worst(key):
            gaps = [p[key] for p in points if p[key] is not None]
            return f"at most {_pct(max(gaps))} over {len(gaps)} points" if gaps else "unmeasured"

        lines += [
            "",
            f"Measured against the chosen (the best measured): the predicted best "
            f"{worst('gap_predicted_best')}; the best of each point's own top {top_m} "
            f"{worst('gap_top_best')}.",
        ]
    failed = [f"{p['shape']}: {', '.join(p['failed'])}" for p in points if p["failed"]]
    if failed:
        lines += [
            "",
            "Measured but NOT VERIFIED (their generated code did not give the "
            "reference's result, so they are not chosen and not compared): "
            + "; ".join(failed)
            + ".",
        ]
    ranked = [p for p in points if p["ranks"]]
    if ranked:
        lines += [
            "",
            "Predicted rank -> measured rank of each measured schedule (0 = fastest):",
            "",
        ]
        for p in ranked:
            pairs = ", ".join(
                f"{s} {a}->{b}" for s, (a, b) in sorted(p["ranks"].items(), key=lambda kv: kv[1][1])
            )
            lines.append(f"- {p['shape']}: {pairs}")
    lines += ["", *_beyond_lines(points, ranking)]
    _write_chosen(points, Path(out_dir) / "tables" / "autotune_chosen.csv")
    figure = best_of_figure(results, ranking, Path(out_dir) / "figures" / "autotune.png")
    if figure:
        lines += ["", f"![best of schedules]({figure.relative_to(out_dir)})"]
    return "\n".join(lines) + "\n"


def _beyond_lines(points: list[dict], ranking: pd.DataFrame) -> list[str]:
    """The schedules outside the paper's named ones that beat all of them, per point, then the
    printed program of each (autotune.csv's `program`)."""
    out, shown = [], {}
    for how in ("predicted", "measured"):
        for p in points:
            ahead = p[f"beyond_{how}"]
            for s, ratio in ahead[:1]:  # the best of them; the others counted
                more = f"; {len(ahead) - 1} more" if len(ahead) > 1 else ""
                out.append(
                    f"- {p['shape']}, {how}: **{s}** ahead of every named schedule "
                    f"({ratio:.3f}x the best named one's time{more}); transforms: "
                    f"`{p['paths'].get(s, '?')}`"
                )
                shown.setdefault(s, None)
    if not out:
        return [
            "No schedule outside the paper's named ones beats all of them at any point, "
            "predicted or measured."
        ]
    text = {}
    if "program" in ranking.columns:
        programs = ranking.dropna(subset=["program"])
        programs = programs[programs.program.astype(str).str.strip() != ""]
        text = dict(zip(programs.schedule[::-1], programs.program[::-1]))  # the first row wins
    out += [""] + [f"{s}:\n\n```\n{text[s].rstrip()}\n```\n" for s in shown if s in text]
    return [
        "Schedules outside the paper's named ones that beat all of them (predicted: ranked "
        "above every named one; the DES times the best, the closed form the rest):",
        "",
        *out,
    ]


def _write_chosen(points: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = (
        "shape",
        "world",
        "found",
        "candidates",
        "closed_s",
        "des_count",
        "des_s",
        "search_s",
        "predicted_best",
        "chosen",
        "runner_up",
        "predicted_ms",
        "measured_ms",
        "speedup_predicted",
        "speedup_measured",
        "best_named",
        "best_named_ms",
        "best_measured",
        "top_best",
        "gap_predicted_best",
        "gap_top_best",
        "gap_chosen",
    )
    pd.DataFrame([{k: p[k] for k in keep} for p in points]).to_csv(path, index=False)


def best_of_figure(results: pd.DataFrame, ranking: pd.DataFrame, path: Path):
    """Speedup over the baseline per point: the best of all schedules (predicted, measured) and
    each named schedule (predicted), on the topology the autotuner ranked on."""
    named = set(ranking[ranking.named.astype(bool)].schedule)
    topo = ranking.topology.iloc[0]
    df = results[(results.schedule != "baseline") & results.speedup.notna()]
    pred = df[(df.source == "predicted") & (df.topology == topo)]
    meas = df[df.source == "measured"]
    if pred.empty and meas.empty:
        return None
    order = list(dict.fromkeys(ranking["shape"].astype(str)))
    fig, ax = pyplot().subplots(figsize=(7, 4))
    xs = range(len(order))
    for label, part, style in (
        ("best of schedules (predicted)", pred, "-"),
        ("best of schedules (measured)", meas, "--"),
    ):
        best = part.groupby(part["shape"].astype(str)).speedup.max()
        if len(best):
            ax.plot(
                xs,
                [best.get(s, float("nan")) for s in order],
                style,
                color="black",
                lw=2,
                label=label,
            )
    for name in sorted(named):
        line = pred[pred.schedule == name].groupby(pred["shape"].astype(str)).speedup.max()
        if len(line):
            ax.plot(
                xs,
                [line.get(s, float("nan")) for s in order],
                ":",
                color=colour(name),
                label=f"{name} (predicted)",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), order, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speedup over baseline")
    ax.set_title(f"autotune: best of schedules, {topo}")
    ax.legend(fontsize=7)
    return _save(fig, path)
