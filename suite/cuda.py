"""backend=cuda: generate, compile and write every kernel; on GPUs, run and verify every schedule.

    checks = cuda_step(cfg, exp, schedules, out_dir)     # called by suite.run for backend=cuda

- Generate: every schedule is lowered at the experiment's verification bindings
  (`exp.verify_bindings(scale)`, at each `verify.world_sizes`) and measurement sizes
  (`experiment.sizes`, else `exp.sizes(scale, max_elements)` as {"N": n}, at `world_size`); its
  kernels are written as one CUDA module `out_dir/kernels/<experiment>_<schedule>.cu` with
  `<...>.sm_XY.ptx` for every `backend.archs` (NVRTC; one progress line per schedule).
- No GPU here (a CPU build of torch, or no device): one line says so, and nothing runs; returns [].
  An experiment without a DSL program (calibrate, collectives: no schedules) has nothing to do.
- GPUs here: every schedule at every verification binding runs on NCCL ranks, one per GPU, at each
  world size of `verify.world_sizes` + `world_size` that the GPUs allow (the largest that divides
  into the program's pipeline stages when none does), through `CudaPlanRunner`, and its outputs are
  compared with `dsl.interpret` of the same schedule on the same inputs (each element within
  twice its `dsl.error_bounds` bound, as the CPU runtime's tests). One `suite.verification.Check` per
  schedule x world size x binding is returned and one line printed per schedule x world size.
Errors: a kernel that does not render or compile is a `codegen.build.BuildError`, a bad arch too.

Until suite.run calls it: `python -m suite.cuda experiment=NAME [key=value ...] --out DIR`.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Optional, Union

import numpy as np

import dsl
from codegen import build_cuda
from codegen.lower import lower
from codegen.plan import Plan

from .verification import Check

RUN_TIMEOUT_S = 600.0


def cuda_step(cfg, exp: ModuleType, schedules: dict[str, dsl.Program],
              out_dir: Union[str, Path]) -> list[Check]:
    """See the module doc."""
    archs = build_cuda.check_archs(cfg.backend.archs)
    folder = Path(out_dir) / "kernels"
    if not schedules:
        print(f"cuda: {exp.NAME} has no DSL program: no kernels to generate", flush=True)
        return []
    plans = {name: lower_all(cfg, exp, p) for name, p in schedules.items()}
    print(f"cuda: compiling {len(schedules)} schedules with NVRTC for {', '.join(archs)} "
          f"into {folder}", flush=True)
    for name, cases in plans.items():
        start = time.perf_counter()
        kernels = list({k.name: k for _, _, plan in cases for k in plan.kernels()}.values())
        paths = build_cuda.write_sources(kernels, folder, f"{exp.NAME}_{file_name(name)}", archs)
        print(f"  {name}: {len(kernels)} kernels -> {paths[0].name} + {len(paths) - 1} PTX "
              f"({time.perf_counter() - start:.2f} s)", flush=True)
    gpus = gpu_count()
    if not gpus:
        print(f"cuda: no GPU on this machine ({no_gpu_reason()}): kernels compiled, nothing run "
              "on a GPU", flush=True)
        return []
    return verify_on_gpus(cfg, exp, schedules, gpus)


def file_name(schedule: str) -> str:
    """A schedule name as a file name: `fuse(RS-C-AG)+as_slice` -> `fuse_RS-C-AG_as_slice`."""
    return re.sub(r"_+", "_", re.sub(r"[^\w.-]", "_", schedule)).strip("_")


def measure_bindings(cfg, exp: ModuleType, program: dsl.Program) -> list[dict[str, int]]:
    """experiment.sizes, else the data-parallel sweep `exp.sizes` where N is the only size."""
    if cfg.experiment.sizes:
        return [dict(b) for b in cfg.experiment.sizes]
    symbols = set(_default(program, program.stages)) - {"P"}
    if hasattr(exp, "sizes") and symbols == {"N"}:
        return [{"N": n} for n in exp.sizes(cfg.scale.name, cfg.scale.max_elements)]
    return []


def program_experiments() -> list[str]:
    """The experiments with DSL programs (schedules) to compile; calibrate and collectives have none."""
    import experiments
    return [n for n in experiments.EXPERIMENTS if hasattr(experiments.load(n), "schedules")]


def lower_all(cfg, exp: ModuleType, program: dsl.Program) -> list[tuple[dict, int, Plan]]:
    """(bindings, world size, plan) at every verification and measurement point."""
    points = [(b, w) for w in cfg.verify.world_sizes for b in _verify_bindings(cfg, exp)]
    points += [(b, cfg.world_size) for b in measure_bindings(cfg, exp, program)]
    out, seen = [], set()
    for b, w in points:
        key = (tuple(sorted((b or {}).items())), w)
        if w % program.stages or key in seen:
            continue
        seen.add(key)
        out.append((b, w, lower(program, b or _default(program, w), w)))
    return out


def _verify_bindings(cfg, exp: ModuleType) -> list[Optional[dict]]:
    return [dict(b) for b in exp.verify_bindings(cfg.scale.name)] or [None]


def _default(program: dsl.Program, world: int) -> dict[str, int]:
    from dsl.equivalence import default_bindings
    return default_bindings(program, world // program.stages)


# -- GPUs ------------------------------------------------------------------------------------------
def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def no_gpu_reason() -> str:
    import torch
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"


def gpu_worlds(cfg, program: dsl.Program, gpus: int) -> list[int]:
    """World sizes to run `program` at with `gpus` GPUs (see the module doc); [] if none fits."""
    wanted = sorted({w for w in [*cfg.verify.world_sizes, cfg.world_size]
                     if w <= gpus and w % program.stages == 0})
    fallback = gpus - gpus % program.stages
    return wanted or ([fallback] if fallback else [])


def verify_on_gpus(cfg, exp: ModuleType, schedules: dict[str, dsl.Program], gpus: int) -> list[Check]:
    """Every schedule at each world size it fits, one launch of ranks per world size."""
    print(f"cuda: verifying {len(schedules)} schedules on {gpus} GPU(s) with NCCL", flush=True)
    width = max(map(len, schedules), default=0)
    by_world: dict[int, list[str]] = {}
    for name, program in schedules.items():
        worlds = gpu_worlds(cfg, program, gpus)
        if not worlds:
            print(f"  {name:<{width}}  skipped: {program.stages} pipeline stages need "
                  f"{program.stages} GPUs, {gpus} here", flush=True)
        for w in worlds:
            by_world.setdefault(w, []).append(name)
    checks: list[Check] = []
    for w, names in sorted(by_world.items()):
        cases = {n: make_cases(schedules[n], _verify_bindings(cfg, exp), w, cfg.seed) for n in names}
        start = time.perf_counter()
        results = iter(run_cases([c for n in names for c in cases[n]], w))
        for name in names:
            done = [Check(schedule=name, world_size=w, bindings=b, max_abs_error=err, message=msg)
                    for _, (b, err, msg) in zip(cases[name], results)]
            checks += done
            bad = [c for c in done if not c.verified]
            worst = max((c.max_abs_error or 0.0 for c in done), default=0.0)
            print(f"  {name:<{width}}  P={w:<3} {'FAILED' if bad else 'OK':<6} max abs error "
                  f"{worst:.2e}{'  (' + bad[0].message + ')' if bad else ''}", flush=True)
        print(f"  ({len(names)} schedules at world size {w}: {time.perf_counter() - start:.1f} s)",
              flush=True)
    return checks


def make_cases(program: dsl.Program, bindings, world: int, seed: int) -> list[tuple]:
    """(bindings, plan, inputs per rank, expected outputs per rank, error bounds per rank) per
    binding."""
    cases = []
    for b in bindings:
        b = b or _default(program, world)
        plan = lower(program, b, world)
        inputs = dsl.random_inputs(program, world, b, np.random.default_rng(seed))
        expect = dsl.interpret(program, inputs, world, b)
        cases.append((b, plan, inputs, expect, dsl.error_bounds(program, inputs, world, b)))
    return cases


def run_cases(cases: list[tuple], world: int) -> list[tuple[dict, Optional[float], str]]:
    """Run each case's plan on `world` GPU ranks; (bindings, max abs error, failure message)."""
    from codegen.runtime.launch import run_ranks

    kernels = list({k.name: k for _, plan, _, _, _ in cases for k in plan.kernels()}.values())
    src = build_cuda.module_source(kernels)
    for arch in {build_cuda.device_arch(0)}:  # compile once here; the ranks read the cache
        build_cuda.compile_module(src, arch)
    results = run_ranks(_rank, world, args=([c[1] for c in cases], [c[2] for c in cases], kernels),
                        timeout_s=RUN_TIMEOUT_S)
    out = []
    for k, (b, _, _, expect, bounds) in enumerate(cases):
        err, msg = compare([r[k] for r in results], expect, bounds)
        out.append((b, err, msg))
    return out


def compare(got: list[dict], expect: list[dict], bounds: list[dict]) -> tuple[Optional[float], str]:
    """Largest absolute error over ranks and outputs, or (None, what differs): each element
    within twice its `dsl.error_bounds` bound (the interpreter and the GPU each within it)."""
    worst = 0.0
    for rank, (g, e) in enumerate(zip(got, expect)):
        if set(g) != set(e):
            return None, f"rank {rank} has outputs {sorted(g)}, expected {sorted(e)}"
        for name, ref in e.items():
            diff, bad = dsl.within(g[name], ref, 2 * bounds[rank][name].error)
            if bad:
                return None, f"rank {rank} output {name}: {bad} elements off, max {diff:.3g}"
            worst = max(worst, diff)
    return worst, ""


def _rank(rank: int, world: int, plans: list[Plan], inputs: list, kernel_list: list) -> list[dict]:
    import torch

    from codegen.runtime.cuda_execute import CudaPlanRunner, local_device, nccl_groups

    device = local_device()
    torch.cuda.set_device(device)
    kernels = build_cuda.build(kernel_list, device=device)
    outs = []
    for plan, inp in zip(plans, inputs):
        runner = CudaPlanRunner(plan, rank, kernels, nccl_groups(plan), device)
        runner.load(inp[rank])
        runner.run()
        outs.append(runner.outputs())
    return outs


# -- python -m suite.cuda ---------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """`python -m suite.cuda experiment=NAME [key=value ...] --out DIR` (backend=cuda implied)."""
    from .cli import prevalidate
    from .errors import SuiteError
    from .run import fail, load_experiment, load_programs

    out = "runs/cuda"
    if "--out" in argv:
        i = argv.index("--out")
        if i + 1 >= len(argv):
            fail(SuiteError("--out needs a directory"))
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    try:
        cfg = prevalidate(["backend=cuda", *argv])
        exp = load_experiment(cfg.experiment.name)
        _, schedules = load_programs(exp, cfg)
        checks = cuda_step(cfg, exp, schedules, out)
    except (SuiteError, dsl.DSLError, build_cuda.BuildError) as e:
        fail(e)
    failed = [c for c in checks if not c.verified]
    print(f"{'FAILED' if failed else 'done'}: {len(checks) - len(failed)} of {len(checks)} GPU "
          f"checks verified; kernels in {Path(out) / 'kernels'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
