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
from experiments.predict import MEMORY_SCALE, measured_memory_reference, memory_scale
from reports.predicted import scales_note

N = 1 << 23  # 32 MiB of f32 gradient


def calibrated(curve=None):
    base = load_topology("local")
    dev = dataclasses.replace(
        base.device,
        stream_memory_gbps=30.0,
        library_steps_us={"adam": curve or {1 << 24: 4000.0, 1 << 25: 8000.0}},
    )
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
    mp = experiments.get("model_parallel")  # its baseline names no routine
    assert memory_scale(mp, topo, mp.points("smoke", 1 << 20)[0], 5.0) is None


def test_a_faster_memory_spell_makes_a_kernel_bound_step_faster_in_proportion():
    adam, topo = experiments.get("adam_fusion"), calibrated()
    plan = lower(
        dict(adam.schedules(experiments.optimizers.f32))["fuse(RS-C-AG)+as_slice"], {"N": N}, 1
    )  # one rank: its kernels alone, no communication
    slow, fast = (simulate(plan, topo.with_memory_scale(s)).time_us for s in (1.0, 1.5))
    assert fast < slow
    assert topo.with_memory_scale(1.5).device.stream_memory_gbps == pytest.approx(45.0)
    with pytest.raises(ValueError):
        topo.with_memory_scale(0.0)


def test_a_run_predicts_at_the_baselines_memory_rate_only_when_asked(tmp_path):
    """memory_scale=true scales a measured point's memory rates by its baseline's step (here
    calibration's 8 ms against the run's 10: x0.8, every kernel slower and the row says so);
    the default (false) predicts at the calibrated rates, no note."""
    from experiments.api import PredictSettings
    from experiments.predict import predictions

    adam = experiments.get("adam_fusion")
    rows = [
        {
            "experiment": "adam_fusion",
            "source": "measured",
            "backend": "cpu",
            "world_size": 2,
            "size": N,
            "shape": f"[{N}]",
            "schedule": s,
            "time_ms": 50.0,
            "compute_ms": 10.0,
            "verified": True,
        }
        for s in dict(adam.schedules())
    ]
    rows.insert(0, {**rows[0], "schedule": "baseline"})

    def predicted(scaled: bool) -> dict:
        settings = PredictSettings(
            scale="smoke",
            backend="cpu",
            topology=calibrated(),
            world_size=2,
            max_elements=N,
            measured=rows,
            out_dir=tmp_path,
            memory_scale=scaled,
        )
        return {
            r["schedule"]: r
            for r in predictions(adam, settings)
            if r["source"] == "predicted" and r["topology"] == "local"
        }

    plain, scaled = predicted(False), predicted(True)
    assert all(pd.isna(r.get("note")) or "memory" not in str(r.get("note")) for r in plain.values())
    for name, r in scaled.items():
        assert r["note"].startswith("memory x0.800"), name
        if name != "baseline":  # the baseline's computation is its measured time either way
            assert r["time_ms"] > plain[name]["time_ms"], name


def test_the_report_says_which_points_were_scaled_and_by_how_much():
    rows = pd.DataFrame(
        [
            {"topology": "local", "world_size": 2, "shape": "[8]", "note": "memory x1.500"},
            {"topology": "local", "world_size": 2, "shape": "[8]", "note": "memory x1.500"},
            {"topology": "local", "world_size": 2, "shape": "[16]", "note": "memory x0.900"},
            {"topology": "dgx2", "world_size": 256, "shape": "[8]", "note": None},
        ]
    )
    text = scales_note(rows)
    assert "at 2 point(s)" in text and "x0.90 .. x1.50" in text
    assert scales_note(rows[rows.topology == "dgx2"]) == ""


def test_lamb_reads_the_memory_rate_from_the_adam_probe_timed_beside_its_baseline():
    """The torch LAMB allocates temporaries every step, so its time does not read the memory
    rate; the harness times torch's fused Adam beside it (`probe_ms`), and the scale takes
    that against calibration's `library_adam`."""
    lamb, topo = experiments.get("lamb_fusion"), calibrated()
    assert lamb.baseline.probe == "adam" and not lamb.baseline.routine
    assert memory_scale(lamb, topo, {"N": N}, 5.0) == pytest.approx(8000 / 5000)
    rows = [
        {
            "source": "measured",
            "schedule": "baseline",
            "world_size": "2",
            "shape": "[8]",
            "compute_ms": "9.0",
            "probe_ms": "4.0",
        },
        {
            "source": "measured",
            "schedule": "baseline",
            "world_size": "2",
            "shape": "[16]",
            "compute_ms": "7.0",
            "probe_ms": "",
        },
        {
            "source": "measured",
            "schedule": "AR-C",
            "world_size": "2",
            "shape": "[32]",
            "compute_ms": "1.0",
            "probe_ms": "",
        },
        {
            "source": "predicted",
            "schedule": "baseline",
            "world_size": "2",
            "shape": "[64]",
            "compute_ms": "1.0",
            "probe_ms": "2.0",
        },
    ]
    assert measured_memory_reference(lamb, rows) == {(2, "[8]"): 4.0}  # no probe: no scale
    adam = experiments.get("adam_fusion")  # its baseline's own step is the routine
    assert measured_memory_reference(adam, rows) == {(2, "[8]"): 9.0, (2, "[16]"): 7.0}


def test_the_probe_is_the_routines_own_step_on_a_copy_of_the_inputs():
    import numpy as np

    from codegen.runtime.backend import CpuBackend
    from experiments.api import BaselineContext
    from experiments.optimizers import AdamBaseline, LambBaseline

    n = 64
    rng = np.random.default_rng(0)
    inputs = {k: rng.random(n, dtype=np.float32) + 0.1 for k in "wmvg"}
    inputs.update(
        {
            k: np.float32(v)
            for k, v in dict(
                lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3.0
            ).items()
        }
    )
    ctx = BaselineContext(
        rank=0, world_size=2, P=2, backend=CpuBackend(), groups=None, inputs=inputs, exact=False
    )
    assert AdamBaseline.memory_probe(ctx) is None  # its own step is the routine
    probe = LambBaseline.memory_probe(ctx)
    assert isinstance(probe, AdamBaseline)
    g = probe.g.clone()
    probe.alone_step()
    probe.alone_step()
    assert probe.compute_ms > 0
    assert np.array_equal(inputs["w"], ctx.inputs["w"])  # the baseline's own inputs untouched
    assert np.allclose(probe.g.numpy(), g.numpy())  # the gradient scaled back after each step
    assert not np.allclose(probe.w.numpy(), inputs["w"])  # Adam stepped w


def test_calibration_times_the_library_step_where_it_streams_from_memory():
    """Calibration's `library_adam` starts at 2^22 elements: at 2^20 its calls, back to back on
    the same data, run from the caches where a run's step does not, so the optimizer
    experiments' 2^20 points get no memory scale and the larger ones do."""
    from experiments.calibration.measure import LIBRARY_SCALES, sizes

    for scale in ("quick", "default", "paper"):
        assert min(sizes(scale, LIBRARY_SCALES)) == 1 << 22
    curve = {4 * n: 1000.0 * n / (1 << 22) for n in sizes("default", LIBRARY_SCALES)}
    for name in ("adam_fusion", "lamb_fusion"):
        exp = experiments.get(name)
        got = {
            b["N"]: memory_scale(exp, calibrated(curve), b, 1.0)
            for b in exp.points("default", 1 << 40)
        }
        assert got[1 << 20] is None and all(v is not None for n, v in got.items() if n >= 1 << 22)
