"""A run's memory scale: each measured point's prediction takes the machine's memory rate at that
moment from the run's own baseline (its optimizer step against calibration's time for it), so a
fast or slow spell of a shared machine's memory moves the predicted kernels as it moved the
measured ones (`experiments.predict.memory_scale`, `Topology.with_memory_scale`)."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import experiments
from codegen.lower import lower
from cost_model.topology import load_topology
from cost_model.workload import simulate
from experiments.predict import MEMORY_SCALE, memory_scale
from reports.predicted import memory_note

N = 1 << 23  # 32 MiB of f32 gradient


def calibrated(curve=None):
    base = load_topology("local")
    dev = dataclasses.replace(base.device, stream_memory_gbps=30.0, library_steps_us={
        "adam": curve or {1 << 24: 4000.0, 1 << 25: 8000.0}})
    return dataclasses.replace(base, device=dev)


def test_the_scale_is_calibrations_time_over_the_runs_at_that_point():
    adam, topo = experiments.get("adam_fusion"), calibrated()
    assert memory_scale(adam, topo, {"N": N}, 5.0) == pytest.approx(8000 / 5000)
    assert memory_scale(adam, topo, {"N": N}, 10.0) == pytest.approx(0.8)
    # beyond the curve's largest size: per byte; clipped to MEMORY_SCALE
    assert memory_scale(adam, topo, {"N": 2 * N}, 16.0) == pytest.approx(1.0)
    assert memory_scale(adam, topo, {"N": N}, 1.0) == MEMORY_SCALE[1]
    assert memory_scale(adam, topo, {"N": N}, 100.0) == MEMORY_SCALE[0]


def test_no_scale_without_a_routine_a_curve_a_measurement_or_below_the_curve():
    adam, topo = experiments.get("adam_fusion"), calibrated()
    assert memory_scale(adam, topo, {"N": 1 << 20}, 1.0) is None  # 4 MiB: in the caches
    assert memory_scale(adam, topo, {"N": N}, None) is None
    assert memory_scale(adam, load_topology("local"), {"N": N}, 5.0) is None  # no curve
    assert memory_scale(experiments.get("lamb_fusion"), topo, {"N": N}, 5.0) is None
    mp = experiments.get("model_parallel")  # its baseline names no routine
    assert memory_scale(mp, topo, mp.points("smoke", 1 << 20)[0], 5.0) is None


def test_a_faster_memory_spell_makes_a_kernel_bound_step_faster_in_proportion():
    adam, topo = experiments.get("adam_fusion"), calibrated()
    plan = lower(dict(adam.schedules(experiments.optimizers.f32))["fuse(RS-C-AG)+as_slice"],
                 {"N": N}, 1)  # one rank: its kernels alone, no communication
    slow, fast = (simulate(plan, topo.with_memory_scale(s)).time_us for s in (1.0, 1.5))
    assert fast < slow
    assert topo.with_memory_scale(1.5).device.stream_memory_gbps == pytest.approx(45.0)
    with pytest.raises(ValueError):
        topo.with_memory_scale(0.0)


def test_the_report_says_which_points_were_scaled_and_by_how_much():
    rows = pd.DataFrame([
        {"topology": "local", "world_size": 2, "shape": "[8]", "note": "memory x1.500"},
        {"topology": "local", "world_size": 2, "shape": "[8]", "note": "memory x1.500"},
        {"topology": "local", "world_size": 2, "shape": "[16]", "note": "memory x0.900"},
        {"topology": "dgx2", "world_size": 256, "shape": "[8]", "note": None}])
    text = memory_note(rows)
    assert "at 2 point(s)" in text and "x0.90 .. x1.50" in text
    assert memory_note(rows[rows.topology == "dgx2"]) == ""
