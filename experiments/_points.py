"""Shared by the measuring experiments: agreeing across ranks, and publishing a measured point.

`publish(row, csv_path, rank, done, total, label)` appends the row to results.csv and prints one
progress line, on rank 0 only, as soon as the point is measured.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from reports.table import append_row


def agree(ok: bool) -> bool:
    """True on every rank when it is true on every rank."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t[0])


def publish(row: dict, csv_path, rank: int, done: int, total: int, label: str) -> dict:
    if rank == 0:
        append_row(csv_path, row)
        verdict = "verified" if row["verified"] else "NOT VERIFIED"
        print(f"  [{done}/{total}] {label} {row['schedule']:24s} {row['time_ms']:9.2f} ms "
              f"[{row['time_ms_min']:.2f}, {row['time_ms_max']:.2f}]  x{row['speedup']:.2f} "
              f"{verdict}", flush=True)
    return row
