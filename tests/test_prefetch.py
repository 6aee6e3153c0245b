"""`prefetch`: FSDP's layer-ahead all-gather, started before an earlier statement and run with it.

- the transform: the schedule's name, and every precondition refused with a one-line error;
- the runtime: the prefetched program gives the unprefetched one's outputs bit for bit (only the
  transfer moves), and both agree with `dsl.interpret`, on the ring (2 and 4 ranks), library and
  shared-memory communicators;
- the cost model: the closed form and the DES agree, and the gather hides behind the matmul
  (no slower than the larger, faster than both in turn) where compute is not slowed;
- the autotuner's space reaches it.
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
from dsl import Builder, Local, P, Sliced, TransformError, f32, sym
from dsl.space import schedule_space
from dsl.transforms import fuse, prefetch, reorder, split

T, H = sym("T"), sym("H")


def fsdp() -> dsl.Program:
    b = Builder("fsdp")
    x = b.input("x", f32, [T, H], Local())
    w1 = b.input("w1", f32, [H / P, H], Sliced(0))
    w2 = b.input("w2", f32, [H / P, H], Sliced(0))
    h = b.matmul(x, b.all_gather(w1, name="w1f"), name="h")
    b.output("y", b.matmul(h, b.all_gather(w2, name="w2f"), name="y"))
    return b.build()


def test_prefetch_names_the_schedule_and_is_equivalent():
    q = prefetch(fsdp(), "w2f")
    assert q.schedule == "AG-pf(AG,MM)-MM" and q.prefetches[0].behind == q.value("h").id
    assert "prefetch(%" in str(q)
    dsl.check_equivalent(fsdp(), q, 2)


def _chained() -> dsl.Program:
    """w2 = all_gather(x2) where x2 is computed after the first matmul."""
    b = Builder("chained")
    x = b.input("x", f32, [T, H], Local())
    w1 = b.input("w1", f32, [H / P, H], Sliced(0))
    h = b.matmul(x, b.all_gather(w1, name="w1f"), name="h")
    w2 = b.input("w2", f32, [H / P, H], Sliced(0))
    s = b.exp(w2, name="s")
    b.output("y", b.matmul(h, b.all_gather(s, name="sf"), name="y"))
    return b.build()


@pytest.mark.parametrize(
    "make, args, why",
    [
        (fsdp, ("w1f",), "no statement before it"),
        (fsdp, ("w2f", "w2f"), "behind a library computation .matmul/attention., not all_gather"),
        (fsdp, ("h",), "expected a statement of kind all_gather"),
        (fsdp, ("w1f", "h"), "must come before it"),
        (_chained, ("sf", "h"), "its operand is computed at or after"),
        (fsdp, ("w2f", "nope"), "has no value 'nope'"),
    ],
)
def test_a_prefetch_that_cannot_start_there_is_refused(make, args, why):
    with pytest.raises(TransformError, match=why):
        prefetch(make(), *args)


def test_prefetch_comes_last():
    q = prefetch(fsdp(), "w2f")
    with pytest.raises(TransformError, match="already prefetched"):
        prefetch(q, "w2f")
    for t in (lambda p: reorder(p, "w2f"), lambda p: split(p)):
        with pytest.raises(TransformError, match="fuse, overlap and prefetch last"):
            t(q)
    with pytest.raises(TransformError, match="fuse first, then prefetch"):
        fuse(q, first="w2f")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("comm, world", [("ring", 2), ("ring", 4), ("library", 2), ("shm", 2)])
def test_the_prefetched_program_runs_as_the_plain_one(comm, world):
    sizes = {"T": 6, "H": 8 * world}
    progs = [fsdp(), prefetch(fsdp(), "w2f")]
    plans = [lower(p, sizes, world) for p in progs]
    assert [type(s).__name__ for s in plans[1].steps] == ["Collective", "Prefetch", "MatMul"]
    inputs = dsl.random_inputs(progs[0], world, sizes, np.random.default_rng(1))
    got = launch(run_plans, world, args=(comm, plans, [inputs, inputs]), timeout_s=240)
    expect = dsl.interpret(progs[0], inputs, world, sizes)
    bounds = dsl.error_bounds(progs[0], inputs, world, sizes)
    for rank in range(world):
        np.testing.assert_array_equal(got[rank][1]["y"], got[rank][0]["y"])
        assert dsl.runs_agree(got[rank][1], expect[rank], bounds[rank])


def test_the_model_hides_the_gather_behind_the_matmul():
    topo = dataclasses.replace(load_topology("dgx_h100"), compute_slowdown=0.0)
    sizes = {"T": 8192, "H": 8192}
    seq = lower(fsdp(), sizes, 8)
    ahead = lower(prefetch(fsdp(), "w2f"), sizes, 8)
    gather, mm = step_us(seq, seq.steps[2], topo), step_us(seq, seq.steps[1], topo)
    t_seq, t_ahead = simulate(seq, topo).time_us, simulate(ahead, topo).time_us
    assert plan_us(ahead, topo) == pytest.approx(t_ahead, rel=0.02)
    assert t_seq - t_ahead == pytest.approx(min(gather, mm), rel=0.05)


def test_the_autotuners_space_reaches_it():
    names = {s.program.schedule for s in schedule_space(fsdp()).schedules}
    assert "AG-pf(AG,MM)-MM" in names
