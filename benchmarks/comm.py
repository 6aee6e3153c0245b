"""Micro-benchmark of the runtime's collectives against gloo's own, on local ranks.

    python -m benchmarks.comm --sizes 1M,16M,64M --world 2 [--dtype float32]
        [--chunks 1,4] [--warmup 2] [--repeats 5]

A size is the element count of the whole buffer, as nccl-tests counts it: the all-reduce tensor,
the reduce-scatter input (each rank keeps size/P), the all-gather output (each rank gives size/P).
Suffixes K = 2^10, M = 2^20, G = 2^30. Each timing: barrier, run, stop the clock; the time of a
repeat is the maximum over ranks; the table shows the median over repeats (after the warm-up) and
the bus bandwidth (nccl-tests' definition: all-reduce 2(P-1)/P, the others (P-1)/P times bytes
over time). `vs gloo` is gloo's reduce-scatter (or all-gather) time over this row's time: above 1
the ring wins.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from codegen.runtime import comm
from codegen.runtime.launch import launch

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    unit = text[-1] if text and text[-1] in _SUFFIX else ""
    return int(float(text[: len(text) - len(unit)]) * _SUFFIX[unit])


def _time_ms(run, warmup: int, repeats: int) -> list[float]:
    """Per repeat, the slowest rank's time in ms."""
    times = []
    for i in range(warmup + repeats):
        dist.barrier()
        start = time.perf_counter()
        run()
        elapsed = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(elapsed.item())
    return times


def _cases(size: int, P: int, dtype, chunks: list[int]):
    """(name, kind, run) for every measured operation at one size."""
    n = size // P
    full = torch.randn(size).to(dtype)  # reduce-scatter input, all-reduce buffer
    part, gathered = torch.randn(n).to(dtype), torch.empty(size, dtype=dtype)
    out = torch.empty(n, dtype=dtype)
    yield "gloo all_reduce", "ar", lambda: comm.all_reduce(full)
    full.normal_()  # fresh values after the in-place sums
    yield "gloo reduce_scatter", "rs", lambda: comm.library_reduce_scatter(full, out)
    for c in chunks:
        yield (
            f"ring reduce_scatter c{c}",
            "rs",
            lambda c=c: comm.reduce_scatter(full, out, "sum", c),
        )
    yield "gloo all_gather", "ag", lambda: comm.library_all_gather(part, gathered)
    for c in chunks:
        yield f"ring all_gather c{c}", "ag", lambda c=c: comm.all_gather(part, gathered, c)


def bench_rank(
    rank: int,
    world: int,
    sizes: list[int],
    dtype_name: str,
    chunks: list[int],
    warmup: int,
    repeats: int,
) -> list[dict]:
    """Body of each rank; returns rows (identical on every rank, times are max over ranks)."""
    dtype = getattr(torch, dtype_name)
    rows = []
    for size in sizes:
        if size % (world * max(chunks)):
            raise ValueError(f"size {size} is not a multiple of world*chunks={world * max(chunks)}")
        for name, kind, run in _cases(size, world, dtype, chunks):
            times = _time_ms(run, warmup, repeats)
            rows.append(
                {
                    "size": size,
                    "nbytes": size * dtype.itemsize,
                    "op": name,
                    "kind": kind,
                    "median_ms": statistics.median(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
            )
    return rows


def format_table(rows: list[dict], world: int) -> str:
    base = {(r["size"], r["kind"]): r["median_ms"] for r in rows if r["op"].startswith("gloo")}
    factor = {"ar": 2 * (world - 1) / world, "rs": (world - 1) / world, "ag": (world - 1) / world}
    lines = [
        (
            f"{'elements':>10} {'MB':>7}  {'operation':<22} {'median ms':>10} {'min ms':>8} "
            f"{'busbw GB/s':>10} {'vs gloo':>8}"
        )
    ]
    for r in rows:
        busbw_gbps = r["nbytes"] * factor[r["kind"]] / (r["median_ms"] * 1e-3) / 1e9
        ratio = base.get((r["size"], r["kind"]), float("nan")) / r["median_ms"]
        vs = f"{ratio:8.2f}x" if r["kind"] != "ar" else f"{'':>9}"
        lines.append(
            f"{r['size']:>10} {r['nbytes'] / 2**20:>7.0f}  {r['op']:<22} "
            f"{r['median_ms']:>10.2f} {r['min_ms']:>8.2f} {busbw_gbps:>10.2f} {vs}"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,64M", help="elements, e.g. 1M,16M,64M")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--chunks", default="1,4", help="ring chunk counts to measure")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = launch(
        bench_rank,
        args.world,
        (sizes, args.dtype, chunks, args.warmup, args.repeats),
        timeout_s=args.timeout_s,
    )[0]
    print(
        f"{args.world} ranks, {args.dtype}, median of {args.repeats} (warm-up {args.warmup}), "
        "max over ranks"
    )
    print(format_table(rows, args.world))


if __name__ == "__main__":
    main()
