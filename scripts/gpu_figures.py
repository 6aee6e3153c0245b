"""Every GPU figure of issue 53 in one command, on one H100 or H200, in well under 8 minutes.

    python scripts/gpu_figures.py                  # every check, in order
    python scripts/gpu_figures.py --list           # the checks it would run; runs nothing
    python scripts/gpu_figures.py --only graph_host,adam_kernel

One process, one GPU, a one-rank NCCL process group (world_size=1: nothing crosses a link, so
each figure is a step's own cost). Each check prints one line per figure: the check, the figure,
its value and, where the issue sets one, the target and whether it was met. The checks (`CHECKS`):

- graph_host: fuse(RS-C-AG)+as_slice of Adam at 2^16 elements, its step captured as one CUDA
  graph (`codegen.runtime.graph.StepGraph`) against the same step issued eagerly: the host time
  to issue one step (`benchmarks.one_rank.host_us`; target under 50 us) and the device time per
  step; verified: the replay's w, m, v equal the eager step's on the same random inputs.
- one_rank: fuse(RS-C-AG)+as_slice (graph, and eager) against the library baseline
  (`dist.all_reduce` + `torch.optim.Adam(fused=True)`) at 2^24 (`benchmarks.one_rank`: synchronised
  calls, median); target at least 0.95x of the baseline.
- virtual_ranks: the symmetric-memory fused kernel (`backend.comm=symm`) of
  fuse(RS-C-AG)+as_slice over P = 2, 4, 8 virtual ranks on this GPU, through
  `codegen.runtime.symm.run_virtual(plan, inputs per member, launches=1) -> (outputs per member,
  ms of the last launch)` (imported when the check runs; where it is missing the check prints
  "not available" and counts as neither pass nor failure): verified against `dsl.interpret` at
  2^18 (every element within twice its `dsl.error_bounds` bound), timed at 2^24; the figure is
  its bandwidth (`symm_bytes` over the launch's time) as a fraction of a device-to-device copy
  measured here (goal 80%).
- adam_kernel: the generated Adam kernel (the Compute step of Adam's AR-C plan) against torch's
  fused Adam (`torch.optim.Adam(fused=True)`) at 2^24: the time ratio (CUDA events over
  back-to-back calls) and the max abs error of w, m, v after one step from the same state
  (verified: within 1e-5 absolute or relative).

Exit codes: 0 every check ran and verified (a missed target is printed, not an error); 1 a result
did not verify; 2 bad arguments; 3 a check raised (its error printed in one line, the other
checks still run); 69 no GPU here (EX_UNAVAILABLE: one line saying why, nothing run; `--list`
still works). Units: us, ms, GB/s as printed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OK, NOT_VERIFIED, BAD_ARGS, CHECK_FAILED, NO_GPU = 0, 1, 2, 3, 69
FUSED = "fuse(RS-C-AG)+as_slice"
HOST_N, STEP_N, ADAM_N, SYMM_N = 1 << 16, 1 << 24, 1 << 24, 1 << 24
HOST_TARGET_US, SPEEDUP_TARGET, COPY_GOAL, ADAM_TOL = 50.0, 0.95, 0.80, 1e-5
VIRTUAL_RANKS, VERIFY_N, SYMM_CHUNKS = (2, 4, 8), 1 << 18, 4  # the harness's 4 chunks
SYMM_LAUNCHER = "codegen.runtime.symm.run_virtual"
# where the checks run: "cuda" (the command); tests run the same checks on "cpu" (gloo, wall
# clock, small sizes) to check everything but the GPU's own figures
BACKEND = "cuda"


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    target: str = ""  # "" : no target
    met: Optional[bool] = None
    verified: bool = True


@dataclass(frozen=True)
class Check:
    name: str
    what: str  # one line: the figures and their targets
    run: Callable[[], list]  # -> [Figure]


# -- measuring on the GPU ------------------------------------------------------------------------
def sync() -> None:
    import torch

    if BACKEND == "cuda":
        torch.cuda.synchronize()


def device() -> "torch.device":  # noqa: F821
    import torch

    return (
        torch.device("cuda", torch.cuda.current_device())
        if BACKEND == "cuda"
        else (torch.device("cpu"))
    )


def device_ms(fn: Callable[[], None], reps: int = 50, warm: int = 5) -> float:
    """Mean device time per call of `reps` back-to-back calls (CUDA events on the current stream;
    wall time on the CPU)."""
    import torch

    for _ in range(warm):
        fn()
    if BACKEND != "cuda":
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def fused_step(n: int):
    """(program, coconet.Step): fuse(RS-C-AG)+as_slice of Adam on n elements, for this GPU."""
    import coconet
    from coconet.programs import adam_program, sliced_schedule

    program = sliced_schedule(adam_program())
    return program, coconet.compile(program, None, {"N": n}, backend=BACKEND)


# -- the checks -----------------------------------------------------------------------------------
def graph_host() -> list:
    import numpy as np

    import dsl
    from benchmarks.one_rank import host_us
    from codegen.runtime.graph import StepGraph

    program, step = fused_step(HOST_N)
    runner = step.runner
    graph = StepGraph.capture(runner)
    inputs = dsl.random_inputs(program, 1, {"N": HOST_N}, np.random.default_rng(0))[0]
    runner.load(inputs)
    runner.run()
    eager_out = runner.outputs()
    runner.load(inputs)
    graph.run()
    same = all(np.array_equal(eager_out[k], v) for k, v in runner.outputs().items())
    eager_us, graph_us = host_us(runner.run, sync), host_us(graph.run, sync)
    how = "graph" if graph.graphed else f"eager ({graph.reason})"
    return [
        Figure("host per step, eager", f"{eager_us:.1f} us"),
        Figure(
            f"host per step, {how}",
            f"{graph_us:.1f} us",
            f"< {HOST_TARGET_US:.0f} us",
            graph.graphed and graph_us < HOST_TARGET_US,
        ),
        Figure(
            "device per step, eager / graph",
            f"{device_ms(runner.run):.4f} / {device_ms(graph.run):.4f} ms",
        ),
        Figure("graph replay == eager step (w, m, v)", str(same), verified=same),
    ]


def one_rank() -> list:
    from benchmarks.one_rank import baseline_step, timed
    from codegen.runtime.graph import StepGraph

    base = timed(baseline_step(STEP_N, device()), sync)
    _, step = fused_step(STEP_N)
    eager = timed(step.runner.run, sync)
    graph = StepGraph.capture(step.runner)
    t = timed(graph.run, sync)
    how = "graph" if graph.graphed else f"eager ({graph.reason})"
    return [
        Figure("baseline (all_reduce + fused Adam)", f"{base:.3f} ms"),
        Figure(f"{FUSED}, eager", f"{eager:.3f} ms  x{base / eager:.3f}"),
        Figure(
            f"{FUSED}, {how}",
            f"{t:.3f} ms  x{base / t:.3f}",
            f">= {SPEEDUP_TARGET}x",
            base / t >= SPEEDUP_TARGET,
        ),
    ]


def copy_gbps(nbytes: int) -> float:
    """A device-to-device copy's bandwidth (bytes read + written per second, GB/s)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device())
    dst = torch.empty_like(src)
    return 2 * nbytes / (device_ms(lambda: dst.copy_(src)) * 1e6)


def symm_bytes(step) -> int:
    """Bytes one launch of the symmetric kernel moves over its P virtual ranks: each member's n
    elements (its slice) of every tensor its kernel reads (the P members' gradient blocks, its
    own operands) and writes (its own results, its pushes into the P members' destinations), at
    the gradient's element size (the optimizers are f32 throughout)."""
    k = step.kernel
    tensors = len({a.buffer for a in k.reads}) + len({b for _, b in k.writes})
    return step.P * step.n * tensors * 4


def virtual_ranks() -> list:
    import numpy as np

    import dsl
    from coconet.programs import adam_program, sliced_schedule
    from codegen.lower import lower
    from codegen.runtime.symm_ranks import only_step

    try:
        from codegen.runtime.symm import run_virtual
    except ImportError as e:
        return [
            Figure(
                "symmetric-memory fused kernel",
                f"not available: {SYMM_LAUNCHER} cannot be imported ({e})",
            )
        ]
    program = sliced_schedule(adam_program())
    copy = copy_gbps(1 << 28)
    out = [Figure("device-to-device copy", f"{copy:.0f} GB/s")]
    for P in VIRTUAL_RANKS:
        b = {"N": VERIFY_N}
        inputs = dsl.random_inputs(program, P, b, np.random.default_rng(P))
        got, _ = run_virtual(lower(program, b, P, fused_chunks=SYMM_CHUNKS), inputs)
        expect = dsl.interpret(program, inputs, P, b)
        bounds = dsl.error_bounds(program, inputs, P, b)
        ok = all(dsl.runs_agree(got[j], expect[j], bounds[j]) for j in range(P))
        big = lower(program, {"N": SYMM_N}, P, fused_chunks=SYMM_CHUNKS)
        _, ms = run_virtual(big, [{}] * P, launches=3)  # zeros: the time is the values'
        gbps = symm_bytes(only_step(big)) / (ms * 1e6)
        out.append(
            Figure(
                f"P={P}: verified {ok} at 2^{VERIFY_N.bit_length() - 1}, at 2^"
                f"{SYMM_N.bit_length() - 1}",
                f"{ms:.4f} ms, {gbps:.0f} GB/s = {gbps / copy:.0%} of a copy",
                f">= {COPY_GOAL:.0%} (goal)",
                gbps / copy >= COPY_GOAL,
                verified=ok,
            )
        )
    return out


def adam_kernel() -> list:
    import numpy as np
    import torch

    from coconet.programs import adam_program
    from codegen.lower import lower
    from codegen.plan import Compute
    from codegen.runtime import backend as backends
    from codegen.runtime.execute import PlanRunner

    program = adam_program()
    plan = lower(program, {"N": ADAM_N}, 1)
    backend = backends.get(BACKEND)
    runner = PlanRunner(plan, 0, backend.build(plan.kernels()), backend.groups(1), backend)
    rng = np.random.default_rng(0)
    g, w, m = (rng.standard_normal(ADAM_N).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(ADAM_N)).astype(np.float32)
    runner.load({"g": g, "w": w, "m": m, "v": v})
    runner.run()  # the whole AR-C step (the all-reduce of one rank leaves g as it is)
    ours = runner.outputs()
    hp = dict(plan.defaults)
    dev = backend.device
    p = torch.tensor(w, device=dev, requires_grad=True)
    p.grad = torch.tensor(g, device=dev)
    opt = torch.optim.Adam(
        [p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], fused=True
    )
    opt.state[p] = {
        "step": torch.tensor(hp["step"] - 1, dtype=torch.float32, device=dev),
        "exp_avg": torch.tensor(m, device=dev),
        "exp_avg_sq": torch.tensor(v, device=dev),
    }
    opt.step()  # step counts to hp["step"], as the program's bias correction takes it
    theirs = {"w": p.detach(), "m": opt.state[p]["exp_avg"], "v": opt.state[p]["exp_avg_sq"]}
    errors = {k: float(np.max(np.abs(ours[k] - theirs[k].cpu().numpy()))) for k in theirs}
    scale = {k: float(np.max(np.abs(theirs[k].cpu().numpy()))) for k in theirs}
    ok = all(errors[k] <= ADAM_TOL * max(1.0, scale[k]) for k in errors)
    computes = [s for s in plan.steps if isinstance(s, Compute)]
    kernel = device_ms(lambda: runner.run(steps=computes))
    library = device_ms(opt.step)
    return [
        Figure(
            "generated kernel / torch fused Adam",
            f"{kernel:.4f} / {library:.4f} ms = x{kernel / library:.2f} the time",
        ),
        Figure(
            "max abs error w, m, v",
            ", ".join(f"{errors[k]:.2e}" for k in ("w", "m", "v")),
            f"<= {ADAM_TOL:g} (relative above 1)",
            ok,
            verified=ok,
        ),
    ]


CHECKS = (
    Check(
        "graph_host",
        f"host time per step of {FUSED} at 2^16 as one CUDA graph (target < "
        f"{HOST_TARGET_US:.0f} us), replay == eager",
        graph_host,
    ),
    Check(
        "one_rank",
        f"{FUSED} (graph) against all_reduce + fused Adam at 2^24, world_size=1 "
        f"(target >= {SPEEDUP_TARGET}x)",
        one_rank,
    ),
    Check(
        "virtual_ranks",
        f"symmetric-memory fused kernel at P = 2, 4, 8 on one GPU: verified, "
        f"bandwidth / device copy (goal {COPY_GOAL:.0%})",
        virtual_ranks,
    ),
    Check(
        "adam_kernel",
        "generated Adam kernel against torch's fused Adam at 2^24: time ratio, max abs error",
        adam_kernel,
    ),
)


# -- the command ------------------------------------------------------------------------------------
def no_gpu() -> Optional[str]:
    """Why this machine cannot run the checks (None: it can)."""
    try:
        from codegen.runtime.cuda_backend import CudaBackend
    except ImportError as e:  # no CuPy
        return f"the CUDA backend cannot be imported ({e})"
    return CudaBackend().cannot_run()


def select(only: Optional[str]) -> list:
    """The checks named in `only` (comma-separated; None: all), in CHECKS' order."""
    if not only:
        return list(CHECKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in {c.name for c in CHECKS}]
    if unknown:
        raise ValueError(
            f"unknown check {unknown[0]!r}; checks: {', '.join(c.name for c in CHECKS)}"
        )
    return [c for c in CHECKS if c.name in names]


def line(check: str, f: Figure) -> str:
    target = f"  target {f.target}: {'met' if f.met else 'MISSED'}" if f.target else ""
    return f"{check:14s} {f.name:44s} {f.value}{target}"


def start_group() -> None:
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)


def run(checks: list) -> int:
    import cupy
    import torch
    import torch.distributed as dist

    print(
        f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}, NCCL "
        f"{'.'.join(map(str, torch.cuda.nccl.version()))}, CuPy {cupy.__version__}",
        flush=True,
    )
    start_group()
    code, t0 = OK, time.perf_counter()
    try:
        for c in checks:
            t = time.perf_counter()
            try:
                figures = c.run()
            except Exception as e:  # noqa: BLE001 - say which check failed, run the others
                msg = (str(e).strip().splitlines() or [""])[0]
                print(f"{c.name:14s} FAILED: {type(e).__name__}: {msg}", flush=True)
                code = max(code, CHECK_FAILED)
                continue
            for f in figures:
                print(line(c.name, f), flush=True)
                if not f.verified:
                    code = max(code, NOT_VERIFIED)
            print(f"{c.name:14s} ({time.perf_counter() - t:.1f} s)", flush=True)
    finally:
        dist.destroy_process_group()
    print(f"all checks: {time.perf_counter() - t0:.1f} s", flush=True)
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the checks and exit")
    ap.add_argument("--only", help="comma-separated check names (default: all)")
    args = ap.parse_args(argv)
    try:
        checks = select(args.only)
    except ValueError as e:
        print(f"gpu_figures: {e}", file=sys.stderr)
        return BAD_ARGS
    if args.list:
        for c in checks:
            print(f"{c.name}: {c.what}")
        return OK
    why = no_gpu()
    if why:
        print(f"no GPU here: {why}; nothing run (exit {NO_GPU})")
        return NO_GPU
    return run(checks)


if __name__ == "__main__":
    sys.exit(main())
