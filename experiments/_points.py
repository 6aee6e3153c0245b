"""Shared by the measuring experiments: agreeing across ranks, and publishing a measured point.

`publish(row, csv_path, rank, progress, label)` appends the row to results.csv and prints the
point and a progress line (`reports.progress.Progress`: the bar and the time left), on rank 0
only, as soon as the point is measured. `progress(rank, weights, label)` makes that Progress.
`time_point(fn, warmup, repeats)` times a point (`time_ranks`, a short step repeated more).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from codegen.runtime.measure import Timing, time_ranks
from reports.progress import Progress
from reports.table import append_row

MIN_TIMED_MS, MORE_REPEATS = 300.0, 4  # a point's repeats add up to 300 ms, up to 4x repeats


def time_point(fn, warmup: int, repeats: int, clock=None) -> Timing:
    """A measured point's timing: `time_ranks` with the backend's `clock`, a short step repeated
    until its repeats take MIN_TIMED_MS (at most MORE_REPEATS x repeats), so that its median rests
    on more samples."""
    return time_ranks(fn, warmup, repeats, min_total_ms=MIN_TIMED_MS,
                      max_repeats=MORE_REPEATS * repeats, clock=clock)


def agree(ok: bool) -> bool:
    """True on every rank when it is true on every rank."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t[0])


def progress(weights, label: str) -> Progress:
    """The measurement's progress: one weight per point in the order measured (its work)."""
    return Progress(weights, label=label)


def publish(row: dict, csv_path, rank: int, bar: Progress, label: str) -> dict:
    line = bar.step(f"{label.strip()} {row['schedule']}")
    if rank == 0:
        append_row(csv_path, row)
        verdict = "verified" if row["verified"] else "NOT VERIFIED"
        print(f"  {label} {row['schedule']:24s} {row['time_ms']:9.2f} ms "
              f"[{row['time_ms_min']:.2f}, {row['time_ms_max']:.2f}]  x{row['speedup']:.2f} "
              f"{verdict}\n  {line}", flush=True)
    return row
