"""GPU check of the CUDA backend: verify every experiment's schedules, benchmark the generated
optimizer kernels against torch and against the memory bandwidth of a device-to-device copy.

    python scripts/gpu_check.py                  # every GPU here; Adam/LAMB at 2^28 elements
    python scripts/gpu_check.py --log2-size 24 --repeats 20 --experiments adam_fusion

1. Verify: every schedule of every experiment (or `--experiments`) runs on `--world-size` NCCL
   ranks (default: every GPU; one rank per GPU) at the experiment's verification bindings
   (`--scale`), through `codegen.runtime.cuda_execute.CudaPlanRunner`, and its outputs are compared
   with `dsl.interpret` of the schedule on the same inputs (suite.cuda.make_cases / run_cases).
   A program whose pipeline stages do not divide the world size is skipped, with a line.
2. Benchmark on GPU 0, N = 2^log2-size f32 elements (default 28: 1 GiB per tensor; Adam needs about
   10 GiB of GPU memory at that size, LAMB about 12): a device-to-device copy; the generated Adam
   kernel (the one kernel of the `AR-C` schedule's plan at world size 1); `torch.optim.Adam(fused=
   True)`; the generated LAMB kernels (those of `AR-C`, in order); LAMB as torch operations
   (as `experiments._dp_measure.lamb_step`). Each: `--warmup` untimed runs, then the median of
   `--repeats` runs timed with CUDA events. GB/s = bytes moved / time, the bytes counted as the
   lowering counts them (every tensor read and written once; Adam: 7 x 4N, copy: 2 x 4N), and the
   share of the copy's GB/s.
Exit status: 0 when every schedule verified, 1 when one did not, 2 when there is no GPU or bad
arguments (one line).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import experiments  # noqa: E402
from codegen.lower import lower  # noqa: E402
from codegen.plan import Compute, Plan, walk  # noqa: E402
from suite.cuda import program_experiments  # noqa: E402


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    names = program_experiments()
    p.add_argument("--experiments", nargs="+", default=names, choices=names, metavar="NAME",
                   help=f"experiments to verify (default: all of {', '.join(names)})")
    p.add_argument("--world-size", type=_positive, default=None,
                   help="ranks, one per GPU (default: every GPU here)")
    p.add_argument("--scale", choices=("smoke", "default", "paper"), default="default",
                   help="which verification bindings of each experiment (default: default)")
    p.add_argument("--log2-size", type=_positive, default=28,
                   help="benchmark tensors of 2^K f32 elements (default: 28)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default: 3)")
    p.add_argument("--repeats", type=_positive, default=10, help="timed runs (default: 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-verify", action="store_true", help="benchmark only")
    p.add_argument("--skip-bench", action="store_true", help="verify only")
    return p.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


# -- what is benchmarked (pure: no GPU needed) -------------------------------------------------------
def optimizer_plan(optimizer: str, n: int) -> tuple[Plan, list[Compute]]:
    """The AR-C plan of `optimizer` (adam | lamb) at N = n, world size 1, and its kernel steps."""
    program = experiments.load(f"{optimizer}_fusion").program()
    plan = lower(program, {"N": n}, 1)
    return plan, [s for s in walk(plan.steps) if isinstance(s, Compute)]


def bytes_moved(computes: list[Compute]) -> int:
    return sum(c.nbytes for c in computes)


def gbps(nbytes: int, time_ms: float) -> float:
    return nbytes / (time_ms * 1e-3) / 1e9


# -- 1. verification ---------------------------------------------------------------------------------
def verify(names: list[str], world: int, scale: str, seed: int) -> int:
    """Verify every schedule; returns how many failed."""
    from suite.cuda import make_cases, run_cases

    failed = 0
    for name in names:
        exp = experiments.load(name)
        for sched, program in exp.schedules().items():
            label = f"{name}:{sched}"
            if world % program.stages:
                print(f"  {label:<46} skipped: {program.stages} pipeline stages do not divide "
                      f"{world} rank(s)", flush=True)
                continue
            cases = make_cases(program, exp.verify_bindings(scale) or [None], world, seed)
            results = run_cases(cases, world)
            bad = [msg for _, err, msg in results if err is None]
            worst = max((err for _, err, _ in results if err is not None), default=0.0)
            failed += bool(bad)
            print(f"  {label:<46} P={world} {'FAILED ' + bad[0] if bad else 'verified'} "
                  f"(max abs error {worst:.2e}, {len(results)} bindings)", flush=True)
    return failed


# -- 2. benchmarks -----------------------------------------------------------------------------------
def median_ms(fn: Callable[[], None], warmup: int, repeats: int) -> float:
    from codegen.runtime.cuda_execute import time_cuda
    return statistics.median(time_cuda(fn, warmup, repeats).times_ms)


def bench_generated(optimizer: str, n: int, warmup: int, repeats: int) -> tuple[float, int]:
    """(median ms, bytes) of the generated kernels of `optimizer`'s AR-C plan, on GPU 0."""
    import numpy as np
    import torch

    from codegen import build_cuda
    from codegen.runtime.cuda_execute import CudaPlanRunner

    plan, computes = optimizer_plan(optimizer, n)
    kernels = build_cuda.build([c.kernel for c in computes], name=f"gpu_check_{optimizer}")
    runner = CudaPlanRunner(plan, 0, kernels, None, device=0)
    rng = np.random.default_rng(0)
    for name in ("g", "w", "m"):
        runner.input(name).copy_(torch.from_numpy(rng.standard_normal(n, dtype=np.float32)))
    runner.input("v").uniform_(0.0, 1.0)
    for c in computes:  # the all-reduce of one rank is a copy: give the kernels its result
        for a in c.kernel.reads:
            if runner.plan.buffer(a.buffer).name == "g.sum":
                runner.bufs[a.buffer].copy_(runner.input("g"))
    time_ms = median_ms(lambda: runner.run(computes), warmup, repeats)
    del runner
    return time_ms, bytes_moved(computes)


def bench_torch_adam(n: int, warmup: int, repeats: int) -> tuple[float, int]:
    import torch

    w = torch.randn(n, device="cuda", requires_grad=True)
    w.grad = torch.randn(n, device="cuda")
    opt = torch.optim.Adam([w], lr=1e-3, fused=True)
    time_ms = median_ms(opt.step, warmup, repeats)
    return time_ms, 7 * 4 * n  # reads w, g, m, v; writes w, m, v


def bench_torch_lamb(n: int, warmup: int, repeats: int) -> tuple[float, int]:
    """LAMB as a practitioner writes it in torch (as experiments._dp_measure.lamb_step)."""
    import torch

    w, g = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    m, v = torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")
    one = torch.ones((), device="cuda")
    hp = {"lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "wd": 0.01, "t": 0}

    @torch.no_grad()
    def step():
        hp["t"] += 1
        m.mul_(hp["b1"]).add_(g, alpha=1 - hp["b1"])
        v.mul_(hp["b2"]).addcmul_(g, g, value=1 - hp["b2"])
        u = (m / (1 - hp["b1"] ** hp["t"])).div_((v / (1 - hp["b2"] ** hp["t"])).sqrt_().add_(hp["eps"]))
        u.add_(w, alpha=hp["wd"])
        r_w, r_u = w.norm(), u.norm()
        trust = torch.where(r_w > 0, torch.where(r_u > 0, r_w / r_u, one), one)
        w.sub_(hp["lr"] * trust * u)

    _, computes = optimizer_plan("lamb", n)  # the same bytes as the generated kernels
    return median_ms(step, warmup, repeats), bytes_moved(computes)


def bench_copy(n: int, warmup: int, repeats: int) -> tuple[float, int]:
    import torch

    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    return median_ms(lambda: dst.copy_(src), warmup, repeats), 2 * 4 * n


def bench(args: argparse.Namespace) -> None:
    import torch

    n = 1 << args.log2_size
    print(f"benchmark on {torch.cuda.get_device_name(0)}, N = 2^{args.log2_size} f32, median of "
          f"{args.repeats} (CUDA events)", flush=True)
    rows = [("device-to-device copy", bench_copy),
            ("generated Adam (AR-C kernel)", lambda *a: bench_generated("adam", *a)),
            ("torch.optim.Adam(fused=True)", bench_torch_adam),
            ("generated LAMB (AR-C kernels)", lambda *a: bench_generated("lamb", *a)),
            ("torch LAMB (torch operations)", bench_torch_lamb)]
    copy_gbps = None
    print(f"  {'':<36} {'time_ms':>9} {'GB/s':>8} {'of copy':>8}")
    for label, fn in rows:
        time_ms, nbytes = fn(n, args.warmup, args.repeats)
        rate = gbps(nbytes, time_ms)
        copy_gbps = copy_gbps or rate
        print(f"  {label:<36} {time_ms:9.3f} {rate:8.1f} {rate / copy_gbps:8.0%}", flush=True)
        torch.cuda.empty_cache()


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus:
        print(f"gpu_check: no GPU here (torch {torch.__version__}, CUDA "
              f"{torch.version.cuda or 'none'}); nothing to check", file=sys.stderr)
        return 2
    world = args.world_size or gpus
    if world > gpus:
        print(f"gpu_check: --world-size {world} needs {world} GPUs, {gpus} here", file=sys.stderr)
        return 2
    failed = 0
    if not args.skip_verify:
        print(f"verify: {', '.join(args.experiments)} at world size {world} ({args.scale} "
              "bindings)", flush=True)
        failed = verify(args.experiments, world, args.scale, args.seed)
    if not args.skip_bench:
        bench(args)
    print("FAILED: a schedule did not verify" if failed else "gpu_check: done", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
