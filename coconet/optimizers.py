"""`FusedAdam`, `FusedAdamW` and `FusedLAMB`: torch's Adam and AdamW (and LAMB) as fused steps
(`coconet.optim.FusedOptimizer`: reduce-scatter, the update of this rank's slice, all-gather).

    opt = coconet.FusedAdamW(groups, lr=1e-4, weight_decay=0.01)   # groups as for torch's AdamW
    loss.backward(); opt.clip_grad_norm(1.0); opt.step(); opt.zero_grad()

Each takes torch's arguments and gives torch's `state_dict` (per parameter `step`, `exp_avg`,
`exp_avg_sq`, and `max_exp_avg_sq` with amsgrad): a checkpoint loads into `torch.optim.Adam` /
`torch.optim.AdamW` and resumes there. Per-group options work as in torch (a group without
weight decay for biases and norms, another learning rate for embeddings): every hyper-parameter
is read from the bucket's group at every step. `amsgrad` is fixed at construction, as is whether
the step has a weight-decay term at all (FusedAdam: when some group asks for one).

Mixed precision (`coconet.optim`'s contract): with bfloat16 or float16 parameters the step keeps
f32 master weights as slices (checkpointed per parameter as `master_weight`), and with float16
`loss_scale="dynamic"` scales the loss as `torch.cuda.amp.GradScaler` does:

    model = Net().to(torch.float16)
    opt = coconet.FusedAdamW(model.parameters(), lr=1e-4, loss_scale="dynamic")
    opt.zero_grad(); opt.scale(loss_fn(model(x), y)).backward(); took = opt.step()
    opt.loss_scale, opt.skipped_steps   # GradScaler's get_scale(); steps skipped for overflow
"""

from __future__ import annotations

from typing import Optional

import torch

from . import precision, programs
from .optim import ADAM_STATE, FusedOptimizer


def _names(program) -> dict:
    """torch's names of the program's state (`FusedOptimizer`'s `state_names`)."""
    return {n: ADAM_STATE[n] for n in programs.state_of(program)}


def _listed(params) -> list:
    """`params` (tensors or param groups) as a list, each group's params a list (read once)."""
    out = []
    for x in params:
        if isinstance(x, dict):
            ps = x["params"]
            x = {**x, "params": [ps] if isinstance(ps, torch.Tensor) else list(ps)}
        out.append(x)
    return out


def _precision(params: list, loss_scale, who: str) -> dict:
    """The programs' `half` and `loss_scale` arguments for these parameters (a `_listed`
    list): a one-line ValueError for mixed dtypes, another dtype, or loss scaling asked of
    parameters that are not float16."""
    flat = [p for x in params for p in (x["params"] if isinstance(x, dict) else [x])]
    dtype = precision.param_dtype(flat, who)
    scaled = precision.check_loss_scale(loss_scale, dtype, who)
    return {"half": precision.HALF.get(dtype), "loss_scale": scaled}


class FusedAdam(FusedOptimizer):
    """torch.optim.Adam (bias-corrected; `weight_decay` as its L2 term added to the averaged
    gradient; `amsgrad`) as the generated fused step. Parameters float32, bfloat16 or float16
    (the latter two with f32 master weights); `loss_scale` (float16 only): None, "dynamic"
    (GradScaler's init_scale 2**16, growth_factor 2, backoff_factor 0.5, growth_interval 2000)
    or a `coconet.LossScaler` of other settings; backward then on `opt.scale(loss)`, and
    `step()` returns whether it stepped (see `coconet.optim`)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        group=None,
        bucket_cap_numel: Optional[int] = 1 << 22,
        chunks: int = 4,
        backend="cpu",
        loss_scale=None,  # None, "dynamic" or a coconet.LossScaler (float16 params)
        _decay: Optional[str] = None,  # FusedAdamW's "decoupled"
    ):
        params = _listed(params)  # a generator is read once; the groups' options are looked at
        if _decay is None:
            asked = bool(weight_decay) or any(
                isinstance(g, dict) and g.get("weight_decay") for g in params
            )
            _decay = "l2" if asked else ""
        mixed = _precision(params, loss_scale, type(self).__name__)
        program = programs.adam_program(weight_decay=_decay, amsgrad=amsgrad, **mixed)
        super().__init__(
            params,
            {
                "lr": lr,
                "betas": tuple(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": amsgrad,
            },
            program,
            state_names=_names(program),
            group=group,
            bucket_cap_numel=bucket_cap_numel,
            chunks=chunks,
            backend=backend,
            loss_scale=loss_scale,
        )


class FusedAdamW(FusedAdam):
    """torch.optim.AdamW (decoupled weight decay: w scaled by 1 - lr * weight_decay, then Adam's
    step; `amsgrad`) as the generated fused step; torch's defaults (weight_decay 0.01); mixed
    precision and `loss_scale` as FusedAdam's."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        **options,  # FusedAdam's: group, bucket_cap_numel, chunks, backend, loss_scale
    ):
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, _decay="decoupled", **options
        )


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al. 2020; Apex FusedLAMB without gradient clipping) as the generated fused
    step: Adam's bias-corrected direction plus decoupled weight decay, scaled by the trust ratio
    ||w|| / ||u|| of each parameter tensor (per-tensor norms inside each bucket: segments, so
    buckets of `bucket_cap_numel` as FusedAdam's; `per_tensor=False`: one ratio per bucket);
    mixed precision and `loss_scale` as FusedAdam's (the norms of the f32 master slices)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        group=None,
        bucket_cap_numel: Optional[int] = 1 << 22,
        chunks: int = 4,
        backend="cpu",
        loss_scale=None,  # None, "dynamic" or a coconet.LossScaler (float16 params)
        per_tensor: bool = True,
    ):
        params = _listed(params)
        mixed = _precision(params, loss_scale, type(self).__name__)
        lamb = programs.lamb_program(**mixed, segments=int(per_tensor))

        def per_bucket(spec):
            return programs.lamb_program(**mixed, segments=len(spec.slots)) if per_tensor else lamb

        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay},
            lamb,
            state_names=_names(lamb),
            group=group,
            bucket_cap_numel=bucket_cap_numel,
            chunks=chunks,
            backend=backend,
            loss_scale=loss_scale,
            per_bucket=per_bucket,
        )
