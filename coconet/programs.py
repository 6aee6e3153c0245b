"""The data-parallel optimizer programs (Adam, LAMB) and the schedules the paper derives from them.

Both follow the real update rules of `torch.optim.Adam` (bias correction, sqrt, epsilon) and of
LAMB (You et al. 2020; Apex FusedLAMB without gradient clipping): the gradient is all-reduced and
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


def _moments(b: Builder, grad=f32):
    """Inputs, averaged gradient, new moments and bias corrections shared by Adam and LAMB
    (`grad`: the gradient's dtype, all-reduced in it and averaged in f32)."""
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


def adam_program(dtype=f32, mixed: bool = False) -> Program:
    """Adam in f32; `mixed`: as the authors' fused binary runs it (an f16 gradient all-reduced
    in f16, f32 w, m, v, and an f16 copy h of the new weights)."""
    _f32_only(dtype)
    b = Builder("adam_mixed" if mixed else "adam")
    w, m, v, m_new, v_new, bc1, bc2, hp = _moments(b, f16 if mixed else f32)
    denom = b.sqrt(v_new) / b.sqrt(bc2) + hp["eps"]
    w_new = w - (hp["lr"] / bc1) * (m_new / denom)
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


def sliced_schedule(p: Program) -> Program:
    """fuse(RS-C-AG)+as_slice: reduce-scatter, the update on this rank's slice with m and v kept
    as slices, all-gather of w, one fused collective."""
    return fuse(as_slice(as_slice(reorder(split(p)), "m"), "v"))
