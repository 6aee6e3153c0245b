"""A run's communication scale: each measured point's prediction takes the machine's
communication rate at that moment from an all-reduce timed in the point's own rounds
(`comm_probe_ms`) against calibration's measured time for it (`Topology.all_reduce_us`), so a
fast or slow spell of a shared machine moves the predicted collectives as it moved the measured
ones (`experiments.predict.comm_scale`, `Topology.with_comm_scale`)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import experiments
from cost_model.microbench import Measurement, predict_ms
from cost_model.topology import load_topology
from experiments.api import COMM_PROBE_BYTES, PredictSettings
from experiments.calibration.fit import all_reduce_us
from experiments.predict import COMM_SCALE, comm_scale, measured_comm_reference, predictions
from reports.predicted import scales_note

PROBE = Measurement("all_reduce", COMM_PROBE_BYTES, 0.0, 2)


def calibrated(ms_at_probe=6.0):
    """The shipped local topology with calibration's all-reduce measured on 2 ranks: 4 and
    16 MiB (the probe's 8 MiB between them, log-log)."""
    a, b = 4 << 20, 16 << 20
    return dataclasses.replace(
        load_topology("local"),
        all_reduce_us={2: {a: ms_at_probe * 1e3 / 2**0.5, b: ms_at_probe * 1e3 * 2**0.5}},
    )


def _moved(topo, measured_ms, reference_ms=6.0):
    """The model's probe time on the topology scaled for a measured probe, over the model's
    unscaled time: what comm_scale makes equal to measured / reference."""
    scaled = topo.with_comm_scale(comm_scale(topo, 2, measured_ms))
    return predict_ms(scaled, PROBE) / predict_ms(topo, PROBE)


def test_the_scale_moves_the_models_probe_time_as_the_run_moved_from_calibration():
    topo = calibrated(6.0)
    for ratio in (0.8, 1.0, 1.25):
        assert _moved(topo, 6.0 * ratio) == pytest.approx(ratio, rel=1e-6)
    assert comm_scale(topo, 2, 6.0) == pytest.approx(1.0)
    assert comm_scale(topo, 2, 4.8) > 1.25  # the fixed part does not move: more bandwidth
    assert comm_scale(topo, 2, 0.06) == COMM_SCALE[1]  # clipped
    assert comm_scale(topo, 2, 600.0) == COMM_SCALE[0]
    assert comm_scale(topo, 2, None) is None and comm_scale(topo, 2, 0.0) is None
    assert comm_scale(topo, 1, 6.0) is None  # one rank: no communication to read
    # a world calibration did not measure: the model's all-reduce there is no reference
    assert comm_scale(topo, 4, 6.0) is None
    # the shipped figures measured nothing: no scale, whatever the model predicts
    assert load_topology("local").all_reduce_us == {}
    assert comm_scale(load_topology("local"), 2, 6.0) is None


def test_calibration_keeps_its_all_reduce_means_by_ranks_and_size():
    ms = [
        Measurement("all_reduce", 1 << 20, 1.0, 2, time_ms_mean=1.5),
        Measurement("all_reduce", 4 << 20, 3.0, 2, time_ms_mean=4.0),
        Measurement("exchange", 1 << 20, 9.0, 2, time_ms_mean=9.0),
    ]
    assert all_reduce_us(ms, 2) == {2: {1 << 20: 1500.0, 4 << 20: 4000.0}}
    assert all_reduce_us(ms[2:], 2) == {}


@pytest.mark.parametrize("scale", [0.6, 1.0, 1.7])
def test_the_scaled_topology_has_its_links_bandwidth_moved_and_nothing_else(scale):
    topo = load_topology("local")
    scaled = topo.with_comm_scale(scale)
    for a, b in ((topo.intra.link, scaled.intra.link), (topo.library, scaled.library)):
        assert b.bandwidth_gbps == pytest.approx(a.bandwidth_gbps * scale)
        assert (b.latency_us, b.overhead_us, b.efficiency) == (
            a.latency_us,
            a.overhead_us,
            a.efficiency,
        )
    assert scaled.device == topo.device and scaled.all_reduce_us == topo.all_reduce_us
    # a large all-reduce moves by nearly the factor, a tiny one hardly at all
    big, tiny = (Measurement("all_reduce", n, 0.0, 2) for n in (1 << 28, 4096))
    assert predict_ms(scaled, big) == pytest.approx(predict_ms(topo, big) / scale, rel=0.05)
    assert predict_ms(scaled, tiny) == pytest.approx(predict_ms(topo, tiny), rel=0.05)
    with pytest.raises(ValueError):
        topo.with_comm_scale(0.0)


def _measured_adam(probe_ms):
    """adam_fusion's measured rows at one small point, as the harness writes them."""
    adam = experiments.get("adam_fusion")
    n = 1 << 12
    rows = [
        {
            "experiment": "adam_fusion",
            "source": "measured",
            "backend": "cpu",
            "world_size": 2,
            "size": n,
            "shape": f"[{n}]",
            "schedule": s,
            "time_ms": 5.0,
            "compute_ms": 1.0,
            "verified": True,
        }
        for s in dict(adam.schedules())
    ]
    rows.insert(0, {**rows[0], "schedule": "baseline", "comm_probe_ms": probe_ms})
    return adam, rows


def _local_rows(probe_ms, out_dir):
    adam, rows = _measured_adam(probe_ms)
    settings = PredictSettings(
        scale="smoke",
        backend="cpu",
        topology=calibrated(6.0),
        world_size=2,
        max_elements=1 << 12,
        measured=rows,
        out_dir=out_dir,
    )
    return {
        r["schedule"]: r
        for r in predictions(adam, settings)
        if r["source"] == "predicted" and r["topology"] == "local"
    }


def test_a_slower_probe_makes_every_predicted_step_slower_and_the_row_says_so(tmp_path):
    plain, slow = _local_rows(None, tmp_path), _local_rows(6.0 * 1.5, tmp_path)
    assert all(pd.isna(r.get("note")) or "comm" not in str(r.get("note")) for r in plain.values())
    assert set(plain) == set(slow)
    for name in plain:
        assert slow[name]["time_ms"] > plain[name]["time_ms"], name
        assert slow[name]["note"].startswith("comm x0.")


def test_the_reference_is_the_baseline_rows_and_the_report_names_the_scales():
    _, rows = _measured_adam(3.0)
    rows.append({**rows[0], "shape": "[8]", "comm_probe_ms": ""})  # an older row: none
    assert measured_comm_reference(rows) == {(2, "[4096]"): 3.0}
    notes = pd.DataFrame(
        [
            {
                "topology": "local",
                "world_size": 2,
                "shape": "[8]",
                "note": "memory x1.500 comm x0.800",
            },
            {"topology": "local", "world_size": 2, "shape": "[16]", "note": "comm x1.200"},
            {"topology": "local", "world_size": 2, "shape": "[32]", "note": None},
        ]
    )
    text = scales_note(notes)
    assert "Memory rate: at 1 point(s)" in text and "x1.50 .. x1.50" in text
    assert "Communication rate: at 2 point(s)" in text and "x0.80 .. x1.20" in text
    assert scales_note(notes[notes["shape"] == "[32]"]) == ""
