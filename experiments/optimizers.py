"""The data-parallel optimizer experiments' sizes, baselines and paper setting; the programs
(Adam, LAMB) and their schedules (`AR-C`, `RS-C-AG`, `fuse(RS-C-AG)`, each split one also
`+as_slice`) live in `coconet.programs`, below experiments, since the fused optimizers
(`coconet.FusedAdam`, `coconet.FusedLAMB`) run them too; they are re-exported here.

Baselines (`experiments.api.Baseline`, built from a rank's inputs g, w, m, v and the
hyper-parameters): the all-reduce of the gradient on the run's transport, averaged over the ranks as DDP does, then
`torch.optim.Adam(fused=True)` (`AdamBaseline`) or a vectorised torch LAMB (`LambBaseline`: torch
has none; Apex FusedLAMB without gradient clipping). `compute_ms` is the optimizer step's time.
The paper's setting (`paper_setting`): 8 and 16 DGX-2 (128 and 256 GPUs), 2^10 .. 2^30 elements
(every second power at default scale, 2^20 alone at smoke), scaled to any topology as all its
devices; every schedule in f32 (like for like), and the fused step also in the precision the
authors' binary ran it (`fuse(RS-C-AG)+as_slice+f16`), against the same f32 baseline.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np
import torch

from coconet.programs import adam_program, lamb_program, optimizer_schedules, published_schedule  # noqa: F401 (the experiments')
from codegen.runtime.backend import NO_STREAMS
from dsl import f32

from .api import BaselineContext, PaperSetting


def optimizer_bindings(scale: str) -> list[dict[str, int]]:
    return {
        "smoke": [{"N": 48}],
        "default": [{"N": 48}, {"N": 1000 * 12}],
        "paper": [{"N": 48}, {"N": 1 << 16}],
    }[scale]


def optimizer_points(scale: str, max_elements: int) -> list[dict[str, int]]:
    """Gradient sizes N to measure: powers of two (every other one at default scale, whose points
    each take up to the scale's budget_s of interleaved rounds), capped by max_elements."""
    lo, hi, step = {"smoke": (12, 16, 1), "default": (20, 24, 2), "paper": (20, 30, 1)}[scale]
    return [{"N": 1 << k} for k in range(lo, hi + 1, step) if 1 << k <= max_elements]


_DP_SIZES = {
    "smoke": [1 << 20],
    "default": [1 << k for k in range(10, 31, 2)],
    "paper": [1 << k for k in range(10, 31)],
}


def paper_setting(program) -> PaperSetting:
    """Where the paper ran an optimizer experiment: DGX-2 clusters of 128 and 256 V100 (every
    device of the topology), f32 like for like, and the fused step also as the authors' binary
    ran it (`coconet.programs.published_schedule`: f16 communication, f32 state)."""
    return PaperSetting(
        topologies=(("dgx2", 8), ("dgx2", 16)),
        world_size=256,
        dtype=f32,
        points={s: [{"N": n} for n in v] for s, v in _DP_SIZES.items()},
        world_on=lambda topo: topo.devices,
        published=lambda: _published(program(mixed=True)),
    )


def _published(mixed):
    return mixed, published_schedule(mixed)


class DataParallelBaseline:
    """all_reduce of the gradient g, averaged, then the optimizer's `update` on w, m, v (in place);
    `compute_ms` accumulates the update's time. `routine`: where set, the library routine
    `local_step` is, whose time reads the machine's memory rate (calibration times it alone,
    `library_<routine>`, on `program`'s inputs; `experiments.predict.memory_scale`): one pass
    over its data, as torch's fused Adam. The torch LAMB has none: it allocates N-element
    temporaries every step, and its time moved 1.6x between runs (63 against 100-103 ms at 2^24
    elements) where the generated kernels' did not. `probe`: for such a baseline, the routine
    (of LIBRARY_BASELINES) the harness times beside it in the same rounds, on a copy of the
    rank's inputs, to read the memory rate from instead (`memory_probe`; the baseline row's
    `probe_ms`)."""

    routine: str = ""
    probe: str = ""

    def __init__(self, ctx: BaselineContext):
        t = ctx.tensors()
        self.hp = {k: float(v) for k, v in t.items() if v.dim() == 0}
        self.w, self.m, self.v, self.g = t["w"], t["m"], t["v"], t["g"].reshape(-1)
        self.world, self.t, self.compute_ms = ctx.world_size, int(self.hp["step"]) - 1, 0.0
        self.groups = ctx.groups
        # the run's transport (gloo, NCCL, shared memory), as the schedules use it; none for a
        # baseline built without ranks (only `local_step` runs then)
        self.comm = (
            ctx.backend.communicator(ctx.groups.world, NO_STREAMS)
            if ctx.groups is not None
            else None
        )

    @classmethod
    def memory_probe(cls, ctx: BaselineContext) -> Optional["DataParallelBaseline"]:
        """The library routine `probe` names, built on a copy of this rank's inputs with no
        ranks around it, as calibration's `library_<routine>` is (timed by its `alone_step`).
        None where the baseline names no probe."""
        if not cls.probe:
            return None
        routine = next(c for c in LIBRARY_BASELINES if c.routine == cls.probe)
        return routine(dataclasses.replace(ctx, groups=None))

    def step(self) -> None:
        self.comm.all_reduce(self.g, "sum")
        self.local_step()

    def local_step(self) -> None:
        """The step after the all-reduce, on the summed gradient in g (timed: compute_ms)."""
        start = time.perf_counter()
        self.g.div_(self.world)
        self.t += 1
        self.update()
        self.compute_ms += (time.perf_counter() - start) * 1e3

    def alone_step(self) -> None:
        """`local_step` (timed in compute_ms) with no ranks around it: the gradient is scaled
        back untimed afterwards (a run's all-reduce sums the ranks' before each step; unscaled,
        it would shrink towards denormals)."""
        self.local_step()
        self.g.mul_(self.world)

    def update(self) -> None:
        raise NotImplementedError

    def outputs(self) -> dict[str, np.ndarray]:
        return {k: x.cpu().numpy().copy() for k, x in (("w", self.w), ("m", self.m), ("v", self.v))}


class AdamBaseline(DataParallelBaseline):
    """torch.optim.Adam(fused=True) holding this rank's m, v as its state (exp_avg, exp_avg_sq)."""

    routine, program = "adam", staticmethod(adam_program)

    def __init__(self, ctx: BaselineContext):
        super().__init__(ctx)
        hp = self.hp
        self.w.grad = self.g
        self.opt = torch.optim.Adam(
            [self.w], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], fused=True
        )
        self.opt.state[self.w] = {
            "step": torch.tensor(float(self.t), device=self.w.device),
            "exp_avg": self.m,
            "exp_avg_sq": self.v,
        }

    def update(self) -> None:
        self.opt.step()


class LambBaseline(DataParallelBaseline):
    probe = "adam"

    def update(self) -> None:
        lamb_step(self.w, self.m, self.v, self.g, self.t, self.hp)


LIBRARY_BASELINES = (AdamBaseline,)  # calibration's `library_<routine>` benches


@torch.no_grad()
def lamb_step(w, m, v, g, t: int, hp: dict) -> None:
    """LAMB as a practitioner writes it in torch (vectorised, no gradient clipping)."""
    b1, b2 = hp["beta1"], hp["beta2"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u = (m / (1 - b1**t)).div_((v / (1 - b2**t)).sqrt_().add_(hp["eps"]))
    u.add_(w, alpha=hp["weight_decay"])
    # norms accumulated in f64: torch's f32 CPU norm drifts by 0.2% at 2^25 elements, more than
    # the reduction-order difference the check allows (apex's GPU LAMB reduces in blocks)
    r_w = torch.linalg.vector_norm(w, dtype=torch.float64).to(w.dtype)
    r_u = torch.linalg.vector_norm(u, dtype=torch.float64).to(w.dtype)
    one = torch.ones((), dtype=w.dtype, device=w.device)
    trust = torch.where(r_w > 0, torch.where(r_u > 0, r_w / r_u, one), one)
    w.sub_(hp["lr"] * trust * u)
