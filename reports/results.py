"""The results table: one row per measured, predicted or paper point (`results.csv`).

Columns (docs/ref/results-csv.md): experiment, schedule, source (measured | predicted | paper), backend,
topology, world_size, size (elements of the principal tensor, or bytes for collectives), shape,
dtype, time_ms (median), time_ms_min, time_ms_max (spread over repeats, measured rows), speedup
(baseline median / this median at the same point, source and topology), verified; measured rows
of the interleaved harness (experiments.rounds): time_ms_lo, time_ms_hi (bootstrap 95% interval
of the median time), speedup (median of the per-round paired speedups) with speedup_lo,
speedup_hi (its 95% interval), rounds, and stopped (converged: every speedup's interval within
the target; budget: the point's time ran out; rounds: the most rounds were run); and, where
known, the time split into compute_ms (kernels and matmuls), comm_ms (communication the
computation did not hide: time_ms - compute_ms) and overlapped_ms (communication hidden behind
computation), all per step; for the collectives experiment, algbw_gbps and busbw_gbps (nccl-tests'
algorithm and bus bandwidth, GB/s). Predicted rows on GPU topologies: `algo` and `proto`, the
algorithm and protocol NCCL's tuner picks for each collective (`;`-joined, in step order, where a
step has several). Rows of published or paper figures (source `published` / `paper`): their
`reference` (URL, section), `note`, `caveat`, `nccl_version`, `date`, and for a paper's range
`speedup_max`. experiment=validate adds `nodes`, `row_kind` (point | curve),
`published_busbw_gbps` and `error_pct` (predicted / published busbw - 1, in %). Measured
collectives name their transport in `comm` (gloo, shm, nccl); measured program rows with comm=shm
add `speedup_gloo` (`_lo`, `_hi`), the paired speedup over the library baseline on gloo, timed in
the same rounds (its row: schedule `baseline(gloo)`). Measured program rows say where the
ranks ran: `nodes` and `ranks_per_node` (torchrun --nnodes x --nproc_per_node; 1 x world size when
the suite starts its own ranks).
experiment=training adds `optimizer`, `step` and `loss` (loss curves), `micro_batch`,
`samples_per_s` (throughput) with its bootstrap 95% interval `samples_per_s_lo`, `_hi` (beside
those of the time and the speedup), `state_bytes`, `memory_bytes` and `memory_cap_bytes` (bytes per rank).
A measured baseline's `library_ms`: the part of its compute_ms in library calls the cost model
does not model (Megatron's tail in torch ops, beside its matmul), where the baseline keeps it;
its `probe_ms`: the median time of the library routine timed beside a baseline whose own
computation does not read the memory rate (lamb_fusion: torch's fused Adam), in the same rounds;
its `comm_probe_ms` (2 ranks and more): the mean time of an all-reduce of 8 MiB on the run's
transport timed in the same rounds, the communication rate's reference.
Measured program rows: `graphed` (True where the step ran as one replayed CUDA graph),
`graph_reason` (why it ran eagerly, '' when graphed: "no CUDA graphs on the CPU", a capture's
error, "a library baseline runs as written") and `host_us` (the host's time to issue one step,
in us: the median call's, the slowest rank's; on the CPU the step's own time).

`append_row(path, row)` appends one row at once (writing the header when the file is new; into a
file begun with other columns, by an older version, under that file's header), so a crash loses
nothing already measured. `read_table(path)` reads it back as a pandas DataFrame.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Mapping, Union

COLUMNS = (
    "experiment",
    "schedule",
    "source",
    "backend",
    "topology",
    "world_size",
    "size",
    "shape",
    "dtype",
    "time_ms",
    "time_ms_min",
    "time_ms_max",
    "time_ms_lo",
    "time_ms_hi",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "rounds",
    "stopped",
    "verified",
    "compute_ms",
    "comm_ms",
    "overlapped_ms",
    "algbw_gbps",
    "busbw_gbps",
    "algo",
    "proto",
    "nodes",
    "row_kind",
    "published_busbw_gbps",
    "error_pct",
    "speedup_max",
    "reference",
    "note",
    "caveat",
    "nccl_version",
    "date",
    "comm",
    "ranks_per_node",
    "optimizer",
    "step",
    "loss",
    "micro_batch",
    "samples_per_s",
    "samples_per_s_lo",
    "samples_per_s_hi",
    "state_bytes",
    "memory_bytes",
    "memory_cap_bytes",
    "speedup_gloo",
    "speedup_gloo_lo",
    "speedup_gloo_hi",
    "library_ms",
    "probe_ms",
    "comm_probe_ms",
    "host_us",
    "graphed",
    "graph_reason",
    "split",
)


def append_row(path: Union[str, Path], row: Mapping[str, object]) -> None:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise KeyError(f"unknown result columns {sorted(unknown)}")
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    # a file an older version began (resume=true) keeps its own columns, so rows stay aligned
    fields = COLUMNS if new else next(csv.reader(path.open(newline="")), COLUMNS)
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=fields)
    if new:
        w.writeheader()
    w.writerow({k: row.get(k, "") for k in fields})
    write_whole(path, text.getvalue().encode())


def write_whole(path: Path, data: bytes) -> None:
    """Append `data` to `path` whole or not at all: a write the disk cuts short (full, a quota)
    is taken back (the file truncated to its size before) and its OSError raised."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            os.ftruncate(fd, size)
            raise OSError(e.errno, e.strerror, str(path)) from None
    finally:
        os.close(fd)


def read_table(path: Union[str, Path]):
    import pandas as pd

    return pd.read_csv(path)
