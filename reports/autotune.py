"""The autotune report section and its figure, from two tables alone (nothing is re-run).

    text = autotune_section(results, ranking, out_dir, top_m)

`results` is the run's results table (measured and predicted rows of the tuned experiment);
`ranking` is the autotuner's table (`autotune.csv`: per point, every candidate with its predicted
rank and time in microseconds, whether it is a named schedule of the paper, the space's size and the
search time). Per point the section gives:

- the chosen schedule: the measured best of the point's top `top_m` predicted candidates where the
  point was measured, else the predicted best;
- its predicted time (the autotuner's) and measured time (median); the runner-up;
- the best named schedule (measured where measured, else predicted) and its time;
- how far the chosen schedule is from the best measured schedule of the point (any schedule);
- the predicted rank against the measured rank of every measured schedule.

The figure (`figures/autotune.png`) draws the best-of-schedules speedup over the baseline against
the point (the paper's "CoCoNeT" line, Fig. 10), predicted and measured, beside each named schedule.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .figures import _save, colour, plt


def _measured(results: pd.DataFrame, shape: str, world: int) -> pd.Series:
    """schedule -> measured median ms at the point (baseline excluded)."""
    m = results[(results.source == "measured") & (results["shape"].astype(str) == shape)
                & (results.world_size == world) & (results.schedule != "baseline")]
    return m.groupby("schedule").time_ms.median()


def _point(results: pd.DataFrame, part: pd.DataFrame, top_m: int) -> dict:
    shape, world = str(part["shape"].iloc[0]), int(part.world_size.iloc[0])
    part = part.sort_values("predicted_rank")
    measured = _measured(results, shape, world)
    predicted_ms = dict(zip(part.schedule, part.predicted_us / 1e3))
    top = [s for s in part.schedule[:top_m]]
    tried = [s for s in top if s in measured.index]
    order = sorted(tried, key=lambda s: measured[s]) if tried else top
    named = part[part.named.astype(bool)]
    times = measured if tried else pd.Series(predicted_ms)
    best_named = min(named.schedule, key=lambda s: times.get(s, float("inf")), default=None)
    ranks = {s: (int(part.set_index("schedule").predicted_rank[s]), k)
             for k, s in enumerate(sorted(measured.index, key=lambda s: measured[s]))
             if s in set(part.schedule)}
    best_any = float(measured.min()) if len(measured) else None
    chosen = order[0]
    return {"shape": shape, "world": world, "chosen": chosen,
            "runner_up": order[1] if len(order) > 1 else "",
            "predicted_ms": predicted_ms.get(chosen), "measured_ms": measured.get(chosen),
            "best_named": best_named, "best_named_ms": times.get(best_named),
            "gap": (measured[chosen] / best_any - 1) if tried and best_any else None,
            "ranks": ranks, "found": int(part.found.iloc[0]),
            "candidates": int(part.candidates.iloc[0]), "search_s": float(part.search_s.iloc[0])}


def _ms(x) -> str:
    return "" if x is None or pd.isna(x) else f"{x:.3f}"


def autotune_section(results: pd.DataFrame, ranking: pd.DataFrame, out_dir: Path,
                     top_m: int) -> str:
    if ranking.empty:
        return ""
    points = [_point(results, part, top_m) for _, part in
              ranking.groupby(["world_size", "shape"], sort=False)]
    p0 = points[0]
    lines = ["## Autotune", "",
             f"The space: {p0['found']} schedules reached by split, reorder, as_slice, fuse and "
             f"overlap; {p0['candidates']} candidates ranked per point on "
             f"{ranking.topology.iloc[0]} ({ranking.world_size.iloc[0]} ranks) by the closed form,"
             f" the best re-ranked by the DES; search {max(p['search_s'] for p in points):.1f} s "
             f"per point at most. The top {top_m} of each point and the paper's named schedules "
             "were measured side by side where this backend measures; the chosen schedule is the "
             "measured best of the point's top candidates, else the predicted best.", "",
             "| point | chosen | predicted ms | measured ms | runner-up | best named | its ms |"
             " chosen vs best measured |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        gap = "" if p["gap"] is None else f"{p['gap'] * 100:+.1f}%"
        lines.append(f"| {p['shape']} | {p['chosen']} | {_ms(p['predicted_ms'])} | "
                     f"{_ms(p['measured_ms'])} | {p['runner_up']} | {p['best_named']} | "
                     f"{_ms(p['best_named_ms'])} | {gap} |")
    measured_ranks = [p for p in points if p["ranks"]]
    if measured_ranks:
        lines += ["", "Predicted rank -> measured rank of each measured schedule (0 = fastest):", ""]
        for p in measured_ranks:
            pairs = ", ".join(f"{s} {a}->{b}" for s, (a, b) in
                              sorted(p["ranks"].items(), key=lambda kv: kv[1][1]))
            lines.append(f"- {p['shape']}: {pairs}")
    beyond = [p for p in points if p["chosen"] != p["best_named"]]
    if beyond:
        lines += ["", "Points where the chosen schedule is not one of the paper's named ones "
                  "(its program is printed with the others above): "
                  + ", ".join(f"{p['shape']}: {p['chosen']}" for p in beyond) + "."]
    figure = best_of_figure(results, ranking, Path(out_dir) / "figures" / "autotune.png")
    if figure:
        lines += ["", f"![best of schedules]({figure.relative_to(out_dir)})"]
    return "\n".join(lines) + "\n"


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
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(order))
    for label, part, style in (("best of schedules (predicted)", pred, "-"),
                               ("best of schedules (measured)", meas, "--")):
        best = part.groupby(part["shape"].astype(str)).speedup.max()
        if len(best):
            ax.plot(xs, [best.get(s, float("nan")) for s in order], style, color="black",
                    lw=2, label=label)
    for name in sorted(named):
        line = pred[pred.schedule == name].groupby(pred["shape"].astype(str)).speedup.max()
        if len(line):
            ax.plot(xs, [line.get(s, float("nan")) for s in order], ":", color=colour(name),
                    label=f"{name} (predicted)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), order, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speedup over baseline")
    ax.set_title(f"autotune: best of schedules, {topo}")
    ax.legend(fontsize=7)
    return _save(fig, path)
