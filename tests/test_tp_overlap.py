"""Tensor parallelism's decomposed overlaps, `ol(AG,MM)` and `ol(MM,RS)`:

- the transform: `overlap` of an all-gather into the matmul that reads it, and its preconditions
  (a decomposition that would change the result, or whose pieces are not rows, is refused);
- the runtime: both, alone, on gloo ranks (the ring communicator on 2 and 4 ranks, whose chunked
  all-gather forwards chunk by chunk, and the library and shared-memory communicators on 2),
  equal `dsl.interpret` within twice `dsl.error_bounds`;
- the cost model: the closed form and the DES agree on them, and hide the collective behind the
  matmul (no slower than the larger of the two, faster than both one after the other) where the
  matmul is not slowed by communication (compute_slowdown 0).
"""

import dataclasses

import numpy as np
import pytest
from plan_ranks import run_plans

import dsl
from codegen.lower import lower
from codegen.runtime.launch import launch
from cost_model.closed_form import plan_us, step_us
from cost_model.topology import load_topology
from cost_model.workload import simulate
from dsl import Builder, P, Sliced, f32, sym
from dsl.errors import ShapeError, TransformError
from dsl.transforms import overlap
from dsl.transforms.overlap import check_chunks

S, B, H, F = sym("S"), sym("B"), sym("H"), sym("F")


def ag_mm(dim: int = 0, rhs: bool = False) -> dsl.Program:
    """all_gather(x) @ w (or w' @ all_gather(x) with rhs), x sliced along `dim`."""
    b = Builder("ag_mm")
    if rhs:
        x = b.input("x", f32, [H / P, F], Sliced(0))
        a = b.input("a", f32, [S, B, H], dsl.Replicated())
        b.output("y", b.matmul(a, b.all_gather(x, name="xg"), name="y"))
        return b.build()
    shape = [S, B, H]
    shape[dim] = shape[dim] / P
    x = b.input("x", f32, shape, Sliced(dim))
    w = b.input("w", f32, [H, F / P], Sliced(1))
    b.output("y", b.matmul(b.all_gather(x, name="xg"), w, name="y"))
    return b.build()


def mm_rs() -> dsl.Program:
    b = Builder("mm_rs")
    h = b.input("h", f32, [S, B, F / P], Sliced(2))
    w = b.input("w2", f32, [F / P, H], Sliced(0))
    y = b.matmul(h, w, name="y")
    b.output("z", b.reduce_scatter(y, dim=0, name="z"))
    return b.build()


def test_overlap_of_an_all_gather_into_its_matmul_is_named_and_checked():
    q = overlap(ag_mm(), "xg", chunks=2)
    assert q.schedule == "ol(AG,MM)"
    assert overlap(mm_rs(), "y", chunks=2).schedule == "ol(MM,RS)"
    check_chunks(q, {"S": 8, "B": 1, "H": 4, "F": 4, "P": 2})  # 4 rows a block: 2 chunks divide
    with pytest.raises(ShapeError, match="3 chunks do not divide the 4 rows"):
        check_chunks(overlap(ag_mm(), "xg", chunks=3), {"S": 8, "B": 1, "H": 4, "F": 4, "P": 2})


@pytest.mark.parametrize(
    "prog, why",
    [
        (lambda: ag_mm(dim=2), "contracted dimension.*changes the result"),
        (lambda: ag_mm(dim=1), "not contiguous rows"),
        (lambda: ag_mm(rhs=True), "only the matmul's left operand"),
    ],
)
def test_a_decomposition_that_would_change_the_result_or_is_not_rows_is_refused(prog, why):
    with pytest.raises(TransformError, match=why):
        overlap(prog(), "xg", chunks=2)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("comm, world", [("ring", 2), ("ring", 4), ("library", 2), ("shm", 2)])
def test_the_decomposed_overlaps_match_the_interpreter(comm, world):
    sizes = {"S": 8 * world, "B": 2, "H": 8, "F": 4 * world}
    progs = [ag_mm(), overlap(ag_mm(), "xg", chunks=2), mm_rs(), overlap(mm_rs(), "y", chunks=4)]
    plans = [lower(p, sizes, world) for p in progs]
    assert [type(p.steps[0]).__name__ for p in plans[1::2]] == ["Overlap", "Overlap"]
    inputs = [dsl.random_inputs(p, world, sizes, np.random.default_rng(3)) for p in progs]
    got = launch(run_plans, world, args=(comm, plans, inputs), timeout_s=240)
    for k, p in enumerate(progs):
        expect = dsl.interpret(p, inputs[k], world, sizes)
        bounds = dsl.error_bounds(p, inputs[k], world, sizes)
        for rank in range(world):
            assert dsl.runs_agree(got[rank][k], expect[rank], bounds[rank]), (p.schedule, rank)


@pytest.mark.parametrize("make, ref", [(ag_mm, "xg"), (mm_rs, "y")])
def test_the_model_hides_the_collective_behind_the_matmul(make, ref):
    topo = dataclasses.replace(load_topology("dgx_h100"), compute_slowdown=0.0)
    sizes = {"S": 2048, "B": 1, "H": 12288, "F": 49152}
    seq = lower(make(), sizes, 8)
    ol = lower(overlap(make(), ref, chunks=2), sizes, 8)
    mm, coll = (step_us(seq, s, topo) for s in seq.steps)  # each alone, whole
    t_seq, t_ol = simulate(seq, topo).time_us, simulate(ol, topo).time_us
    assert plan_us(ol, topo) == pytest.approx(t_ol, rel=0.02)
    assert max(mm, coll) <= t_ol < t_seq
