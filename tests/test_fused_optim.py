"""coconet: the compile API and the fused optimizers, on 2 gloo ranks against torch.

One launch of 2 ranks runs every distributed check (`_rank`) and returns what the tests assert:
- compile: the generated fuse(RS-C-AG)+as_slice Adam step on the caller's tensors equals
  `dsl.interpret` of the program, writes the caller's w in place, and names a bad input;
- FusedAdam / FusedLAMB against DDP + torch.optim.Adam(fused=True) / DDP + a torch LAMB, from the
  same initialisation and data, with two param groups and a LambdaLR warm-up: losses after 50
  (Adam) and 20 (LAMB) steps within 1e-5 relative; optimizer state per rank 1/P of torch's;
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
from coconet import FusedAdam, compile
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
def _train(module, opt, rank, steps, start=0, sched=None):
    return B.train_steps(module, opt, SIZE, 0, rank, start, steps, MICRO_BATCH, sched)


def _run(config, optimizer, rank, steps):
    module, opt = B.CONFIGS[config](B.Encoder(SIZE, seed=1), optimizer, HP)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    return _train(module, opt, rank, steps, sched=sched), B.state_bytes(opt)


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
    for optimizer, steps in (("adam", 50), ("lamb", 20)):
        out[optimizer] = {c: _run(c, optimizer, rank, steps) for c in ("ddp", "fused")}
    out["round_trip"] = _round_trip(rank)
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


@pytest.mark.parametrize("optimizer", ["adam", "lamb"])
def test_fused_losses_agree_with_ddp(ranks, optimizer):
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
