"""The rings' own scale: the runtime's reduce-scatter and all-gather, timed in each measured
point's rounds (`ring_probe_ms`) against calibration's (`Topology.rings_us`), scale the links of
the runtime's rings and transfers, and the all-reduce probe (`comm_probe_ms`) only the library's
(`experiments.predict.ring_scale`, `Topology.with_comm_scale(scale, ring)`)."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import experiments
from cost_model.calibration import rings_us
from cost_model.microbench import Measurement, predict_ms
from cost_model.topology import load_topology
from experiments.api import RING_PROBE_BYTES, PredictSettings
from experiments.predict import (COMM_SCALE, measured_ring_reference, predictions, ring_scale)
from reports.predicted import scales_note

RINGS = [Measurement(k, RING_PROBE_BYTES, 0.0, 2) for k in ("reduce_scatter", "all_gather")]
AR = Measurement("all_reduce", RING_PROBE_BYTES, 0.0, 2)


def rings_ms(topo) -> float:
    return sum(predict_ms(topo, m) for m in RINGS)


def calibrated(ms_at_probe=7.0):
    """The shipped local topology with calibration's rings measured on 2 ranks at 4 and 16 MiB
    (the probe's 8 MiB between them, log-log) and its all-reduce likewise."""
    a, b = 4 << 20, 16 << 20
    curve = {2: {a: ms_at_probe * 1e3 / 2 ** 0.5, b: ms_at_probe * 1e3 * 2 ** 0.5}}
    return dataclasses.replace(load_topology("local"), rings_us=curve, all_reduce_us=curve)


def test_the_ring_scale_moves_the_models_rings_as_the_run_moved_them():
    topo = calibrated(7.0)
    for ratio in (0.8, 1.0, 1.3):
        ring = ring_scale(topo, 2, 7.0 * ratio)
        moved = rings_ms(topo.with_comm_scale(1.0, ring)) / rings_ms(topo)
        assert moved == pytest.approx(ratio, rel=1e-6)
    assert ring_scale(topo, 2, 7.0) == pytest.approx(1.0)
    assert ring_scale(topo, 2, 0.07) == COMM_SCALE[1]  # clipped
    assert ring_scale(topo, 2, None) is None and ring_scale(topo, 4, 7.0) is None
    assert ring_scale(load_topology("local"), 2, 7.0) is None  # nothing measured: no reference


@pytest.mark.parametrize("scale,ring", [(1.0, 0.5), (1.6, 1.0), (0.7, 1.4)])
def test_the_ring_factor_moves_the_rings_and_transfers_and_the_other_the_library(scale, ring):
    topo = fit_topology()
    both = topo.with_comm_scale(scale, ring)
    for a, b, by in ((topo.intra.link, both.intra.link, ring), (topo.lone_link, both.lone_link, ring),
                     (topo.p2p_link, both.p2p_link, ring), (topo.library, both.library, scale),
                     (topo.lone_library, both.lone_library, scale)):
        assert b.bandwidth_gbps == pytest.approx(a.bandwidth_gbps * by)
        assert (b.latency_us, b.overhead_us) == (a.latency_us, a.overhead_us)
    # the all-reduce (the library's) follows `scale` alone, the rings `ring` alone
    assert predict_ms(both, AR) == pytest.approx(predict_ms(topo.with_comm_scale(scale), AR))
    assert rings_ms(both) == pytest.approx(rings_ms(topo.with_comm_scale(ring)))
    # without `ring`, every link takes `scale`, as before the rings had a probe of their own
    assert topo.with_comm_scale(scale) == topo.with_comm_scale(scale, scale)
    with pytest.raises(ValueError):
        topo.with_comm_scale(1.0, 0.0)


def fit_topology():
    """The shipped local topology with every link class with_comm_scale touches: the lone
    links and the one-way ones (a calibration's) copies of the ring's and the library's."""
    topo = load_topology("local")
    return dataclasses.replace(topo, lone_link=topo.intra.link, lone_library=topo.library,
                               p2p_link=topo.intra.link, lone_p2p_link=topo.intra.link)


def test_calibration_keeps_its_rings_means_summed_by_size():
    ms = [Measurement("reduce_scatter", 1 << 20, 1.0, 2, time_ms_mean=1.5),
          Measurement("all_gather", 1 << 20, 1.0, 2, time_ms_mean=2.0),
          Measurement("reduce_scatter", 4 << 20, 3.0, 2, time_ms_mean=4.0),  # no all-gather
          Measurement("all_reduce", 1 << 20, 9.0, 2, time_ms_mean=9.0)]
    assert rings_us(ms, 2) == {2: {1 << 20: 3500.0}}
    assert rings_us(ms[3:], 2) == {}


def _local_rows(comm_ms, ring_ms, out_dir):
    adam = experiments.get("adam_fusion")
    n = 1 << 12
    rows = [{"experiment": "adam_fusion", "source": "measured", "backend": "cpu",
             "world_size": 2, "size": n, "shape": f"[{n}]", "schedule": s, "time_ms": 5.0,
             "compute_ms": 1.0, "verified": True} for s in dict(adam.schedules())]
    rows.insert(0, {**rows[0], "schedule": "baseline", "comm_probe_ms": comm_ms,
                    "ring_probe_ms": ring_ms})
    settings = PredictSettings(scale="smoke", backend="cpu", topology=calibrated(7.0),
                               world_size=2, max_elements=1 << 12, measured=rows, out_dir=out_dir)
    return rows, {r["schedule"]: r for r in predictions(adam, settings)
                  if r["source"] == "predicted" and r["topology"] == "local"}


def test_slower_rings_slow_the_ring_schedules_and_not_the_library_baseline(tmp_path):
    rows, plain = _local_rows(7.0, 7.0, tmp_path)
    _, slow = _local_rows(7.0, 7.0 * 1.5, tmp_path)
    assert measured_ring_reference(rows) == {(2, "[4096]"): 7.0}
    assert slow["baseline"]["time_ms"] == pytest.approx(plain["baseline"]["time_ms"])
    assert slow["AR-C"]["time_ms"] == pytest.approx(plain["AR-C"]["time_ms"])
    for name in ("RS-C-AG", "fuse(RS-C-AG)+as_slice"):
        assert slow[name]["time_ms"] > plain[name]["time_ms"], name
    assert "ring x0." in slow["baseline"]["note"] and "ring x1.000" in plain["baseline"]["note"]
    text = scales_note(pd.DataFrame([{**r, "topology": "local"} for r in slow.values()]))
    assert "Rings' rate: at 1 point(s)" in text
