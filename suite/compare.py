"""`python -m suite.compare DIR [DIR ...] [--speedup] [--out FILE]`: compare run directories.

Reads each DIR/results.csv (a sweep's DIR: every job's DIR/*/results.csv together, so the results
of every job of a `-m` sweep, on SLURM too, and of every experiment of `experiment=paper`, are
gathered), matches the points present in the first run and in each other run (same experiment,
schedule, source, topology, world size, size, shape and dtype), and prints one row per point: the
median time in each run and its ratio to the first run's (> 1: slower than the first).

`--speedup`: the measured speedups over the baseline instead (rows of source `measured`, the
baseline's own left out), one column per run, their mean, and `spread`: the largest
|speedup / mean - 1| over the runs, in % (how far a launch's median lands from the others': the
repeatability of a point across launches, where a run's own interval gives it within a launch);
then one line with the median and the largest spread over the points.

Writes the same table as Markdown to FILE (default: comparison.md in the current folder). A
missing or unreadable results.csv ends with a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KEY = ["experiment", "schedule", "source", "topology", "world_size", "size", "shape", "dtype"]


def results_files(run_dir: str) -> list[Path]:
    """A run's results.csv; for a sweep directory (`-m`, locally or on SLURM), every job's."""
    path = Path(run_dir) / "results.csv"
    if path.is_file():
        return [path]
    jobs = sorted(Path(run_dir).glob("*/results.csv"))
    if not jobs:
        raise FileNotFoundError(f"no results.csv in {run_dir} nor in its job folders")
    return jobs


def load(run_dir: str, value: str = "time_ms"):
    """The run's points (KEY) with their `value` column (NaN where a row has none)."""
    import pandas as pd

    df = pd.concat(
        [pd.read_csv(p, low_memory=False) for p in results_files(run_dir)], ignore_index=True
    )
    for k in KEY:
        if k not in df:
            df[k] = ""
    if value not in df:
        df[value] = float("nan")
    df[KEY] = df[KEY].fillna("")
    return df[KEY + [value]].drop_duplicates(KEY, keep="last")


def compare(dirs: list[str]):
    frames = [load(d) for d in dirs]
    table = frames[0].rename(columns={"time_ms": "time_ms[0]"})
    for i, df in enumerate(frames[1:], start=1):
        table = table.merge(df.rename(columns={"time_ms": f"time_ms[{i}]"}), on=KEY, how="inner")
        table[f"ratio[{i}]"] = table[f"time_ms[{i}]"] / table["time_ms[0]"]
    return table


def compare_speedups(dirs: list[str]):
    """Measured speedups of the points every run has: speedup[i] per run, mean, spread (%)."""
    table = None
    for i, df in enumerate(load(d, "speedup") for d in dirs):
        df = df[(df.source == "measured") & (df.schedule != "baseline") & df.speedup.notna()]
        df = df.drop(columns=["source"]).rename(columns={"speedup": f"speedup[{i}]"})
        table = (
            df
            if table is None
            else table.merge(df, on=[k for k in KEY if k != "source"], how="inner")
        )
    cols = [f"speedup[{i}]" for i in range(len(dirs))]
    table["mean"] = table[cols].mean(axis=1)
    table["spread"] = 100.0 * table[cols].div(table["mean"], axis=0).sub(1.0).abs().max(axis=1)
    return table.reset_index(drop=True)


def spread_line(table) -> str:
    """One line: the median and the largest spread over the points, and where the largest is."""
    worst = table.loc[table["spread"].idxmax()]
    return (
        f"speedup spread across runs: median {table['spread'].median():.1f}%, largest "
        f"{worst['spread']:.1f}% ({worst['experiment']} {worst['schedule']} at "
        f"{worst['shape'] or worst['size']})"
    )


def to_markdown(table, dirs: list[str]) -> str:
    cols = [c for c in table.columns]
    lines = ["# Comparison", ""] + [f"- run [{i}]: `{d}`" for i, d in enumerate(dirs)] + [""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.itertuples(index=False):
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suite.compare")
    ap.add_argument("dirs", nargs="+", help="run directories (each with a results.csv)")
    ap.add_argument(
        "--speedup",
        action="store_true",
        help="measured speedups per run, their mean and spread (see the module)",
    )
    ap.add_argument("--out", default="comparison.md")
    args = ap.parse_args(argv)
    try:
        table = (compare_speedups if args.speedup else compare)(args.dirs)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if table.empty:
        print("no matching points between the runs")
    else:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if args.speedup:
            print(spread_line(table))
    Path(args.out).write_text(to_markdown(table, args.dirs))
    print(f"comparison: {args.out} ({len(table)} matching points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
