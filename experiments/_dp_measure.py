"""Measuring the data-parallel optimizer experiments (adam_fusion, lamb_fusion) on local ranks.

For each size N (the gradient's element count) every rank runs, side by side in one process
group: the library baseline (`dist.all_reduce` + the library optimizer step), then each schedule's
Plan through `codegen.runtime.execute`, both on the run's backend (`codegen.runtime.backend`: its
device, process groups and clock). Per point:
- verified: after `steps` optimizer steps from the same start (w random, m = v = 0, a new random
  gradient per rank and step) the schedule's w, m, v equal the baseline's within
  |x - ref| <= RTOL * (1 + |ref|) on every rank; the baseline itself is checked against
  `dsl.interpret` of the experiment's program (one step, small N);
- time: `_points.time_point` (warm-up, repeats, a barrier before each, the max over ranks; a
  short step more repeats), median, min, max.
Rank 0 appends each point to results.csv as soon as it is measured and prints a progress line.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import log2
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

import dsl
from codegen.lower import lower
from codegen.plan import Plan
from codegen.runtime import backend as backends
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import run_ranks

from ._points import agree, progress, publish, time_point

RTOL = 2e-6  # f32: three steps differ only by reduction and op order (a few ulp of w, m, v)
HP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


@dataclass(frozen=True)
class Spec:
    experiment: str
    optimizer: str  # adam | lamb
    world_size: int
    sizes: tuple[int, ...]
    plans: tuple[tuple[str, int, Plan], ...]  # (schedule, N, plan)
    warmup: int
    repeats: int
    csv_path: str
    seed: int
    baseline_ok: bool
    backend: str = "cpu"
    steps: int = 3


def plans_for(schedules: dict[str, dsl.Program], sizes, world_size: int, chunks: int = 4):
    return tuple((name, n, lower(p, {"N": n}, world_size, fused_chunks=chunks))
                 for n in sizes for name, p in schedules.items())


# -- the library baselines ------------------------------------------------------------------------
class Baseline:
    """all_reduce of the gradient, averaged, then the library optimizer on w (in place)."""

    def __init__(self, optimizer: str, w: np.ndarray, world: int, device="cpu", group=None):
        self.optimizer, self.world, self.group = optimizer, world, group
        self.w = torch.from_numpy(w.copy()).to(device)
        self.g = torch.zeros_like(self.w)
        self.m, self.v = torch.zeros_like(self.w), torch.zeros_like(self.w)
        self.t = 0
        if optimizer == "adam":
            self.w.grad = self.g
            self.opt = torch.optim.Adam([self.w], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                                        eps=HP["eps"], fused=True)

    def step(self) -> None:
        dist.all_reduce(self.g, group=self.group)
        self.update()

    def update(self) -> None:
        """The optimizer step on the summed gradient in self.g (averaged here, as DDP does)."""
        self.g.div_(self.world)
        self.t += 1
        if self.optimizer == "adam":
            self.opt.step()
        else:
            lamb_step(self.w, self.m, self.v, self.g, self.t)

    def state(self) -> dict[str, torch.Tensor]:
        if self.optimizer == "adam":
            st = self.opt.state[self.w]
            return {"w": self.w, "m": st["exp_avg"], "v": st["exp_avg_sq"]}
        return {"w": self.w, "m": self.m, "v": self.v}


@torch.no_grad()
def lamb_step(w, m, v, g, t: int) -> None:
    """LAMB as a practitioner writes it in torch (vectorised, no gradient clipping)."""
    b1, b2 = HP["beta1"], HP["beta2"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u = (m / (1 - b1 ** t)).div_((v / (1 - b2 ** t)).sqrt_().add_(HP["eps"]))
    u.add_(w, alpha=HP["weight_decay"])
    # norms accumulated in f64: torch's f32 CPU norm drifts by 0.2% at 2^25 elements, more than
    # the reduction-order difference the check allows (apex's GPU LAMB reduces in blocks)
    r_w = torch.linalg.vector_norm(w, dtype=torch.float64).to(w.dtype)
    r_u = torch.linalg.vector_norm(u, dtype=torch.float64).to(w.dtype)
    one = torch.ones((), dtype=w.dtype, device=w.device)
    trust = torch.where(r_w > 0, torch.where(r_u > 0, r_w / r_u, one), one)
    w.sub_(HP["lr"] * trust * u)


# -- one rank -------------------------------------------------------------------------------------
def _gradient(spec: Spec, n: int, rank: int, step: int) -> np.ndarray:
    rng = np.random.default_rng([spec.seed, n, rank, step])
    return rng.standard_normal(n, dtype=np.float32)


def _weights(spec: Spec, n: int) -> np.ndarray:
    return np.random.default_rng([spec.seed, n]).standard_normal(n, dtype=np.float32)


def _local(runner: PlanRunner, name: str, full: np.ndarray) -> np.ndarray:
    """This rank's part of a global array, as the plan's input `name` holds it."""
    b = runner.plan.buffer(dict(runner.plan.inputs)[name])
    if b.shape == full.shape:
        return full
    k = b.shape[0]
    return full[runner.tp * k:(runner.tp + 1) * k]


def _close(got: np.ndarray, ref: np.ndarray) -> bool:
    return bool(np.all(np.abs(got - ref) <= RTOL * (1 + np.abs(ref))))


def _run_schedule(spec, plan, rank, backend, kernels, groups, n, reference
                  ) -> tuple[bool, Callable]:
    runner = PlanRunner(plan, rank, kernels, groups, backend)
    w = _weights(spec, n)
    zeros = np.zeros(n, dtype=np.float32)
    runner.load({"w": _local(runner, "w", w), "m": _local(runner, "m", zeros),
                 "v": _local(runner, "v", zeros), **{k: np.float32(v) for k, v in HP.items()
                                                     if k in dict(plan.inputs)}})
    for t in range(1, spec.steps + 1):
        runner.input("g").copy_(torch.from_numpy(_gradient(spec, n, rank, t)))
        runner.input("step").fill_(t)
        runner.run()
    out = runner.outputs()
    ok = all(_close(out[k], _local(runner, k, reference[k])) for k in ("w", "m", "v"))
    return agree(ok), runner.run


def _baseline(spec, rank, n, backend, groups) -> tuple[dict, Callable]:
    base = Baseline(spec.optimizer, _weights(spec, n), spec.world_size, backend.device,
                    groups.world.pg)
    for t in range(1, spec.steps + 1):
        base.g.copy_(torch.from_numpy(_gradient(spec, n, rank, t)))
        base.step()
    ref = {k: v.detach().cpu().numpy().copy() for k, v in base.state().items()}
    return ref, base.step


def rank_main(rank: int, world: int, spec: Spec, kernel_list: list) -> list[dict]:
    backend = backends.get(spec.backend)
    kernels = backend.build(kernel_list)  # compiled by the parent: loads from the cache
    groups = backend.groups(spec.plans[0][2].stages)
    clock = backend.clock()
    rows: list[dict] = []
    per_size = {n: 1 + sum(size == n for _, size, _ in spec.plans) for n in spec.sizes}
    weights = [n for n in spec.sizes for _ in range(per_size[n])]  # work ~ elements
    bar = progress(weights, spec.experiment)
    for n in spec.sizes:
        reference, base_step = _baseline(spec, rank, n, backend, groups)
        base_ok = spec.baseline_ok
        timing = time_point(base_step, spec.warmup, spec.repeats, clock)
        base_ms = timing.median_ms
        rows.append(_row(spec, "baseline", n, timing, base_ms, base_ok, rank, bar))
        for name, size, plan in spec.plans:
            if size != n:
                continue
            ok, fn = _run_schedule(spec, plan, rank, backend, kernels, groups, n, reference)
            timing = time_point(fn, spec.warmup, spec.repeats, clock)
            rows.append(_row(spec, name, n, timing, base_ms, ok, rank, bar))
    return rows


def _row(spec, schedule, n, timing, base_ms, ok, rank, bar) -> dict:
    row = {"experiment": spec.experiment, "schedule": schedule, "source": "measured",
           "backend": spec.backend, "topology": "local", "world_size": spec.world_size, "size": n,
           "shape": f"[{n}]", "dtype": "f32", "time_ms": round(timing.median_ms, 4),
           "time_ms_min": round(timing.min_ms, 4), "time_ms_max": round(timing.max_ms, 4),
           "speedup": round(base_ms / timing.median_ms, 4), "verified": ok}
    return publish(row, spec.csv_path, rank, bar, f"N=2^{log2(n):.0f}")


# -- the parent -----------------------------------------------------------------------------------
def baseline_matches_program(optimizer: str, program: dsl.Program, world: int, n: int = 4096,
                             seed: int = 0) -> bool:
    """One step of the torch baseline equals `dsl.interpret` of the experiment's program."""
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(world)]
    w = rng.standard_normal(n, dtype=np.float32)
    zeros = np.zeros(n, dtype=np.float32)
    inputs = [{"g": g, "w": w, "m": zeros, "v": zeros, "step": np.float32(1)} for g in grads]
    ref = dsl.interpret(program, inputs, world, {"N": n})[0]
    base = Baseline(optimizer, w, world)
    base.g.copy_(torch.from_numpy(np.sum(grads, axis=0, dtype=np.float32)))
    base.update()
    got = {k: v.detach().numpy() for k, v in base.state().items()}
    return all(_close(got[k], ref[k]) for k in ("w", "m", "v"))


def measure(experiment: str, optimizer: str, program: dsl.Program, schedules: dict, sizes,
            world_size: int, warmup: int, repeats: int, csv_path: str, kernels_dir, seed: int = 0,
            timeout_s: float = 1800.0, backend: str = "cpu") -> list[dict]:
    """Measure every schedule and the baseline at every size on `world_size` ranks of `backend`."""
    plans = plans_for(schedules, sizes, world_size)
    kernels = list({k.name: k for _, _, p in plans for k in p.kernels()}.values())
    print(f"building {len(kernels)} kernels ...", flush=True)
    target = backends.get(backend)
    target.precompile(kernels)
    target.write_sources(kernels, kernels_dir, experiment)
    ok = baseline_matches_program(optimizer, program, world_size, seed=seed)
    spec = Spec(experiment, optimizer, world_size, tuple(sizes), plans, warmup, repeats,
                str(csv_path), seed, ok, backend)
    # local ranks, or, when this process was started by torchrun, this rank of torchrun's group
    return run_ranks(rank_main, world_size, args=(spec, kernels), timeout_s=timeout_s)[0]
