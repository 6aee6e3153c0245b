"""Micro-benchmark: the generated Adam kernel against `torch.optim.Adam(fused=True)`, one process.

    python -m benchmarks.kernels --n 16777216 [--repeats 20] [--warmup 3] [--threads T]

The Adam step is written in the DSL exactly as `torch.optim.Adam` computes it (bias correction,
sqrt, eps; the same rule as `experiments/optimizers.py`, without the all-reduce, which is the identity
at world size 1), lowered at world size 1, rendered, built and run over all n elements. Both sides
read g, w, m, v and write w, m, v (28 bytes per f32 element). Prints the median time of each over
`repeats` timed steps (after `warmup` untimed ones), the memory bandwidth each reaches, the ratio
generated / torch (<= 1: the generated kernel is at least as fast), and the largest difference
between the two after one step from the same state.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from codegen.build import build
from codegen.lower import lower
from codegen.plan import Compute
from dsl import Builder, Replicated, f32, sym

HYPER = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def adam_step_program(step: float):
    b = Builder("bench_adam")
    N = sym("N")
    g = b.input("g", f32, [N], Replicated())  # the already all-reduced gradient
    w, m, v = (b.input(k, f32, [N], Replicated()) for k in ("w", "m", "v"))
    hp = {k: b.param(k, d) for k, d in {**HYPER, "step": step}.items()}
    b1, b2 = hp["beta1"], hp["beta2"]
    m_new = b1 * m + (1 - b1) * g
    v_new = b2 * v + (1 - b2) * g * g
    denom = b.sqrt(v_new) / b.sqrt(1 - b2 ** hp["step"]) + hp["eps"]
    b.update(m, m_new)
    b.update(v, v_new)
    b.update(w, w - (hp["lr"] / (1 - b1 ** hp["step"])) * (m_new / denom))
    return b.build()


class Generated:
    """The lowered Adam kernel bound to its buffers; `step()` runs it once over all elements."""

    def __init__(self, g, w, m, v, step: float = 1.0):
        program = adam_step_program(step)
        plan = lower(program, {"N": g.numel()}, 1)
        (compute,) = [s for s in plan.steps if isinstance(s, Compute)]
        self.kernel = compute.kernel
        self.fn = build([self.kernel], name="bench_adam")[self.kernel.name]
        given = {"g": g, "w": w, "m": m, "v": v}
        by_id = {}
        for name, bid in plan.inputs:
            x = given.get(name)
            by_id[bid] = (
                x
                if x is not None
                else torch.tensor(program.input(name).default, dtype=torch.float32)
            )
        self.args = [by_id[i] for i in self.kernel.args()]

    def step(self) -> None:
        self.fn(0, self.kernel.numel, 0, self.args)


def _state(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    g, w, m = (torch.randn(n, generator=gen) for _ in range(3))
    v = torch.rand(n, generator=gen)
    return g, w, m, v


def _torch_adam(g, w, m, v):
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    opt = torch.optim.Adam(
        [p], lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"], fused=True
    )
    opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    return p, opt


def _timed_ms(fns, repeats: int, warmup: int) -> list[tuple[float, float, float]]:
    """(median, min, max) ms of each fn; timed in turns so background load hits all alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return [(statistics.median(ts), min(ts), max(ts)) for ts in times]


def check(n: int = 1 << 12) -> float:
    """The largest |w_generated - w_torch| after one step from the same state (f32)."""
    g, w, m, v = _state(n, seed=1)
    p, opt = _torch_adam(g, w, m, v)
    opt.step()
    gen = Generated(g.clone(), w.clone(), m.clone(), v.clone(), step=1.0)
    gen.step()
    return float(
        (gen.args[gen.kernel.args().index(_input_buffer(gen, "w"))] - p.detach()).abs().max()
    )


def _input_buffer(gen: Generated, name: str) -> int:
    for s in gen.kernel.stmts:
        if s.op == "update" and s.args[0].name == name:
            return dict(gen.kernel.writes)[s.out.id]
    raise KeyError(name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch/OpenMP threads (0: torch's default)"
    )
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    g, w, m, v = _state(a.n)
    t0 = time.perf_counter()
    gen = Generated(g, w.clone(), m.clone(), v.clone())
    build_s = time.perf_counter() - t0
    _, opt = _torch_adam(g, w, m, v)
    gb = 28 * a.n / 1e9
    ours, theirs = _timed_ms([gen.step, opt.step], a.repeats, a.warmup)
    print(
        f"Adam step, n={a.n} f32, {torch.get_num_threads()} threads, median of {a.repeats} "
        f"timed in turns (min..max); generated-kernel build/load {build_s:.2f} s"
    )
    for label, (med, lo, hi) in (
        ("generated kernel", ours),
        ("torch.optim.Adam(fused=True)", theirs),
    ):
        print(f"  {label:30s} {med:9.3f} ms  ({lo:.3f}..{hi:.3f})  {gb / med * 1e3:6.1f} GB/s")
    print(f"  ratio generated/torch          {ours[0] / theirs[0]:9.3f}")
    print(f"  max |w_generated - w_torch| after one step: {check():.3g}")


if __name__ == "__main__":
    main()
