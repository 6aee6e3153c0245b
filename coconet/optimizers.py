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
"""

from __future__ import annotations

from typing import Optional

from . import programs
from .optim import ADAM_STATE, FusedOptimizer


def _names(program) -> dict:
    """torch's names of the program's state (`FusedOptimizer`'s `state_names`)."""
    return {n: ADAM_STATE[n] for n in programs.state_of(program)}


class FusedAdam(FusedOptimizer):
    """torch.optim.Adam (bias-corrected; `weight_decay` as its L2 term added to the averaged
    gradient; `amsgrad`) as the generated fused step."""

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
        _decay: Optional[str] = None,  # FusedAdamW's "decoupled"
    ):
        params = list(params)  # a generator is read once; the groups' options are looked at
        if _decay is None:
            asked = bool(weight_decay) or any(
                isinstance(g, dict) and g.get("weight_decay") for g in params
            )
            _decay = "l2" if asked else ""
        program = programs.adam_program(weight_decay=_decay, amsgrad=amsgrad)
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
        )


class FusedAdamW(FusedAdam):
    """torch.optim.AdamW (decoupled weight decay: w scaled by 1 - lr * weight_decay, then Adam's
    step; `amsgrad`) as the generated fused step; torch's defaults (weight_decay 0.01)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        **options,  # FusedAdam's: group, bucket_cap_numel, chunks, backend
    ):
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, _decay="decoupled", **options
        )


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al. 2020; Apex FusedLAMB without gradient clipping) as the generated fused
    step: Adam's bias-corrected direction plus decoupled weight decay, scaled by the trust ratio
    ||w|| / ||u|| of each bucket (by default one bucket per parameter tensor)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        group=None,
        bucket_cap_numel: Optional[int] = None,
        chunks: int = 4,
        backend="cpu",
    ):
        lamb = programs.lamb_program()
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay},
            lamb,
            state_names=_names(lamb),
            group=group,
            bucket_cap_numel=bucket_cap_numel,
            chunks=chunks,
            backend=backend,
        )
