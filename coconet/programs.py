"""The data-parallel optimizer programs (Adam, LAMB) and the schedules the paper derives from them.

Both follow the real update rules of `torch.optim.Adam` (bias correction, sqrt, epsilon; its L2
weight decay, AdamW's decoupled one and amsgrad as options) and of LAMB (You et al. 2020; Apex
FusedLAMB without gradient clipping): the gradient is all-reduced and
averaged over the P ranks first, as DDP does. Inputs: g (this rank's gradient, N elements), w,
m, v (N; `Replicated`), and the 0-d hyper-parameters lr, beta1, beta2, eps, step (and LAMB's
weight_decay); outputs: w, m, v updated in place.

Schedules (Fig. 10): `AR-C` (the program), `RS-C-AG` (split + reorder), `fuse(RS-C-AG)`, and
`fuse(RS-C-AG)+as_slice` (optimizer state m and v kept only as slices, ZeRO-style: `SLICED`, the
schedule `coconet.FusedAdam` and `coconet.FusedLAMB` run). The experiments (adam_fusion,
lamb_fusion, training) take them from here.
"""

from __future__ import annotations

import dataclasses

from dsl import Builder, Local, P, Program, Replicated, f16, f32, sym
from dsl.transforms import as_slice, fuse, reorder, split

N = sym("N")


def _moments(b: Builder, grad=f32, l2: bool = False):
    """Inputs, averaged gradient, new moments and bias corrections shared by Adam and LAMB
    (`grad`: the gradient's dtype, all-reduced in it and averaged in f32; `l2`: the averaged
    gradient plus weight_decay * w, torch.optim.Adam's weight decay)."""
    g = b.input("g", grad, [N], Local())
    w = b.input("w", f32, [N], Replicated())
    m = b.input("m", f32, [N], Replicated())
    v = b.input("v", f32, [N], Replicated(), init="positive")
    hp = {
        k: b.param(k, d)
        for k, d in (("lr", 1e-3), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("step", 3.0))
    }
    summed = b.all_reduce(g, name="g.sum")
    g_avg = (summed if grad == f32 else b.cast(summed, f32)) * (1 / P)
    if l2:
        hp["weight_decay"] = b.param("weight_decay", 0.01)
        g_avg = g_avg + hp["weight_decay"] * w
    b1, b2 = hp["beta1"], hp["beta2"]
    m_new = b.op("add", b1 * m, (1 - b1) * g_avg, name="m.next")
    v_new = b.op("add", b2 * v, (1 - b2) * g_avg * g_avg, name="v.next")
    bc1 = 1 - b1 ** hp["step"]
    bc2 = 1 - b2 ** hp["step"]
    return w, m, v, m_new, v_new, bc1, bc2, hp


def _f32_only(dtype) -> None:
    if dtype != f32:
        raise ValueError(f"the optimizer programs are built in f32 only, not {dtype}")


def _half_weights(b: Builder, w_new) -> None:
    """The f16 weight copy `h` the mixed-precision step writes (and all-gathers) beside w."""
    h = b.input("h", f16, [N], Replicated())
    b.update(h, b.cast(w_new, f16))


DECAY = ("", "l2", "decoupled")  # adam_program's weight_decay: none, Adam's, AdamW's


def adam_program(
    dtype=f32, mixed: bool = False, weight_decay: str = "", amsgrad: bool = False
) -> Program:
    """Adam in f32; `mixed`: as the authors' fused binary runs it (an f16 gradient all-reduced
    in f16, f32 w, m, v, and an f16 copy h of the new weights). `weight_decay` (a 0-d input
    of that name): "l2", torch.optim.Adam's (weight_decay * w added to the averaged gradient);
    "decoupled", torch.optim.AdamW's (w scaled by 1 - lr * weight_decay before the step).
    `amsgrad`: the denominator from the running maximum of v, the input `vmax` (torch's
    max_exp_avg_sq)."""
    _f32_only(dtype)
    if weight_decay not in DECAY:
        raise ValueError(f"adam_program: weight_decay must be one of {DECAY}, not {weight_decay!r}")
    name = "adamw" if weight_decay == "decoupled" else "adam_l2" if weight_decay else "adam"
    b = Builder(name + "_amsgrad" * amsgrad + "_mixed" * mixed)
    w, m, v, m_new, v_new, bc1, bc2, hp = _moments(b, f16 if mixed else f32, weight_decay == "l2")
    second = v_new
    if amsgrad:
        vmax = b.input("vmax", f32, [N], Replicated(), init="positive")
        second = b.maximum(vmax, v_new, name="vmax.next")
        b.update(vmax, second)
    denom = b.sqrt(second) / b.sqrt(bc2) + hp["eps"]
    decayed = (
        w * (1 - hp["lr"] * b.param("weight_decay", 0.01)) if weight_decay == "decoupled" else w
    )
    w_new = decayed - (hp["lr"] / bc1) * (m_new / denom)
    b.update(m, m_new)
    b.update(v, v_new)
    b.update(w, w_new)
    if mixed:
        _half_weights(b, w_new)
    return b.build(schedule="AR-C")


def lamb_program(dtype=f32, mixed: bool = False) -> Program:
    """LAMB in f32; `mixed` as `adam_program`'s."""
    _f32_only(dtype)
    b = Builder("lamb_mixed" if mixed else "lamb")
    w, m, v, m_new, v_new, bc1, bc2, hp = _moments(b, f16 if mixed else f32)
    wd = b.param("weight_decay", 0.01)
    u = (m_new / bc1) / (b.sqrt(v_new / bc2) + hp["eps"]) + wd * w
    r_w = b.norm(w, name="norm.w")
    r_u = b.norm(u, name="norm.u")
    trust = b.where(r_w > 0, b.where(r_u > 0, r_w / r_u, 1.0), 1.0, name="trust")
    w_new = w - hp["lr"] * trust * u
    b.update(m, m_new)
    b.update(v, v_new)
    b.update(w, w_new)
    if mixed:
        _half_weights(b, w_new)
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


def sliced_schedule(p: Program) -> Program:
    """fuse(RS-C-AG)+as_slice: reduce-scatter, the update on this rank's slice with the state
    (`state_of`: m and v) kept as slices, all-gather of w, one fused collective."""
    q = reorder(split(p))
    for name in state_of(p):
        q = as_slice(q, name)
    return fuse(q)
