"""A generated step's own cost at one rank, where nothing is communicated: launch and host
overhead against the kernels, on a GPU or the CPU.

    python -m benchmarks.one_rank [--backend cuda|cpu] [--sizes 16,24] [--reps 50] [--graph]
                                  [--profile]

Starts a one-rank process group (NCCL with `--backend cuda`, gloo with `cpu`), and for each size
2^k (elements) times `dist.all_reduce` + `torch.optim.Adam(fused=True)` (the baseline) and every
Adam schedule (`coconet.programs.optimizer_schedules`, each built with `coconet.compile` on its
own buffers), each call with the device synchronised before and after it: 20 warm-up calls, then
the median of `--reps` calls, in ms, and the baseline's time over the schedule's (x). With
`--graph`, each schedule's step is captured as one CUDA graph and replayed
(`codegen.runtime.graph.StepGraph`; eager where it cannot be, the reason printed), and each line
adds the host time to issue one step (`host_us`: perf_counter around the call alone, median).
With `--profile`, a cProfile of `--reps` calls of fuse(RS-C-AG)+as_slice at the smallest size, by
own time: where the host spends a call (per-chunk library calls, stream switches, events).
Nothing is asserted; one rank cannot show what overlap gains, only what a step costs before it.
`scripts/gpu_figures.py` reuses `timed`, `host_us`, `baseline_step` and `schedule_steps`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

FUSED = "fuse(RS-C-AG)+as_slice"


def timed(fn, sync, warm: int = 20, reps: int = 50) -> float:
    """Median ms of `reps` calls of fn, each synchronised before and after, after `warm` calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def host_us(fn, sync, reps: int = 50) -> float:
    """Median us the host takes to issue one call of fn (the device idle before each call)."""
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    sync()
    return statistics.median(times)


def baseline_step(n: int, device) -> Callable[[], None]:
    """The library baseline on n elements: all_reduce of the gradient, torch's fused Adam."""
    p = torch.zeros(n, device=device, requires_grad=True)
    p.grad = torch.randn(n, device=device)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    return lambda: (dist.all_reduce(p.grad), opt.step())


def schedule_steps(n: int, backend: str, graph: bool = False) -> dict:
    """{schedule: (step callable, why it runs eagerly or None)} of every Adam schedule on n
    elements, each compiled on its own buffers; with `graph`, captured (StepGraph) first."""
    import coconet
    from coconet.programs import adam_program, optimizer_schedules
    from codegen.runtime.graph import StepGraph

    out = {}
    for name, program in optimizer_schedules(adam_program()).items():
        step = coconet.compile(program, None, {"N": n}, backend=backend)
        if graph:
            g = StepGraph.capture(step.runner)
            out[name] = (g.run, g.reason)
        else:
            out[name] = (step, "not asked (--graph)")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--sizes", default="16,24", help="log2 of the element counts, comma-separated")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--graph", action="store_true", help="replay each step as one CUDA graph")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    gpu = args.backend == "cuda"
    dist.init_process_group("nccl" if gpu else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    profiled = None  # fuse(RS-C-AG)+as_slice at the smallest size
    try:
        for k in sorted(int(x) for x in args.sizes.split(",")):
            base = timed(baseline_step(1 << k, device), sync, reps=args.reps)
            print(f"N=2^{k}: baseline (all_reduce + fused Adam) {base:.3f} ms", flush=True)
            for name, (step, eager) in schedule_steps(1 << k, args.backend, args.graph).items():
                t = timed(step, sync, reps=args.reps)
                extra = (
                    f"  host {host_us(step, sync, args.reps):.1f} us "
                    f"{'graph' if eager is None else 'eager: ' + eager}"
                    if args.graph
                    else ""
                )
                print(f"  {name:24s} {t:8.3f} ms  x{base / t:.2f}{extra}", flush=True)
                if name == FUSED and profiled is None:
                    profiled = step
        if args.profile and profiled is not None:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.reps):
                profiled()
            sync()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
            print(f"cProfile, {args.reps} calls of {FUSED}, by own time:")
            print(out.getvalue())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
