"""A run's communication scale: each measured point's prediction takes the machine's
communication rate at that moment from an all-reduce timed in the point's own rounds
(`comm_probe_ms`) against the calibrated model's time for it, so a fast or slow spell of a
shared machine moves the predicted collectives as it moved the measured ones
(`experiments.predict.comm_scale`, `Topology.with_comm_scale`)."""
from __future__ import annotations

import pandas as pd
import pytest

import experiments
from cost_model.microbench import Measurement, predict_ms
from cost_model.topology import load_topology
from experiments.api import COMM_PROBE_BYTES, PredictSettings
from experiments.predict import COMM_SCALE, comm_scale, measured_comm_reference, predictions
from reports.predicted import memory_note

PROBE = Measurement("all_reduce", COMM_PROBE_BYTES, 0.0, 2)


def test_the_scale_is_the_models_probe_time_over_the_measured_one():
    topo = load_topology("local")
    model_ms = predict_ms(topo, PROBE)
    assert comm_scale(topo, 2, model_ms / 1.25) == pytest.approx(1.25)
    assert comm_scale(topo, 2, model_ms * 1.25) == pytest.approx(0.8)
    assert comm_scale(topo, 2, model_ms / 100) == COMM_SCALE[1]  # clipped
    assert comm_scale(topo, 2, model_ms * 100) == COMM_SCALE[0]
    for none in (None, 0.0, float("nan")):
        assert comm_scale(topo, 2, none if none == none else None) is None
    assert comm_scale(topo, 1, model_ms) is None  # one rank: no communication to read


@pytest.mark.parametrize("scale", [0.6, 1.0, 1.7])
def test_the_scaled_topology_times_the_probe_as_measured_and_leaves_compute_alone(scale):
    topo = load_topology("local")
    measured = predict_ms(topo, PROBE) / scale
    scaled = topo.with_comm_scale(comm_scale(topo, 2, measured))
    assert predict_ms(scaled, PROBE) == pytest.approx(measured, rel=1e-9)
    # the library's all-reduce moves by the factor at every size (latency and bandwidth alike);
    # the ring's collectives move their wire time by it, not the adds a CPU ring does on compute
    for nbytes in (4096, 1 << 20, 1 << 26):
        m = Measurement("all_reduce", nbytes, 0.0, 2)
        assert predict_ms(scaled, m) == pytest.approx(predict_ms(topo, m) / scale, rel=1e-9)
        for kind in ("reduce_scatter", "all_gather", "exchange"):
            m = Measurement(kind, nbytes, 0.0, 2)
            before, after = predict_ms(topo, m), predict_ms(scaled, m)
            lo, hi = sorted((before, before / scale))
            assert lo * (1 - 1e-9) <= after <= hi * (1 + 1e-9), (kind, nbytes)
            assert (after != pytest.approx(before, rel=1e-6)) == (scale != 1.0), (kind, nbytes)
    assert scaled.device == topo.device
    with pytest.raises(ValueError):
        topo.with_comm_scale(0.0)


def _measured_adam(probe_ms):
    """adam_fusion's measured rows at one small point, as the harness writes them."""
    adam = experiments.get("adam_fusion")
    n = 1 << 12
    rows = [{"experiment": "adam_fusion", "source": "measured", "backend": "cpu",
             "world_size": 2, "size": n, "shape": f"[{n}]", "schedule": s, "time_ms": 5.0,
             "compute_ms": 1.0, "verified": True} for s in dict(adam.schedules())]
    rows.insert(0, {**rows[0], "schedule": "baseline", "comm_probe_ms": probe_ms})
    return adam, rows


def _local_rows(probe_ms, out_dir):
    adam, rows = _measured_adam(probe_ms)
    settings = PredictSettings(scale="smoke", backend="cpu", topology=load_topology("local"),
                               world_size=2, max_elements=1 << 12, measured=rows, out_dir=out_dir)
    return {r["schedule"]: r for r in predictions(adam, settings)
            if r["source"] == "predicted" and r["topology"] == "local"}


def test_a_slower_probe_makes_every_predicted_step_slower_and_the_row_says_so(tmp_path):
    model_ms = predict_ms(load_topology("local"), PROBE)
    plain, slow = _local_rows(None, tmp_path), _local_rows(model_ms * 1.5, tmp_path)
    assert all(pd.isna(r.get("note")) or "comm" not in str(r.get("note")) for r in plain.values())
    assert set(plain) == set(slow)
    for name in plain:
        assert slow[name]["time_ms"] > plain[name]["time_ms"], name
        assert slow[name]["note"] == "comm x0.667"


def test_the_reference_is_the_baseline_rows_and_the_report_names_the_scales():
    _, rows = _measured_adam(3.0)
    rows.append({**rows[0], "shape": "[8]", "comm_probe_ms": ""})  # an older row: none
    assert measured_comm_reference(rows) == {(2, "[4096]"): 3.0}
    notes = pd.DataFrame([
        {"topology": "local", "world_size": 2, "shape": "[8]", "note": "memory x1.500 comm x0.800"},
        {"topology": "local", "world_size": 2, "shape": "[16]", "note": "comm x1.200"},
        {"topology": "local", "world_size": 2, "shape": "[32]", "note": None}])
    text = memory_note(notes)
    assert "Memory rate: at 1 point(s)" in text and "x1.50 .. x1.50" in text
    assert "Communication rate: at 2 point(s)" in text and "x0.80 .. x1.20" in text
    assert memory_note(notes[notes["shape"] == "[32]"]) == ""
