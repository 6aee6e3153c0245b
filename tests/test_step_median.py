"""cost_model.median: a step's median between its links fitted at the means and at the medians."""

from __future__ import annotations

import dataclasses

import pytest

from codegen.lower import lower
from cost_model.median import calls, step_median
from cost_model.topology import load_topology
from cost_model.workload import simulate
from experiments.registry import get


def _calibrated():
    """The shipped local topology with its lone (median) links 1.5x faster than its means'."""
    local = load_topology("local")
    fast = lambda link: dataclasses.replace(link, bandwidth_gbps=link.bandwidth_gbps * 1.5)  # noqa: E731
    return dataclasses.replace(
        local, lone_link=fast(local.intra.link), lone_library=fast(local.library)
    )


def _plans(n=1 << 20):
    exp = get("adam_fusion")
    b = exp.bindings_of(n, f"[{n}]")
    return {name: lower(p, b, 2) for name, p in exp.schedules().items()}


def test_calls_count_each_chunk_of_a_fused_collective():
    plans = _plans()
    assert calls(plans["AR-C"].steps) == 1
    assert calls(plans["RS-C-AG+as_slice"].steps) == 2
    fused = plans["fuse(RS-C-AG)+as_slice"]
    assert calls(fused.steps) == 2 * next(s.chunks for s in fused.steps if hasattr(s, "chunks"))


@pytest.mark.parametrize("name", ["AR-C", "RS-C-AG+as_slice", "fuse(RS-C-AG)+as_slice"])
def test_a_step_of_n_calls_is_its_lone_time_plus_all_but_one_calls_gap(name):
    topo = _calibrated()
    plan = _plans()[name]
    means, lone = simulate(plan, topo).time_us, simulate(plan, topo.lone()).time_us
    assert lone < means  # the lone links are faster: the test can tell the two apart
    n = calls(plan.steps)
    got = step_median(plan, topo).time_us
    assert got == pytest.approx(lone + (1 - 1 / n) * (means - lone), rel=1e-12)
    if n == 1:
        assert got == pytest.approx(lone)
    else:
        assert lone < got < means


def test_a_topology_without_lone_links_is_simulated_as_it_is():
    topo = load_topology("local")
    assert topo.lone() is topo
    for plan in _plans().values():
        assert step_median(plan, topo).time_us == simulate(plan, topo).time_us
