"""`python -m suite.compare DIR [DIR ...] [--out FILE]`: compare run directories.

Reads each DIR/results.csv (a sweep's DIR: every job's DIR/*/results.csv together, so the results
of every job of a `-m` sweep, on SLURM too, are gathered), matches the points present in the first run and in each other run
(same experiment, schedule, source, topology, world size, size, shape and dtype), and prints one
row per point: the median time in each run and its ratio to the first run's (> 1: slower than the
first). Writes the same table as Markdown to FILE (default: comparison.md in the current
folder). A missing or unreadable results.csv ends with a one-line error and exit status 2.
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


def load(run_dir: str):
    import pandas as pd

    df = pd.concat([pd.read_csv(p) for p in results_files(run_dir)], ignore_index=True)
    for k in KEY:
        if k not in df:
            df[k] = ""
    return df[KEY + ["time_ms"]].fillna("").drop_duplicates(KEY, keep="last")


def compare(dirs: list[str]):
    frames = [load(d) for d in dirs]
    table = frames[0].rename(columns={"time_ms": "time_ms[0]"})
    for i, df in enumerate(frames[1:], start=1):
        table = table.merge(df.rename(columns={"time_ms": f"time_ms[{i}]"}), on=KEY, how="inner")
        table[f"ratio[{i}]"] = table[f"time_ms[{i}]"] / table["time_ms[0]"]
    return table


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
    ap.add_argument("--out", default="comparison.md")
    args = ap.parse_args(argv)
    try:
        table = compare(args.dirs)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if table.empty:
        print("no matching points between the runs")
    else:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    Path(args.out).write_text(to_markdown(table, args.dirs))
    print(f"comparison: {args.out} ({len(table)} matching points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
