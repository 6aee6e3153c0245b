"""The data-parallel experiments measured for real on 2 gloo ranks at tiny sizes through the
public harness: every schedule's w, m, v after one step equal the library's
(torch.optim.Adam(fused=True); the torch LAMB), a wrong schedule and a wrong baseline are caught,
rows land in results.csv as measured, and torchrun runs the same harness."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

import experiments
from experiments import MeasureSettings, harness

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "user_experiments"


def _settings(tmp_path, **kw):
    return MeasureSettings(
        scale="smoke",
        max_elements=1 << 13,
        world_size=2,
        warmup=0,
        repeats=1,
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
        **kw,
    )


@pytest.mark.slow
def test_adam_and_lamb_match_the_library(tmp_path):
    for name in ("adam_fusion", "lamb_fusion"):
        rows = harness.measure(experiments.get(name), _settings(tmp_path))
        schedules = {r["schedule"] for r in rows if r["experiment"] == name}
        assert schedules == {
            "baseline",
            "AR-C",
            "RS-C-AG",
            "RS-C-AG+as_slice",
            "fuse(RS-C-AG)",
            "fuse(RS-C-AG)+as_slice",
        }
        assert all(r["verified"] for r in rows), [r for r in rows if not r["verified"]]
        base = [r for r in rows if r["schedule"] == "baseline"]
        assert all(0 < r["compute_ms"] <= r["time_ms_max"] for r in base)  # the optimizer step
        # lamb's baseline has torch's fused Adam timed beside it (its memory probe), adam's not
        assert all((r.get("probe_ms", 0) > 0) == (name == "lamb_fusion") for r in base)
        assert "probe" not in schedules
        # every baseline row has the all-reduce timed in its rounds (the communication rate's
        # reference), no other row has, and it is no schedule of its own
        assert all(r["comm_probe_ms"] > 0 for r in base) and "comm_probe" not in schedules
        assert not any("comm_probe_ms" in r for r in rows if r["schedule"] != "baseline")
    table = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(table) == 2 * 2 * 6  # two experiments x sizes 2^12, 2^13 x six schedules
    assert {r["source"] for r in table} == {"measured"}
    assert all(
        float(r["time_ms_min"]) <= float(r["time_ms"]) <= float(r["time_ms_max"]) for r in table
    )
    assert list((tmp_path / "kernels").glob("*.cpp"))


@pytest.mark.slow
def test_a_wrong_schedule_and_a_wrong_baseline_are_not_verified(tmp_path):
    adam, lamb = experiments.get("adam_fusion"), experiments.get("lamb_fusion")
    rows = harness.measure(
        adam, _settings(tmp_path, points=[{"N": 1 << 12}], schedules={"lamb AR-C": lamb.program()})
    )
    assert {r["schedule"]: r["verified"] for r in rows} == {"baseline": True, "lamb AR-C": False}
    (wrong,) = experiments.load_module(str(FIXTURES / "mismatched.py"))
    try:
        rows = harness.measure(
            wrong, _settings(tmp_path, points=[{"N": 1 << 12}], schedules={"AR-C": adam.program()})
        )
    finally:
        experiments.registry.unregister(wrong.name)
    assert rows and not any(r["verified"] for r in rows)  # the baseline is not the program


@pytest.mark.slow
def test_torchrun_runs_the_same_harness(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "experiments",
        "adam_fusion",
        "--scale",
        "smoke",
        "--out",
        str(tmp_path),
        "--repeats",
        "1",
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    table = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(table) == 5 * 6 and all(r["verified"] == "True" for r in table)
