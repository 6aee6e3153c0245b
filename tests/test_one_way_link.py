"""One-way messages on their own link (`Topology.p2p_link`, fitted to calibration's `send`) and
the step overhead of plans with more ranks than the machine has cores (`Topology.cores`)."""

from __future__ import annotations

import dataclasses

import pytest

from codegen.lower import lower
from cost_model.closed_form import plan_us
from cost_model.network import hop, hop_us
from cost_model.topology import LinkClass, load_topology
from cost_model.workload import simulate
from experiments import pipeline_parallel
from experiments.calibration.fit import Measurement, fit, predict_ms
from tests.test_calibrate import synthetic, truth

ONE_WAY = LinkClass(
    bandwidth_gbps=3.0,
    latency_us=200.0,
    overhead_us=40.0,
    rate_by="transfer",
    efficiency={1 << 16: 0.4, 1 << 22: 0.9, 1 << 27: 1.0},
)


def _sends(topo, P=2) -> list[Measurement]:
    ms = [Measurement("send", 1 << k, 0.0, P) for k in range(12, 28)]
    return [dataclasses.replace(m, time_ms=predict_ms(topo, m)) for m in ms]


@pytest.mark.slow
def test_the_fit_takes_one_way_messages_from_send_and_keeps_the_ring_link():
    """Measurements made by a topology whose one-way link is faster than its ring's: the fit
    recovers both, predicts the sends back, and keeps the medians' one-way link for lone
    calls; without `send` there is no one-way link and a send takes the ring's."""
    t = dataclasses.replace(truth(), p2p_link=ONE_WAY)
    sends = _sends(t)
    got = fit(synthetic(t) + sends, load_topology("local"), 2)
    assert got.intra.link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)
    assert got.p2p_link.bandwidth_gbps == pytest.approx(3.0, rel=0.02)
    assert got.p2p_link.latency_us == pytest.approx(200.0, rel=0.1)
    assert got.p2p_link.overhead_us == got.intra.link.overhead_us  # the ring's post
    for m in sends:
        assert predict_ms(got, m) == pytest.approx(m.time_ms, rel=0.05), m
    slow = dataclasses.replace(t, p2p_link=dataclasses.replace(ONE_WAY, bandwidth_gbps=1.5))
    means = [dataclasses.replace(m, time_ms_mean=predict_ms(slow, m)) for m in sends]
    both = fit(synthetic(t) + means, load_topology("local"), 2)
    assert both.p2p_link.bandwidth_gbps == pytest.approx(1.5, rel=0.02)  # a step's: the means
    assert both.lone().p2p_link.bandwidth_gbps == pytest.approx(3.0, rel=0.02)
    assert both.lone().lone_p2p_link is None
    without = fit(synthetic(t), load_topology("local"), 2)
    assert without.p2p_link is None and without.lone_p2p_link is None
    assert predict_ms(without, sends[-1]) == pytest.approx(
        hop_us(without, 0, 1, sends[-1].nbytes, whole=sends[-1].nbytes) / 1e3, rel=1e-6
    )


def test_only_a_one_way_message_takes_the_one_way_link():
    t = dataclasses.replace(truth(), p2p_link=ONE_WAY)
    assert hop(t, 0, 1, p2p=True)[1] == ONE_WAY
    assert hop(t, 0, 1)[1] == t.intra.link  # a ring's message
    assert hop(t, 0, 1, link=t.library, p2p=True)[1] == t.library  # the library's call
    assert hop(truth(), 0, 1, p2p=True)[1] == truth().intra.link  # none fitted


def test_a_pipelines_send_costs_what_the_one_way_link_says_in_both_models():
    """AR-C-P2P on 2 stages of one rank: the send is alone on the critical path, so a slower
    one-way link adds exactly its extra wire time, in the DES and in the closed form."""
    plan = lower(pipeline_parallel.program(), {"S": 64, "B": 1, "H": 256}, 2)
    nbytes = 64 * 256 * 4
    t = truth()
    slow = dataclasses.replace(t, p2p_link=dataclasses.replace(t.intra.link, bandwidth_gbps=0.5))
    extra = hop_us(slow, 0, 1, nbytes, whole=nbytes, p2p=True) - hop_us(
        t, 0, 1, nbytes, whole=nbytes
    )
    assert extra > 100
    assert simulate(plan, slow).time_us - simulate(plan, t).time_us == pytest.approx(
        extra, rel=1e-6
    )
    assert plan_us(plan, slow) - plan_us(plan, t) == pytest.approx(extra, rel=1e-6)


@pytest.mark.slow
def test_more_ranks_than_cores_pay_the_step_overhead_that_many_times():
    """The overhead is stated at one rank a core: a 4-rank plan on 2 cores pays it twice, on
    4 cores (or cores unknown) once; a calibration of 2 ranks on 1 core is halved by the fit."""
    t = dataclasses.replace(truth(), step_overhead_us=500.0)
    assert t.step_overhead_for(1 << 20, 4) == 500.0  # cores unknown
    two = dataclasses.replace(t, cores=2)
    assert two.step_overhead_for(1 << 20, 2) == 500.0
    assert two.step_overhead_for(1 << 20, 4) == 1000.0
    assert dataclasses.replace(t, cores=4).step_overhead_for(1 << 20, 4) == 500.0
    plan = lower(pipeline_parallel.program(), {"S": 64, "B": 1, "H": 256}, 4)
    assert simulate(plan, two).time_us - simulate(plan, t).time_us == pytest.approx(500.0)
    ms = synthetic(truth())
    ms += [Measurement("sequence_extra", b, 0.6, 2) for b in (1 << 20, 1 << 22)]
    assert fit(ms, load_topology("local"), 2, cores=2).step_overhead_us == pytest.approx(600.0)
    one = fit(ms, load_topology("local"), 2, cores=1)
    assert one.cores == 1 and one.step_overhead_us == pytest.approx(300.0)
    assert one.step_overhead_for(1 << 22, 2) == pytest.approx(600.0)  # what was measured
    assert fit(ms, load_topology("local"), 2).cores is None
