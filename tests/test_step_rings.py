"""A step's ring link (fitted at the means) takes its rate from the runtime's two rings, the
reduce-scatter and the all-gather, the mean of theirs size by size (`calibration.STEP_RINGS`);
a lone call's link (at the medians) keeps the median of the exchange and the two rings."""

from __future__ import annotations

import dataclasses

import pytest

from cost_model.topology import load_topology
from experiments.calibration.fit import STEP_RINGS, Measurement, fit, predict_ms
from tests.test_calibrate import synthetic, truth


def _rings(median_topo, mean_topos: dict, P=2) -> list[Measurement]:
    """reduce_scatter and all_gather at 64 KiB-128 MiB: medians from `median_topo`, means from
    `mean_topos[kind]`."""
    out = []
    for kind in STEP_RINGS:
        for k in range(16, 28):
            m = Measurement(kind, 1 << k, 0.0, P)
            out.append(
                dataclasses.replace(
                    m,
                    time_ms=predict_ms(median_topo, m),
                    time_ms_mean=predict_ms(mean_topos[kind], m),
                )
            )
    return out


def test_a_steps_ring_rate_is_the_mean_of_the_two_rings_and_a_lone_calls_the_median():
    """Means made by a reduce-scatter at 1.2 GB/s and an all-gather at 1.8 (the exchange at
    2.0): the step's link runs at their mean, 1.5 GB/s, not at the median of the three (1.8);
    the medians, all at 2.0, give the lone link 2.0."""
    t = truth()
    ms = synthetic(t) + _rings(
        t,
        {
            "reduce_scatter": t.with_comm_scale(0.6),  # 1.2 GB/s
            "all_gather": t.with_comm_scale(0.9),
        },
    )  # 1.8 GB/s
    got = fit(ms, load_topology("local"), 2)
    assert got.intra.link.bandwidth_gbps == pytest.approx(1.5, rel=0.05)  # the median: 1.8
    assert got.lone_link.bandwidth_gbps == pytest.approx(2.0, rel=0.03)
    assert got.lone().intra.link.bandwidth_gbps == pytest.approx(2.0, rel=0.03)


def test_without_the_rings_a_steps_link_is_the_exchanges():
    """A calibration without reduce-scatter or all-gather (an older one): the exchange's rate."""
    got = fit(synthetic(truth()), load_topology("local"), 2)
    assert got.intra.link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)
