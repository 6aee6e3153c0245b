"""Mixed precision for the fused optimizers: the parameters' dtype, and dynamic loss scaling.

Contract
- `param_dtype(params, who)`: the one dtype of the parameters (float32, bfloat16 or float16),
  else a one-line ValueError (mixed dtypes, another dtype). `HALF[dtype]`: the DSL dtype of the
  mixed-precision programs for a low-precision one (`coconet.programs.adam_program(half=...)`).
- `LossScaler`: `torch.cuda.amp.GradScaler`'s dynamic scale S (init_scale 2**16, growth_factor 2,
  backoff_factor 0.5, growth_interval 2000): `update(found_inf)` halves S after an overflow and
  doubles it after `growth_interval` steps in a row without one; `state_dict()` in GradScaler's
  format (scale, growth_factor, backoff_factor, growth_interval, _growth_tracker) plus
  `skipped_steps`.
- The loss is scaled by S/P, not S (`FusedOptimizer.scale`): the reduce-scatter sums the P
  ranks' f16 gradients, so each is scaled to 1/P of DDP's, as DDP divides each by P before its
  all-reduce. `local_overflow(grads, P)`: 1.0 where a value of this rank's gradient (scaled by
  S/P) is not finite or exceeds 65504/P in magnitude, i.e. where DDP's gradient scaled by S would
  have overflowed f16, else 0.0 (a 0-d float32 tensor). With every rank's values within 65504/P
  the f16 sum cannot overflow, so a step that this check lets through is skipped by no bucket,
  and a step it flags is skipped by every bucket: the skip is whole-step, as GradScaler's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsl import bf16, f16

HALF = {torch.bfloat16: bf16, torch.float16: f16}
DTYPES = (torch.float32, *HALF)
F16_MAX = 65504.0  # the largest finite float16


def param_dtype(params, who: str) -> torch.dtype:
    """The parameters' one dtype (see the module doc)."""
    found = {p.dtype for p in params}
    if len(found) > 1:
        names = ", ".join(sorted(str(d) for d in found))
        raise ValueError(f"{who}: parameters of mixed dtypes ({names}); give them one dtype")
    dtype = found.pop() if found else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"{who}: parameters must be float32, bfloat16 or float16, got {dtype}")
    return dtype


def check_loss_scale(loss_scale, dtype: torch.dtype, who: str) -> bool:
    """Whether the step scales the loss: loss_scale "dynamic" (GradScaler's defaults) or a
    `LossScaler` (its own), with float16 parameters."""
    if loss_scale is None:
        return False
    if not (isinstance(loss_scale, LossScaler) or loss_scale == "dynamic"):
        raise ValueError(
            f"{who}: loss_scale must be None, 'dynamic' or a LossScaler, got {loss_scale!r}"
        )
    if dtype != torch.float16:
        raise ValueError(
            f"{who}: loss_scale='dynamic' is for float16 parameters, not {dtype} "
            "(bfloat16 has float32's range and needs no loss scaling)"
        )
    return True


@dataclass
class LossScaler:
    """GradScaler's dynamic loss scale (see the module doc); host state, updated per step."""

    scale: float = 2.0**16  # init_scale
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0  # steps in a row without an overflow
    skipped_steps: int = 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped_steps += 1
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict:
        return {
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.growth_tracker,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])
        self.growth_factor = float(sd["growth_factor"])
        self.backoff_factor = float(sd["backoff_factor"])
        self.growth_interval = int(sd["growth_interval"])
        self.growth_tracker = int(sd["_growth_tracker"])
        self.skipped_steps = int(sd.get("skipped_steps", 0))


def local_overflow(grads, P: int, out: torch.Tensor) -> torch.Tensor:
    """Write into the 0-d `out` 1.0 where a value of the flat gradients `grads` is not finite
    or beyond F16_MAX / P (NaN fails every comparison), else 0.0; returns `out`."""
    limit = F16_MAX / P
    ok = torch.ones((), dtype=torch.bool, device=out.device)
    for g in grads:
        lo, hi = torch.aminmax(g)  # NaN where g holds one
        ok &= (lo.float() >= -limit) & (hi.float() <= limit)
    return out.copy_(~ok)
