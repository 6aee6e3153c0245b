"""coconet: mixed precision in the fused optimizers, on 2 gloo ranks against torch.

One launch of 2 ranks runs every distributed check (`_rank`); a 2-layer MLP, each rank on its
half of every batch:
- bf16 parameters, f32 master weights kept as slices: FusedAdamW (weight decay 0.01) for 100
  steps against a DDP-style reference: torch.optim.AdamW on f32 master copies of bf16 params,
  the bf16 gradients summed in bf16 (as the fused step's reduce-scatter does) and averaged in f32;
  losses within 1e-3 relative at step 100;
- f16 with dynamic loss scaling: an inf in rank 1's gradient at one step makes every rank skip
  that step (weights unchanged, `skipped_steps == 1`, the scale halved), against torch's own
  GradScaler over a DDP-style f16 all-reduce (DDP divides by P first) that skips the same step;
  the losses, scales and skips agree over 40 steps;
- FusedLAMB in bf16 and f16 (loss scaled) trains as FusedLAMB in f32 (within 2% after 30 steps);
- checkpoints: a bf16 FusedAdamW's gathered and sharded state_dicts (f32 master weights per
  parameter) resume in a fresh FusedAdamW with the same losses as without the interruption, and
  an f16 one resumes with its loss scale;
- bad input: one-line ValueErrors, before any collective.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import coconet
from coconet import FusedAdamW, LossScaler
from codegen.runtime.launch import launch

BATCH, LR, WD = 32, 3e-3, 0.01  # samples per rank and step
INJECT = 10  # the step whose gradient gets an inf on rank 1
SCALER = {"init_scale": 2.0**10, "growth_interval": 15}  # growth twice in 40 steps


def net(dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    return m.to(dtype)


def batch(step: int, rank: int, dtype):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(2 * BATCH, 16, generator=g)
    y = torch.stack([x[:, :4].sum(1), x[:, 4:8].prod(1), x[:, 8].sin(), x[:, 9:].mean(1)], 1)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    return x[mine].to(dtype), y[mine].to(dtype)


def loss_of(model, step, rank, dtype):
    x, y = batch(step, rank, dtype)
    return torch.nn.functional.mse_loss(model(x).float(), y.float())


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


# -- the reference: DDP-style, f32 master copies, the low-precision gradient reduced -------------
def _reduced(grad: torch.Tensor, world: int) -> torch.Tensor:
    """The sum over the ranks of a low-precision gradient, rounded to its dtype once (as gloo's
    f16/bf16 all-reduce and the fused step's reduce-scatter of 2 ranks do)."""
    parts = [torch.empty_like(grad, dtype=torch.float32) for _ in range(world)]
    dist.all_gather(parts, grad.float())
    return torch.stack(parts).sum(0).to(grad.dtype)


class Reference:
    """torch.optim.AdamW on f32 masters of the model's low-precision parameters; with `scaler`
    (torch.amp.GradScaler) DDP + GradScaler: the loss scaled by S, each rank's gradient divided
    by P in f16 and then all-reduced, unscaled and checked for overflow by the scaler."""

    def __init__(self, model, world, scaler=None):
        self.model, self.world, self.scaler = model, world, scaler
        self.master = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
        self.opt = torch.optim.AdamW(self.master, lr=LR, weight_decay=WD)

    def scale(self, loss):
        return self.scaler.scale(loss) if self.scaler else loss

    @torch.no_grad()
    def step(self) -> None:
        for p, q in zip(self.model.parameters(), self.master):
            g = p.grad if self.scaler is None else p.grad / self.world  # DDP's pre-division
            summed = _reduced(g, self.world).float()
            q.grad = summed if self.scaler else summed / self.world
            p.grad = None
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        for p, q in zip(self.model.parameters(), self.master):
            p.copy_(q)


def _train(model, opt, rank, dtype, steps, start=0, inject=None):
    """Losses per step, and per step whether the weights changed (and what step() said)."""
    losses, moved = [], []
    for step in range(start, start + steps):
        opt.zero_grad() if isinstance(opt, torch.optim.Optimizer) else None
        loss = loss_of(model, step, rank, dtype)
        opt.scale(loss).backward()
        if step == inject and rank == 1:
            next(model.parameters()).grad[0, 0] = float("inf")
        before = flat(model)
        said = opt.step()
        losses.append(float(loss.detach()))
        moved.append((not torch.equal(before, flat(model)), said))
    return losses, moved


def _bf16(rank, world, steps=100):
    model = net(torch.bfloat16)
    fused = _train(
        model, FusedAdamW(model.parameters(), lr=LR, weight_decay=WD), rank, torch.bfloat16, steps
    )[0]
    ref_model = net(torch.bfloat16)
    ref = _train(ref_model, Reference(ref_model, world), rank, torch.bfloat16, steps)[0]
    return fused, ref


def _f16(rank, world, steps=40):
    model = net(torch.float16)
    opt = FusedAdamW(
        model.parameters(),
        lr=LR,
        weight_decay=WD,
        loss_scale=LossScaler(
            scale=SCALER["init_scale"], growth_interval=SCALER["growth_interval"]
        ),
    )
    scales = []
    out = {"fused": [], "ref": []}
    for step in range(steps):
        out["fused"].append(_train(model, opt, rank, torch.float16, 1, step, INJECT))
        scales.append(opt.loss_scale)
    ref_model = net(torch.float16)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    ref = Reference(ref_model, world, scaler)
    ref_scales = []
    for step in range(steps):
        out["ref"].append(_train(ref_model, ref, rank, torch.float16, 1, step, INJECT))
        ref_scales.append(scaler.get_scale())
    state = opt.state_dict()["loss_scaler"]
    return out, scales, ref_scales, opt.skipped_steps, state, flat(model)


def _resume(rank, dtype, loss_scale=None):
    """Losses of 5 steps after 5, straight on and resumed from each kind of checkpoint."""

    def fresh(weights=None):
        model = net(dtype)
        if weights is not None:
            model.load_state_dict(weights)
        return model, FusedAdamW(model.parameters(), lr=0.5, weight_decay=WD, loss_scale=loss_scale)

    model, opt = fresh()
    for g in opt.param_groups:
        g["lr"] = LR
    _train(model, opt, rank, dtype, 5)
    saved = {"gathered": opt.state_dict(), "sharded": opt.sharded_state_dict()}
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    straight = _train(model, opt, rank, dtype, 5, start=5)[0]
    resumed = {}
    for kind, sd in saved.items():
        again_model, again = fresh(weights)
        again.load_state_dict(sd)
        resumed[kind] = _train(again_model, again, rank, dtype, 5, start=5)[0]
    master = {
        k: (v["master_weight"].dtype, tuple(v["master_weight"].shape))
        for k, v in saved["gathered"]["state"].items()
    }
    shapes = {k: (torch.float32, tuple(p.shape)) for k, p in enumerate(net(dtype).parameters())}
    return straight, resumed, master == shapes


def _lamb(rank, dtype, loss_scale=None):
    """FusedLAMB in bf16 (and f16 with loss scaling): losses of 30 steps, the final weights."""
    model = net(dtype)
    opt = coconet.FusedLAMB(model.parameters(), lr=LR, loss_scale=loss_scale)
    losses = _train(model, opt, rank, dtype, 30)[0]
    return losses, flat(model)


def _rank(rank, world):
    out = {"bf16": _bf16(rank, world), "f16": _f16(rank, world)}
    out["lamb"] = {
        "f32": _lamb(rank, torch.float32),
        "bf16": _lamb(rank, torch.bfloat16),
        "f16": _lamb(rank, torch.float16, "dynamic"),
    }
    out["resume_bf16"] = _resume(rank, torch.bfloat16)
    out["resume_f16"] = _resume(rank, torch.float16, "dynamic")
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch(_rank, 2, timeout_s=600)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_bf16_fused_adamw_trains_as_adamw_on_f32_masters(ranks):
    for r in ranks:
        fused, ref = (np.array(x) for x in r["bf16"])
        assert fused[-5:].mean() < 0.5 * fused[:5].mean()  # it trains
        rel = abs(fused[-1] - ref[-1]) / abs(ref[-1])
        assert rel <= 1e-3, (rel, fused[-1], ref[-1])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(ranks):
    for r in ranks:
        out, scales, ref_scales, skipped, scaler_state, _ = r["f16"]
        moved = [m for (_, ms) in out["fused"] for m in ms]
        assert moved[INJECT] == (False, False)  # weights unchanged, step() said so
        assert all(m == (True, True) for k, m in enumerate(moved) if k != INJECT)
        assert skipped == 1 and scaler_state["skipped_steps"] == 1
        assert scales[INJECT] == scales[INJECT - 1] / 2
        assert scales == ref_scales  # halved once, then grown as GradScaler grows it
        assert scales[-1] > scales[INJECT]
        ref_moved = [m[0] for (_, ms) in out["ref"] for m in ms]
        assert ref_moved == [m[0] for m in moved]  # the reference skipped the same step
        fused = np.array([x for (ls, _) in out["fused"] for x in ls])
        ref = np.array([x for (ls, _) in out["ref"] for x in ls])
        assert np.abs(fused - ref).max() <= 1e-3 * np.abs(ref).max(), np.abs(fused - ref).max()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_ranks_skip_alike_and_hold_the_same_weights(ranks):
    a, b = ([m for (_, ms) in r["f16"][0]["fused"] for m in ms] for r in ranks)
    assert a == b
    assert torch.equal(ranks[0]["f16"][-1], ranks[1]["f16"][-1])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_a_mixed_precision_checkpoint_resumes_as_without_interruption(ranks, kind):
    """The checkpoint holds the f32 master weights per parameter (`master_weight`, the
    parameter's shape) beside exp_avg and exp_avg_sq (and the loss scaler's state for f16)."""
    for r in ranks:
        straight, resumed, masters_f32 = r[f"resume_{kind}"]
        assert masters_f32
        assert resumed["gathered"] == straight and resumed["sharded"] == straight


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_fused_lamb_trains_in_mixed_precision(ranks, kind):
    """As FusedLAMB in f32 within 2% (the rounding of the inputs), the ranks alike."""
    (losses, w0), (_, w1) = (r["lamb"][kind] for r in ranks)
    f32 = np.array(ranks[0]["lamb"]["f32"][0])
    assert np.mean(losses[-5:]) < 0.85 * np.mean(losses[:5])
    assert np.abs(np.mean(losses[-5:]) - f32[-5:].mean()) <= 0.02 * f32[-5:].mean()
    assert torch.equal(w0, w1)


# -- bad input: before any collective, no ranks needed -------------------------------------------
@pytest.mark.parametrize(
    "params, options, said",
    [
        (
            lambda: net(torch.bfloat16).parameters(),
            {"loss_scale": "dynamic"},
            "loss_scale='dynamic' is for float16 parameters, not torch.bfloat16",
        ),
        (
            lambda: net(torch.float32).parameters(),
            {"loss_scale": "dynamic"},
            "loss_scale='dynamic' is for float16 parameters, not torch.float32",
        ),
        (
            lambda: net(torch.float16).parameters(),
            {"loss_scale": 128.0},
            "loss_scale must be None, 'dynamic' or a LossScaler, got 128.0",
        ),
        (
            lambda: [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2).half())],
            {},
            "parameters of mixed dtypes (torch.float16, torch.float32)",
        ),
        (
            lambda: [torch.nn.Parameter(torch.ones(2).double())],
            {},
            "parameters must be float32, bfloat16 or float16, got torch.float64",
        ),
    ],
)
def test_bad_mixed_precision_input_is_a_one_line_value_error(params, options, said):
    for cls in (coconet.FusedAdam, coconet.FusedAdamW, coconet.FusedLAMB):
        with pytest.raises(ValueError) as e:
            cls(params(), **options)
        assert said in str(e.value) and "\n" not in str(e.value)
        assert str(e.value).startswith(cls.__name__)


def test_the_loss_scaler_follows_grad_scaler():
    """Halved after an overflow, doubled after growth_interval good steps in a row."""
    ours = LossScaler(scale=8.0, growth_interval=3)
    theirs = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    for found in (False, True, False, False, False, False, True, False, False, False, False):
        theirs.scale(torch.ones(()))
        p.grad = torch.tensor([float("inf") if found else 1.0])
        theirs.step(opt)
        theirs.update()
        ours.update(found)
        assert ours.scale == theirs.get_scale()
    assert ours.skipped_steps == 2
    state = ours.state_dict()
    assert {k: v for k, v in state.items() if k != "skipped_steps"} == theirs.state_dict()
