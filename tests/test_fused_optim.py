"""coconet: the compile API and the fused optimizers, on 2 gloo ranks against torch.

One launch of 2 ranks runs every distributed check (`_rank`) and returns what the tests assert:
- compile: the generated fuse(RS-C-AG)+as_slice Adam step on the caller's tensors equals
  `dsl.interpret` of the program, writes the caller's w in place, and names a bad input;
- FusedAdam / FusedLAMB / FusedAdamW against DDP + torch.optim.Adam(fused=True) / a torch LAMB /
  torch.optim.AdamW(fused=True), from the same initialisation and data, with param groups and a
  LambdaLR warm-up: losses after 50 (Adam), 20 (LAMB) and 30 (AdamW: weight decay 0.01 but on
  biases and norms, amsgrad, gradients clipped to norm 0.5) steps within 1e-5 relative;
  optimizer state per rank 1/P of torch's;
- clip_grad_norm: the norm of the averaged gradient, as torch's after DDP (1e-5), not the local;
- a FusedAdamW checkpoint loads into torch.optim.AdamW, which goes on as the fused one (1e-5);
- a user's own program (Nesterov SGD) in FusedOptimizer against DDP + torch.optim.SGD (1e-5);
- state_dict round trips, gathered and sharded, resume bit-identically; the gathered one loads
  into torch.optim.Adam and continues as the fused one does;
- gradients: views of the buckets that zero_grad zeroes and backward fills; a replaced .grad is
  copied in, a None one counts as zeros.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import dsl
from coconet import FusedAdam, FusedOptimizer, compile
from coconet.buckets import layout
from coconet.programs import adam_program, sliced_schedule
from codegen.runtime.launch import launch
from experiments import bert as B

SIZE = B.ModelSize(layers=2, hidden=32, heads=2, vocab=64, seq=16)
HP = {
    "lr": 2e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.01,
    "embedding_lr_scale": 2.0,
}
MICRO_BATCH = 4
# AdamW as a BERT recipe runs it: weight decay 0.01 but not on biases and norms, amsgrad, and the
# gradient clipped to a norm it exceeds (about 1 to 3 on this model) at every step
HP_W = {**HP, "no_decay": True, "amsgrad": True}
CLIP = 0.5


# -- pure ------------------------------------------------------------------------------------------
def test_layout_packs_params_of_one_group_in_order_and_pads():
    out = layout([[10, 20, 5], [7]], cap_numel=30, multiple=8)
    assert [(b.group, [(s.param, s.offset, s.numel) for s in b.slots], b.numel) for b in out] == [
        (0, [(0, 0, 10), (1, 10, 20)], 32),
        (0, [(2, 0, 5)], 8),
        (1, [(3, 0, 7)], 8),
    ]


def test_layout_one_bucket_per_param_and_oversized_params():
    assert [b.numel for b in layout([[3, 100]], None, 4)] == [4, 100]
    assert [len(b.slots) for b in layout([[50, 1, 1]], 10, 2)] == [1, 2]
    with pytest.raises(ValueError, match="positive"):
        layout([[1]], 0, 2)


# -- on ranks -------------------------------------------------------------------------------------
def _train(module, opt, rank, steps, start=0, sched=None, clip=None):
    return B.train_steps(module, opt, SIZE, 0, rank, start, steps, MICRO_BATCH, sched, clip)


def _run(config, optimizer, rank, steps):
    hp, clip = (HP_W, CLIP) if optimizer == "adamw" else (HP, None)
    module, opt = B.CONFIGS[config](B.Encoder(SIZE, seed=1), optimizer, hp)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    return _train(module, opt, rank, steps, sched=sched, clip=clip), B.state_bytes(opt)


def _clip_norms(rank):
    """The norm each way of clipping sees on one step's gradients: DDP's averaged gradient
    (torch's clip_grad_norm_ after DDP), FusedAdamW.clip_grad_norm, and torch's on the fused
    optimizer's local gradients (the mistake its docstring warns of)."""
    x, y = B.batch(SIZE, 0, 3, rank, MICRO_BATCH)
    ddp, _ = B.CONFIGS["ddp"](B.Encoder(SIZE, seed=1), "adamw", HP_W)
    B.loss_of(ddp, x, y).backward()
    model, opt = B.CONFIGS["fused"](B.Encoder(SIZE, seed=1), "adamw", HP_W)
    B.loss_of(model, x, y).backward()
    local = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    return {
        "ddp": float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), CLIP)),
        "fused": float(opt.clip_grad_norm(CLIP)),
        "local": float(local),
    }


def nesterov_program(dtype=dsl.f32):
    """A user's own optimizer: SGD with Nesterov momentum (torch.optim.SGD(nesterov=True))."""
    b = dsl.Builder("nesterov")
    n = dsl.sym("N")
    g = b.input("g", dsl.f32, [n], dsl.Local())
    w, buf = (b.input(x, dsl.f32, [n], dsl.Replicated()) for x in ("w", "buf"))
    lr, mu = b.param("lr", 0.01), b.param("momentum", 0.9)
    g_avg = b.all_reduce(g) * (1 / dsl.P)
    buf_new = mu * buf + g_avg
    b.update(buf, buf_new)
    b.update(w, w - lr * (g_avg + mu * buf_new))
    return b.build(schedule="AR-C")


def _nesterov(rank, steps=20):
    """The user's program in FusedOptimizer against DDP + torch.optim.SGD(nesterov=True)."""
    hp = {"lr": 0.05, "momentum": 0.9}
    losses = {}
    for config in ("ddp", "fused"):
        model = B.Encoder(SIZE, seed=1)
        groups = B.param_groups(model, {**HP, "lr": hp["lr"]})
        if config == "ddp":
            module = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(groups, nesterov=True, **hp)
        else:
            module = model
            opt = FusedOptimizer(
                groups, hp, nesterov_program(), state_names={"buf": "momentum_buffer"}
            )
        losses[config] = _train(module, opt, rank, steps)
    return losses


def _bad_inputs(rank):
    """What the optimizers refuse, before any collective: one line each."""
    model = B.Encoder(SIZE, seed=1)
    said = {}
    try:
        FusedOptimizer(model.parameters(), {"lr": 0.1}, nesterov_program(), state_names={"m": "x"})
    except ValueError as e:
        said["state_names"] = str(e)
    _, opt = B.CONFIGS["fused"](model, "adamw", HP_W)
    for bad in (-1.0, 0, float("nan"), float("inf"), True, "1"):
        try:
            opt.clip_grad_norm(bad)
        except ValueError as e:
            said[repr(bad)] = str(e)
    return said


def _adamw_checkpoint(rank):
    """FusedAdamW's gathered state_dict loads into torch.optim.AdamW, which goes on as it does."""
    model, opt = B.CONFIGS["fused"](B.Encoder(SIZE, seed=1), "adamw", HP_W)
    _train(model, opt, rank, 5, clip=CLIP)
    saved, weights = opt.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}
    ref = _train(model, opt, rank, 5, start=5, clip=CLIP)
    torch_model = B.Encoder(SIZE, seed=2)
    torch_model.load_state_dict(weights)
    module, adamw = B.CONFIGS["ddp"](torch_model, "adamw", {**HP_W, "lr": 0.5})
    adamw.load_state_dict(saved)
    return ref, _train(module, adamw, rank, 5, start=5, clip=CLIP)


def _compile_check(rank, world):
    n = 48
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(world)]
    w, m = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    v = rng.random(n, dtype=np.float32)
    ref = dsl.interpret(
        adam_program(),
        [{"g": g, "w": w, "m": m, "v": v, "step": np.float32(2)} for g in grads],
        world,
        {"N": n},
    )[0]
    step = compile(adam_program(), sliced_schedule, {"N": n})
    k = n // world
    mine = slice(rank * k, (rank + 1) * k)
    t = {
        "g": torch.from_numpy(grads[rank].copy()),
        "w": torch.from_numpy(w.copy()),
        "m": torch.from_numpy(m[mine].copy()),
        "v": torch.from_numpy(v[mine].copy()),
    }
    out = step(**t, step=2.0)
    agree = all(
        np.allclose(out[x].numpy(), ref[x][mine] if x in "mv" else ref[x], rtol=1e-6, atol=1e-7)
        for x in ("w", "m", "v")
    )
    try:
        step(w=torch.zeros(n - 1))
        bad = ""
    except ValueError as e:
        bad = str(e)
    return {"agree": agree, "in_place": out["w"] is t["w"], "bad": bad}


def _round_trip(rank):
    model = B.Encoder(SIZE, seed=1)
    opt = FusedAdam(B.param_groups(model, HP), lr=HP["lr"])
    _train(model, opt, rank, 5)
    gathered, sharded = opt.state_dict(), opt.sharded_state_dict()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _train(model, opt, rank, 5, start=5)
    resumed = {}
    for kind, sd in (("gathered", gathered), ("sharded", sharded)):
        fresh = B.Encoder(SIZE, seed=2)
        fresh.load_state_dict(weights)
        again = FusedAdam(B.param_groups(fresh, HP), lr=0.5)  # lr comes from the state_dict
        again.load_state_dict(sd)
        resumed[kind] = _train(fresh, again, rank, 5, start=5)
    torch_model = B.Encoder(SIZE, seed=2)
    torch_model.load_state_dict(weights)
    module, adam = B.CONFIGS["ddp"](torch_model, "adam", HP)
    adam.load_state_dict(gathered)
    resumed["torch.optim.Adam"] = _train(module, adam, rank, 5, start=5)
    return ref, resumed


def _after(rank, how):
    """Weights after 2 steps and then one more step prepared `how`."""
    model = B.Encoder(SIZE, seed=1)
    opt = FusedAdam(model.parameters(), lr=HP["lr"])
    _train(model, opt, rank, 2)
    opt.zero_grad()
    params = list(model.parameters())
    views = all(p.grad is not None and not p.grad.any() for p in params)
    if how in ("views", "replaced"):
        B.loss_of(model, *B.batch(SIZE, 0, 7, rank, MICRO_BATCH)).backward()
        bucket = opt._buckets[0].g
        views &= all(p.grad.data_ptr() >= bucket.data_ptr() for p in params) and bool(bucket.any())
    if how == "replaced":
        for p in params:
            p.grad = p.grad.clone()
    if how == "none":
        for p in params:
            p.grad = None
    opt.step()
    return views, torch.cat([p.detach().reshape(-1) for p in params])


def _zero_grad_check(rank):
    got = {how: _after(rank, how) for how in ("views", "replaced", "none", "zero")}
    return (
        got["views"][0] and got["zero"][0],
        torch.equal(got["views"][1], got["replaced"][1]),
        torch.equal(got["none"][1], got["zero"][1]),
    )


def _rank(rank, world):
    out = {"compile": _compile_check(rank, world)}
    for optimizer, steps in (("adam", 50), ("lamb", 20), ("adamw", 30)):
        out[optimizer] = {c: _run(c, optimizer, rank, steps) for c in ("ddp", "fused")}
    out["round_trip"] = _round_trip(rank)
    out["clip"] = _clip_norms(rank)
    out["adamw_checkpoint"] = _adamw_checkpoint(rank)
    out["nesterov"] = _nesterov(rank)
    out["bad"] = _bad_inputs(rank)
    out["zero_grad"] = _zero_grad_check(rank)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch(_rank, 2, timeout_s=600)


@pytest.mark.slow
def test_compile_runs_the_generated_step_on_the_callers_tensors(ranks):
    for r in ranks:
        assert r["compile"]["agree"] and r["compile"]["in_place"]
        assert (
            "input 'w' must be a contiguous torch.float32 tensor of shape [48]"
            in r["compile"]["bad"]
        )


@pytest.mark.parametrize("optimizer", ["adam", "lamb", "adamw"])
def test_fused_losses_agree_with_ddp(ranks, optimizer):
    """adamw: weight decay but on biases and norms, amsgrad, gradients clipped at every step."""
    for r in ranks:
        (ddp, _), (fused, _) = r[optimizer]["ddp"], r[optimizer]["fused"]
        assert len(fused) >= 20 and np.mean(fused[-5:]) < np.mean(fused[:5]) - 0.1  # it trains
        rel = np.abs(np.array(fused) - np.array(ddp)) / np.abs(np.array(ddp))
        assert rel.max() <= 1e-5, rel.max()


@pytest.mark.parametrize("optimizer", ["adam", "lamb"])
def test_fused_state_is_one_over_p_of_torch(ranks, optimizer):
    (_, ddp_bytes), (_, fused_bytes) = ranks[0][optimizer]["ddp"], ranks[0][optimizer]["fused"]
    # 1/P of torch's, plus the zero padding that makes each bucket divide into P x 4 chunks: under
    # 8 elements of m and v (4 bytes each) per bucket, one bucket per parameter at most
    buckets = len(list(B.Encoder(SIZE, seed=1).parameters()))
    assert ddp_bytes / 2 <= fused_bytes < ddp_bytes / 2 + buckets * 8 * 2 * 4 / 2


def test_state_dict_round_trips_resume_identically(ranks):
    for r in ranks:
        ref, resumed = r["round_trip"]
        assert resumed["gathered"] == ref and resumed["sharded"] == ref
        assert np.allclose(resumed["torch.optim.Adam"], ref, rtol=1e-5, atol=0)


def test_grads_are_bucket_views_and_zero_grad_zeroes_them(ranks):
    """zero_grad leaves zeroed views that backward accumulates into; a replaced .grad is copied
    in (the same step); a parameter without .grad counts as a zero gradient."""
    for r in ranks:
        assert r["zero_grad"] == (True, True, True)


def test_clip_grad_norm_sees_the_averaged_gradient_as_ddp_does(ranks):
    for r in ranks:
        norms = r["clip"]
        assert norms["fused"] == pytest.approx(norms["ddp"], rel=1e-5)
        assert norms["ddp"] > CLIP  # it clipped
        assert abs(norms["local"] - norms["ddp"]) > 0.01 * norms["ddp"]  # the local one is not it


def test_a_fused_adamw_checkpoint_resumes_in_torch_adamw(ranks):
    for r in ranks:
        ref, resumed = r["adamw_checkpoint"]
        assert np.allclose(resumed, ref, rtol=1e-5, atol=0), (resumed, ref)


def test_a_users_own_optimizer_program_plugs_into_the_wrapper(ranks):
    """Nesterov SGD, written as a program in a dozen lines, trains as torch's SGD under DDP."""
    for r in ranks:
        ddp, fused = (np.array(r["nesterov"][c]) for c in ("ddp", "fused"))
        assert fused[-3:].mean() < fused[:3].mean()  # it trains
        assert np.abs(fused - ddp).max() <= 1e-5 * np.abs(ddp).max()


def test_bad_optimizer_inputs_are_one_line_value_errors(ranks):
    for r in ranks:
        said = r["bad"]
        assert (
            "state_names names ['m'], not state of nesterov (its state: ['buf'])"
            in said["state_names"]
        )
        for bad in ("-1.0", "0", "nan", "inf", "True", "'1'"):
            assert "max_norm must be a positive finite number" in said[bad], bad
        assert all("\n" not in m for m in said.values())
