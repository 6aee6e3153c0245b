"""The data-parallel optimizer programs (Adam, LAMB) and the schedules the paper derives from them.

Both follow the real update rules of `torch.optim.Adam` (bias correction, sqrt, epsilon; its L2
weight decay, AdamW's decoupled one and amsgrad as options) and of LAMB (You et al. 2020; Apex
FusedLAMB without gradient clipping): the gradient is all-reduced and
averaged over the P ranks first, as DDP does. Inputs: g (this rank's gradient, N elements), w,
m, v (N; `Replicated`), and the 0-d hyper-parameters lr, beta1, beta2, eps, step (and LAMB's
weight_decay); outputs: w, m, v updated in place. Mixed precision (`half=bf16` or f16; the
paper's `mixed=True` is f16): the gradient g and an input h (the model's weights) in `half`,
w, m, v in f32, h = cast(w) written beside w; `loss_scale`: the gradient unscaled by the 0-d
`inv_scale` and the update skipped on overflow (`_overflow`; the output `overflow`).

Schedules (Fig. 10): `AR-C` (the program), `RS-C-AG` (split + reorder), `fuse(RS-C-AG)`, and
`fuse(RS-C-AG)+as_slice` (optimizer state m and v kept only as slices, ZeRO-style: `SLICED`, the
schedule `coconet.FusedAdam` and `coconet.FusedLAMB` run). The experiments (adam_fusion,
lamb_fusion, training) take them from here.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from dsl import Builder, DType, Local, P, Program, Replicated, bf16, f16, f32, i32, sym
from dsl.transforms import as_slice, fuse, reorder, split

N = sym("N")


def _moments(b: Builder, grad=f32, l2: bool = False, scaled: bool = False):
    """Inputs, averaged gradient, new moments and bias corrections shared by Adam and LAMB
    (`grad`: the gradient's dtype, all-reduced in it and averaged in f32; `l2`: the averaged
    gradient plus weight_decay * w, torch.optim.Adam's weight decay; `scaled`: the gradient is
    of a loss scaled by S/P, unscaled by the 0-d input `inv_scale` = 1/S, see `_overflow`)."""
    g = b.input("g", grad, [N], Local())
    w = b.input("w", f32, [N], Replicated())
    m = b.input("m", f32, [N], Replicated())
    v = b.input("v", f32, [N], Replicated(), init="positive")
    hp = {
        k: b.param(k, d)
        for k, d in (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("step", 3.0))
    }
    summed = b.all_reduce(g, name="g.sum")
    upcast = summed if grad == f32 else b.cast(summed, f32)
    g_avg = upcast * b.param("inv_scale", 1.0) if scaled else upcast * (1 / P)
    if l2:
        hp["weight_decay"] = b.param("weight_decay", 0.01)
        g_avg = g_avg + hp["weight_decay"] * w
    b1, b2 = hp["beta1"], hp["beta2"]
    m_new = b.op("add", b1 * m, (1 - b1) * g_avg, name="m.next")
    v_new = b.op("add", b2 * v, (1 - b2) * g_avg * g_avg, name="v.next")
    bc1 = 1 - b1 ** hp["step"]
    bc2 = 1 - b2 ** hp["step"]
    return w, m, v, m_new, v_new, bc1, bc2, hp, g_avg


def _f32_only(dtype) -> None:
    if dtype != f32:
        raise ValueError(f"the optimizer programs are built in f32 only, not {dtype}")


def _half_weights(b: Builder, w_new, half: DType = f16) -> None:
    """The low-precision weight copy `h` the mixed-precision step writes (and all-gathers)
    beside w: the model's parameters, in `half`."""
    h = b.input("h", half, [N], Replicated())
    b.update(h, b.cast(w_new, half))


def _overflow(b: Builder, g_avg):
    """Dynamic loss scaling's skip condition (a bool 0-d value, the same on every rank): the
    0-d input `found_inf` (this rank's flag, 1.0 where its local gradient overflowed) max-reduced
    over the ranks, or a value of the averaged gradient that is not finite (its sum times 0 is
    then NaN; in the sliced schedules a partial sum per slice, all-reduced)."""
    found = b.all_reduce(b.input("found_inf", f32, [], Local()), op="max", name="found.any")
    bad = found + b.sum(g_avg * 0.0, name="g.nonfinite")
    b.output("overflow", bad)  # 0.0 where the step is taken
    return b.ne(bad, 0.0, name="skip")


def _guarded(b: Builder, skip, updates, half: Optional[DType]) -> None:
    """`update(old, new)` for each pair of (state or w, its new value), or `update(old, old)`
    where `skip` (a select, so no NaN leaks); with `half`, the copy h of the last (w) too."""
    for old, new in updates:
        kept = new if skip is None else b.where(skip, old, new, name=f"{old.value.name}.kept")
        b.update(old, kept)
    if half is not None:
        _half_weights(b, kept, half)


DECAY = ("", "l2", "decoupled")  # adam_program's weight_decay: none, Adam's, AdamW's


HALF = (f16, bf16)  # the parameter dtypes of the mixed-precision programs


def _half_of(mixed: bool, half: Optional[DType], loss_scale: bool, who: str) -> Optional[DType]:
    """The programs' low-precision dtype: `half`, or f16 for the paper's `mixed=True`."""
    half = f16 if mixed and half is None else half
    if half is not None and half not in HALF:
        raise ValueError(f"{who}: half must be one of f16, bf16, not {half}")
    if loss_scale and half is None:
        raise ValueError(f"{who}: loss_scale needs a low-precision gradient (half=f16)")
    return half


def _suffix(half: Optional[DType], loss_scale: bool) -> str:
    return {None: "", f16: "_mixed", bf16: "_bf16"}[half] + "_scaled" * loss_scale


def adam_program(
    dtype=f32,
    mixed: bool = False,
    weight_decay: str = "",
    amsgrad: bool = False,
    *,
    half: Optional[DType] = None,
    loss_scale: bool = False,
) -> Program:
    """Adam in f32; `mixed`: as the authors' fused binary runs it (an f16 gradient all-reduced
    in f16, f32 w, m, v, and an f16 copy h of the new weights); `half=bf16` the same in bf16
    (`mixed` is `half=f16`). `loss_scale` (with a half gradient): dynamic loss scaling, the
    gradient unscaled by the 0-d `inv_scale` and the update skipped where `_overflow` says so
    (w, m, v, h left as they were). `weight_decay` (a 0-d input of that name): "l2",
    torch.optim.Adam's (weight_decay * w added to the averaged gradient); "decoupled",
    torch.optim.AdamW's (w scaled by 1 - lr * weight_decay before the step). `amsgrad`: the
    denominator from the running maximum of v, the input `vmax` (torch's max_exp_avg_sq)."""
    _f32_only(dtype)
    if weight_decay not in DECAY:
        raise ValueError(f"adam_program: weight_decay must be one of {DECAY}, not {weight_decay!r}")
    half = _half_of(mixed, half, loss_scale, "adam_program")
    name = "adamw" if weight_decay == "decoupled" else "adam_l2" if weight_decay else "adam"
    b = Builder(name + "_amsgrad" * amsgrad + _suffix(half, loss_scale))
    w, m, v, m_new, v_new, bc1, bc2, hp, g_avg = _moments(
        b, half or f32, weight_decay == "l2", loss_scale
    )
    skip = _overflow(b, g_avg) if loss_scale else None
    second = v_new
    updates = []
    if amsgrad:
        vmax = b.input("vmax", f32, [N], Replicated(), init="positive")
        second = b.maximum(vmax, v_new, name="vmax.next")
        updates.append((vmax, second))
    denom = b.sqrt(second) / b.sqrt(bc2) + hp["eps"]
    decayed = (
        w * (1 - hp["lr"] * b.param("weight_decay", 0.01)) if weight_decay == "decoupled" else w
    )
    w_new = decayed - (hp["lr"] / bc1) * (m_new / denom)
    _guarded(b, skip, [*updates, (m, m_new), (v, v_new), (w, w_new)], half)
    return b.build(schedule="AR-C")


def lamb_program(
    dtype=f32,
    mixed: bool = False,
    *,
    half: Optional[DType] = None,
    loss_scale: bool = False,
    segments: int = 0,
) -> Program:
    """LAMB in f32; `mixed`, `half` and `loss_scale` as `adam_program`'s. `segments` > 0: the
    N elements hold that many tensors, element j of tensor `seg[j]` (an i32 input; ids outside
    [0, segments), the padding, belong to none and are left as they are), each with its own
    trust ratio (per-segment norms: `segment_sum`, one small all_reduce for each norm when
    sliced); 0: one trust ratio for all N."""
    _f32_only(dtype)
    half = _half_of(mixed, half, loss_scale, "lamb_program")
    name = "lamb" + _suffix(half, loss_scale) + (f"_seg{segments}" if segments else "")
    b = Builder(name)
    w, m, v, m_new, v_new, bc1, bc2, hp, g_avg = _moments(b, half or f32, scaled=loss_scale)
    skip = _overflow(b, g_avg) if loss_scale else None
    wd = b.param("weight_decay", 0.01)
    u = (m_new / bc1) / (b.sqrt(v_new / bc2) + hp["eps"]) + wd * w
    if segments:
        seg = b.input("seg", i32, [N], Replicated())
        r_w = b.sqrt(b.segment_sum(w * w, seg, segments, name="sq.w"), name="norm.w")
        r_u = b.sqrt(b.segment_sum(u * u, seg, segments, name="sq.u"), name="norm.u")
    else:
        r_w, r_u = b.norm(w, name="norm.w"), b.norm(u, name="norm.u")
    trust = b.where(r_w > 0, b.where(r_u > 0, r_w / r_u, 1.0), 1.0, name="trust")
    w_new = w - hp["lr"] * (b.take(trust, seg, name="trust.of") if segments else trust) * u
    _guarded(b, skip, [(m, m_new), (v, v_new), (w, w_new)], half)
    return b.build(schedule="AR-C")


def optimizer_schedules(p: Program) -> dict[str, Program]:
    """AR-C, RS-C-AG, fuse(RS-C-AG), each split schedule also with m and v kept as slices.

    The paper's own RS-C-AG and fuse(RS-C-AG) for Adam keep the optimizer state as slices (the
    authors' examples/adam/adam.cpp applies asSlice({m, v})): those are the `+as_slice` ones here.
    Without it, the step must all-gather m and v too, three times the all-gather traffic."""
    rs_c_ag = reorder(split(p))
    sliced = as_slice(as_slice(rs_c_ag, "m"), "v")
    return {q.schedule: q for q in (p, rs_c_ag, sliced, fuse(rs_c_ag), fuse(sliced))}


SLICED = "fuse(RS-C-AG)+as_slice"
PUBLISHED = "fuse(RS-C-AG)+as_slice+f16"  # the fused step in the precision the paper ran it


def published_schedule(mixed: Program) -> dict[str, Program]:
    """{PUBLISHED: the fused step of a `mixed=True` program}: f32 w, m, v kept as slices, the f16
    gradient reduce-scattered and the f16 weight copy all-gathered in one fused collective (the
    authors' `AllReduce_pipe(..., (half*)g, w, (half*)w, m, v, N, ncclHalf, ...)`, parasailteam/
    coconet src/codegen.cpp at 52175e2), as the paper compared it with f32 AR-C, RS-C-AG and
    baseline."""
    sliced = as_slice(as_slice(as_slice(reorder(split(mixed)), "m"), "v"), "w")
    return {PUBLISHED: dataclasses.replace(fuse(sliced), schedule=PUBLISHED)}


def state_of(p: Program) -> tuple[str, ...]:
    """The optimizer state of an optimizer program: the inputs it updates but the weights `w`
    (and the f16 copy `h`), in input order (Adam: m, v; with amsgrad vmax too)."""
    updated = {name for name, _ in p.outputs}
    return tuple(
        i.value.name for i in p.inputs if i.value.name in updated and i.value.name not in ("w", "h")
    )


def sliced_inputs(p: Program) -> tuple[str, ...]:
    """The inputs `sliced_schedule` keeps as slices: the state (`state_of`), and in a
    mixed-precision program (one with the low-precision copy `h`) the f32 master weights w."""
    mixed = any(i.value.name == "h" for i in p.inputs)
    return state_of(p) + ("w",) * mixed


def sliced_schedule(p: Program) -> Program:
    """fuse(RS-C-AG)+as_slice: reduce-scatter, the update on this rank's slice with the state
    (`sliced_inputs`: m and v; the f32 w of a mixed program too) kept as slices, all-gather of
    w (of a mixed program: of h, the new weights in low precision), one fused collective."""
    q = reorder(split(p))
    for name in sliced_inputs(p):
        q = as_slice(q, name)
    return fuse(q)
