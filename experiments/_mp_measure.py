"""Measuring the Megatron layer's model- and pipeline-parallel experiments on local ranks of the
run's backend (`codegen.runtime.backend`: device, process groups, communicator, clock).

Per point (size bindings) every rank runs, side by side in one process group: the baseline as
Megatron-LM writes it (torch matmul, library all-reduce, bias + dropout + residual in torch ops,
for the pipeline a library send/recv to the next stage), then each schedule's Plan. The baseline
is timed with torch's own dropout, and checked with the DSL's hash mask in its place (the mask is
the only difference between the two runs). Inputs are
`dsl.random_inputs` of the experiment's program (the same on every run of the point).
- verified: the schedule's output equals the baseline's on every rank holding it, each element
  within twice its bound from `dsl.error_bounds` (`dsl.runs_agree`: matmul and reduction order
  differ); the baseline itself equals `dsl.interpret` at a small size (checked by the parent).
  Dropout masks are identical by construction (the baseline computes the DSL's hash mask).
- time: `_points.time_point` (warm-up, repeats, barrier before each, the max over ranks);
  compute_ms is the time in kernels and matmuls (rank average per run), comm_ms = time_ms -
  compute_ms, and for an overlapped schedule overlapped_ms = the split schedule's comm_ms at the
  same point minus its own (communication it hid), floored at 0.
Rank 0 appends each point to results.csv as soon as it is measured.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

import dsl
from codegen.lower import lower
from codegen.runtime import backend as backends
from codegen.runtime.backend import NO_STREAMS
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import run_ranks

from ._layer import DROPOUT_P, DROPOUT_SEED, torch_bias_dropout_add, torch_dropout_
from ._points import agree, progress, publish, time_point


@dataclass(frozen=True)
class Point:
    bindings: tuple[tuple[str, int], ...]
    plans: tuple[tuple[str, object], ...]  # (schedule, Plan)


@dataclass(frozen=True)
class Spec:
    experiment: str
    program: dsl.Program
    world_size: int
    points: tuple[Point, ...]
    warmup: int
    repeats: int
    csv_path: str
    seed: int
    baseline_ok: bool
    split_schedule: str  # whose comm_ms an overlapped schedule is compared with
    backend: str = "cpu"


# -- the baseline -----------------------------------------------------------------------------------
class Baseline:
    """The layer's tail as Megatron-LM writes it; for a program with 2 stages, the pipeline
    boundary (stage 0 computes and sends, stage 1 receives). Library calls through the backend's
    communicator on the caller's stream (gloo's on the CPU, NCCL's on GPUs)."""

    def __init__(self, program: dsl.Program, inputs: dict, rank: int, P: int, backend, groups):
        self.t = {k: torch.from_numpy(np.array(v)).to(backend.device) for k, v in inputs.items()}
        self.stages, self.rank, self.P = program.stages, rank, P
        self.comm = backend.communicator(groups.stages[rank // P], NO_STREAMS)
        self.world = backend.communicator(groups.world, NO_STREAMS)
        self.stage = rank // P
        self.compute_ms = 0.0
        self.check = True  # False while timed: see _tail
        shape = self.t["residual"].shape
        self.out = torch.empty_like(self.t["residual"])
        self.y = self.t["y"].clone() if "y" in self.t else torch.empty_like(self.out)

    def _timed(self, fn):
        t0 = time.perf_counter()
        fn()
        self.compute_ms += (time.perf_counter() - t0) * 1e3

    def step(self) -> None:
        peer = (self.rank + self.P) % (self.stages * self.P)
        if self.stages > 1 and self.stage == 1:
            self.world.p2p(None, self.out.view(-1), peer, self.rank, 1).start().wait()
            return
        if "x" in self.t:
            self._timed(lambda: torch.matmul(self.t["x"], self.t["weight"], out=self.y))
        else:
            self.y.copy_(self.t["y"])
        self.comm.all_reduce(self.y.view(-1), "sum")
        self._timed(self._tail)
        if self.stages > 1:
            self.world.p2p(self.out.view(-1), None, self.rank, peer, 1).start().wait()

    def _tail(self) -> None:
        if not self.check:  # what Megatron-LM runs: torch's own dropout
            torch_bias_dropout_add(self.y, self.t["bias"], self.t["residual"], self.out)
            return
        torch.add(self.y, self.t["bias"], out=self.out)  # the DSL's mask, to compare outputs
        torch_dropout_(self.out, DROPOUT_SEED, DROPOUT_P)
        self.out.add_(self.t["residual"])

    def outputs(self) -> dict:
        holds = self.stages == 1 or self.stage == 1
        return {"out": self.out.cpu().numpy().copy()} if holds else {}


# -- one rank -------------------------------------------------------------------------------------
def _measure(obj, spec: Spec, clock) -> tuple:
    obj.compute_ms = 0.0
    fn = obj.step if isinstance(obj, Baseline) else obj.run
    timing = time_point(fn, spec.warmup, spec.repeats, clock)
    calls = spec.warmup + len(timing.times_ms)
    t = torch.tensor([obj.compute_ms / calls], dtype=torch.float64)
    dist.all_reduce(t)
    return timing, float(t[0]) / dist.get_world_size()


def rank_main(rank: int, world: int, spec: Spec, kernel_list: list) -> list[dict]:
    backend = backends.get(spec.backend)
    kernels = backend.build(kernel_list)
    groups = backend.groups(spec.program.stages)
    clock = backend.clock()
    P = world // spec.program.stages
    rows = []
    bar = progress([math.prod(dict(pt.bindings).values()) for pt in spec.points
                    for _ in range(1 + len(pt.plans))], spec.experiment)
    for pt in spec.points:
        b = dict(pt.bindings)
        every = dsl.random_inputs(spec.program, world, b, np.random.default_rng(spec.seed))
        inputs, bounds = every[rank], dsl.error_bounds(spec.program, every, world, b)[rank]
        base = Baseline(spec.program, inputs, rank, P, backend, groups)
        base.step()
        reference = base.outputs()
        base.check = False
        timing, compute = _measure(base, spec, clock)
        base_ms, comm_split = timing.median_ms, None
        rows.append(_row(spec, "baseline", b, world, timing, base_ms, spec.baseline_ok, compute,
                         None, rank, bar))
        for name, plan in pt.plans:
            runner = PlanRunner(plan, rank, kernels, groups, backend)
            runner.load(inputs)
            runner.run()
            ok = agree(dsl.runs_agree(runner.outputs(), reference, bounds))
            timing, compute = _measure(runner, spec, clock)
            comm_ms = max(0.0, timing.median_ms - compute)
            if name == spec.split_schedule:
                comm_split = comm_ms
            hidden = (max(0.0, comm_split - comm_ms) if name.startswith("ol(")
                      and comm_split is not None else 0.0)
            rows.append(_row(spec, name, b, world, timing, base_ms, ok, compute, hidden, rank,
                             bar))
    return rows


def _row(spec, schedule, b, world, timing, base_ms, ok, compute, hidden, rank, bar):
    S, B, H = b["S"], b["B"], b["H"]
    shape = f"S={S},B={B},H={H}" + (f",K={b['K']}" if "K" in b else "")
    row = {"experiment": spec.experiment, "schedule": schedule, "source": "measured",
           "backend": spec.backend, "topology": "local", "world_size": world, "size": S * B * H,
           "shape": shape, "dtype": "f32", "time_ms": round(timing.median_ms, 4),
           "time_ms_min": round(timing.min_ms, 4), "time_ms_max": round(timing.max_ms, 4),
           "speedup": round(base_ms / timing.median_ms, 4), "verified": ok,
           "compute_ms": round(compute, 4),
           "comm_ms": round(max(0.0, timing.median_ms - compute), 4),
           "overlapped_ms": "" if hidden is None else round(hidden, 4)}
    return publish(row, spec.csv_path, rank, bar, f"ranks={world} {shape:24s}")


# -- the parent -----------------------------------------------------------------------------------
def baseline_matches_program(program: dsl.Program, world: int, bindings: dict) -> bool:
    """The baseline computes what the program says: run it on `world` ranks at small bindings
    and compare with `dsl.interpret`."""
    return all(run_ranks(_check_rank, world, args=(program, bindings), timeout_s=300))


def _check_rank(rank: int, world: int, program: dsl.Program, bindings: dict) -> bool:
    P = world // program.stages
    inputs = dsl.random_inputs(program, world, bindings, np.random.default_rng(0))
    expect = dsl.interpret(program, inputs, world, bindings)[rank]
    backend = backends.get("cpu")
    base = Baseline(program, inputs[rank], rank, P, backend, backend.groups(program.stages))
    base.step()
    return dsl.runs_agree(base.outputs(), expect, dsl.error_bounds(program, inputs, world, bindings)[rank])


def measure(experiment: str, program: dsl.Program, schedules: dict, points, world_size: int,
            warmup: int, repeats: int, csv_path, kernels_dir, split_schedule: str,
            seed: int = 0, timeout_s: float = 1800.0, check_bindings=None,
            backend: str = "cpu") -> list[dict]:
    """Measure the baseline and every schedule at every point on `world_size` ranks of `backend`
    (the baseline is checked against `dsl.interpret` on the CPU)."""
    pts = tuple(Point(tuple(sorted(b.items())),
                      tuple((n, lower(p, b, world_size)) for n, p in schedules.items()))
                for b in points)
    kernels = list({k.name: k for pt in pts for _, pl in pt.plans for k in pl.kernels()}.values())
    print(f"building {len(kernels)} kernels ...", flush=True)
    target = backends.get(backend)
    target.precompile(kernels)
    target.write_sources(kernels, kernels_dir, experiment)
    ok = baseline_matches_program(program, world_size, check_bindings or points[0])
    spec = Spec(experiment, program, world_size, pts, warmup, repeats, str(csv_path), seed, ok,
                split_schedule, backend)
    return run_ranks(rank_main, world_size, args=(spec, kernels), timeout_s=timeout_s)[0]
