"""The data-parallel optimizer programs (Adam, LAMB), the schedules the paper derives from them,
and their library baselines.

Both follow the real update rules of `torch.optim.Adam` (bias correction, sqrt, epsilon) and of
LAMB (You et al. 2020; Apex FusedLAMB without gradient clipping): the gradient is all-reduced and
averaged over the P ranks first, as DDP does.

Schedules (Fig. 10): `AR-C` (the program), `RS-C-AG` (split + reorder), `fuse(RS-C-AG)`, and
`fuse(RS-C-AG)+as_slice` (optimizer state m and v kept only as slices, ZeRO-style).

Baselines (`experiments.api.Baseline`, built from a rank's inputs g, w, m, v and the
hyper-parameters): `dist.all_reduce` of the gradient, averaged over the ranks as DDP does, then
`torch.optim.Adam(fused=True)` (`AdamBaseline`) or a vectorised torch LAMB (`LambBaseline`: torch
has none; Apex FusedLAMB without gradient clipping). `compute_ms` is the optimizer step's time.
The paper's setting (`PAPER`): 16 DGX-2 (256 GPUs), 2^10 .. 2^30 elements (every second power at
default scale, 2^20 alone at smoke), scaled to any topology as all its devices.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from dsl import Builder, Local, P, Program, Replicated, f32, sym
from dsl.transforms import as_slice, fuse, reorder, split

from .api import BaselineContext, PaperSetting

N = sym("N")


def _moments(b: Builder):
    """Inputs, averaged gradient, new moments and bias corrections shared by Adam and LAMB."""
    g = b.input("g", f32, [N], Local())
    w = b.input("w", f32, [N], Replicated())
    m = b.input("m", f32, [N], Replicated())
    v = b.input("v", f32, [N], Replicated(), init="positive")
    hp = {k: b.param(k, d) for k, d in (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999),
                                        ("eps", 1e-8), ("step", 3.0))}
    g_avg = b.all_reduce(g, name="g.sum") * (1 / P)
    b1, b2 = hp["beta1"], hp["beta2"]
    m_new = b.op("add", b1 * m, (1 - b1) * g_avg, name="m.next")
    v_new = b.op("add", b2 * v, (1 - b2) * g_avg * g_avg, name="v.next")
    bc1 = 1 - b1 ** hp["step"]
    bc2 = 1 - b2 ** hp["step"]
    return w, m, v, m_new, v_new, bc1, bc2, hp


def adam_program(dtype=f32) -> Program:
    b = Builder("adam")
    w, m, v, m_new, v_new, bc1, bc2, hp = _moments(b)
    denom = b.sqrt(v_new) / b.sqrt(bc2) + hp["eps"]
    w_new = w - (hp["lr"] / bc1) * (m_new / denom)
    b.update(m, m_new)
    b.update(v, v_new)
    b.update(w, w_new)
    return b.build(schedule="AR-C")


def lamb_program(dtype=f32) -> Program:
    b = Builder("lamb")
    w, m, v, m_new, v_new, bc1, bc2, hp = _moments(b)
    wd = b.param("weight_decay", 0.01)
    u = (m_new / bc1) / (b.sqrt(v_new / bc2) + hp["eps"]) + wd * w
    r_w = b.norm(w, name="norm.w")
    r_u = b.norm(u, name="norm.u")
    trust = b.where(r_w > 0, b.where(r_u > 0, r_w / r_u, 1.0), 1.0, name="trust")
    w_new = w - hp["lr"] * trust * u
    b.update(m, m_new)
    b.update(v, v_new)
    b.update(w, w_new)
    return b.build(schedule="AR-C")


def optimizer_schedules(p: Program) -> dict[str, Program]:
    """AR-C, RS-C-AG, fuse(RS-C-AG), each split schedule also with m and v kept as slices.

    The paper's own RS-C-AG and fuse(RS-C-AG) for Adam keep the optimizer state as slices (the
    authors' examples/adam/adam.cpp applies asSlice({m, v})): those are the `+as_slice` ones here.
    Without it, the step must all-gather m and v too, three times the all-gather traffic."""
    rs_c_ag = reorder(split(p))
    sliced = as_slice(as_slice(rs_c_ag, "m"), "v")
    return {q.schedule: q for q in (p, rs_c_ag, sliced, fuse(rs_c_ag), fuse(sliced))}


def optimizer_bindings(scale: str) -> list[dict[str, int]]:
    return {"smoke": [{"N": 48}], "default": [{"N": 48}, {"N": 1000 * 12}],
            "paper": [{"N": 48}, {"N": 1 << 16}]}[scale]


def optimizer_points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Gradient sizes N to measure: powers of two, capped by the scale's max_elements."""
    lo, hi = {"smoke": (12, 16), "default": (20, 25), "paper": (20, 30)}[scale]
    return [{"N": 1 << k} for k in range(lo, hi + 1) if 1 << k <= max_elements]


RTOL = 2e-6  # f32: one step differs only by reduction and op order (a few ulp of w, m, v)
_DP_SIZES = {"smoke": [1 << 20], "default": [1 << k for k in range(10, 31, 2)],
             "paper": [1 << k for k in range(10, 31)]}
PAPER = PaperSetting(topologies=(("dgx2", 16),), world_size=256, dtype=f32,
                     points={s: [{"N": n} for n in v] for s, v in _DP_SIZES.items()},
                     world_on=lambda topo: topo.devices)


class DataParallelBaseline:
    """all_reduce of the gradient g, averaged, then the optimizer's `update` on w, m, v (in place);
    `compute_ms` accumulates the update's time."""

    def __init__(self, ctx: BaselineContext):
        t = ctx.tensors()
        self.hp = {k: float(v) for k, v in t.items() if v.dim() == 0}
        self.w, self.m, self.v, self.g = t["w"], t["m"], t["v"], t["g"].reshape(-1)
        self.world, self.t, self.compute_ms = ctx.world_size, int(self.hp["step"]) - 1, 0.0
        self.groups = ctx.groups

    def step(self) -> None:
        dist.all_reduce(self.g, group=self.groups.world.pg)
        self.local_step()

    def local_step(self) -> None:
        """The step after the all-reduce, on the summed gradient in g (timed: compute_ms)."""
        start = time.perf_counter()
        self.g.div_(self.world)
        self.t += 1
        self.update()
        self.compute_ms += (time.perf_counter() - start) * 1e3

    def update(self) -> None:
        raise NotImplementedError

    def outputs(self) -> dict[str, np.ndarray]:
        return {k: x.cpu().numpy().copy() for k, x in (("w", self.w), ("m", self.m),
                                                        ("v", self.v))}


class AdamBaseline(DataParallelBaseline):
    """torch.optim.Adam(fused=True) holding this rank's m, v as its state (exp_avg, exp_avg_sq)."""

    def __init__(self, ctx: BaselineContext):
        super().__init__(ctx)
        hp = self.hp
        self.w.grad = self.g
        self.opt = torch.optim.Adam([self.w], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                    eps=hp["eps"], fused=True)
        self.opt.state[self.w] = {"step": torch.tensor(float(self.t), device=self.w.device),
                                  "exp_avg": self.m, "exp_avg_sq": self.v}

    def update(self) -> None:
        self.opt.step()


class LambBaseline(DataParallelBaseline):
    def update(self) -> None:
        lamb_step(self.w, self.m, self.v, self.g, self.t, self.hp)


@torch.no_grad()
def lamb_step(w, m, v, g, t: int, hp: dict) -> None:
    """LAMB as a practitioner writes it in torch (vectorised, no gradient clipping)."""
    b1, b2 = hp["beta1"], hp["beta2"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u = (m / (1 - b1 ** t)).div_((v / (1 - b2 ** t)).sqrt_().add_(hp["eps"]))
    u.add_(w, alpha=hp["weight_decay"])
    # norms accumulated in f64: torch's f32 CPU norm drifts by 0.2% at 2^25 elements, more than
    # the reduction-order difference the check allows (apex's GPU LAMB reduces in blocks)
    r_w = torch.linalg.vector_norm(w, dtype=torch.float64).to(w.dtype)
    r_u = torch.linalg.vector_norm(u, dtype=torch.float64).to(w.dtype)
    one = torch.ones((), dtype=w.dtype, device=w.device)
    trust = torch.where(r_w > 0, torch.where(r_u > 0, r_w / r_u, one), one)
    w.sub_(hp["lr"] * trust * u)
