"""The data-parallel experiments measured for real on 2 gloo ranks at tiny sizes: every schedule's
w, m, v after 3 steps equal the library's (torch.optim.Adam(fused=True); the torch LAMB), a wrong
program is caught, rows land in results.csv as measured, and torchrun runs the same runtime."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import experiments
from experiments import MeasureSettings
from experiments._dp_measure import baseline_matches_program, measure
from experiments._optim import adam_program, lamb_program

ROOT = Path(__file__).resolve().parent.parent


def _settings(tmp_path, **kw):
    return MeasureSettings(scale="smoke", max_elements=1 << 13, world_size=2, warmup=0, repeats=1,
                           csv_path=tmp_path / "results.csv", kernels_dir=tmp_path / "kernels",
                           **kw)


def test_adam_and_lamb_match_the_library(tmp_path):
    for name in ("adam_fusion", "lamb_fusion"):
        rows = experiments.load(name).measure(_settings(tmp_path))
        schedules = {r["schedule"] for r in rows if r["experiment"] == name}
        assert schedules == {"baseline", "AR-C", "RS-C-AG", "RS-C-AG+as_slice", "fuse(RS-C-AG)",
                             "fuse(RS-C-AG)+as_slice"}
        assert all(r["verified"] for r in rows), [r for r in rows if not r["verified"]]
    table = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(table) == 2 * 2 * 6  # two experiments x sizes 2^12, 2^13 x six schedules
    assert {r["source"] for r in table} == {"measured"}
    assert all(float(r["time_ms_min"]) <= float(r["time_ms"]) <= float(r["time_ms_max"])
               for r in table)
    assert list((tmp_path / "kernels").glob("*.cpp"))


def test_a_wrong_schedule_is_not_verified(tmp_path):
    assert baseline_matches_program("adam", adam_program(), 2)
    assert not baseline_matches_program("adam", lamb_program(), 2)
    rows = measure("adam_fusion", "adam", adam_program(), {"lamb AR-C": lamb_program()},
                   [1 << 12], 2, 0, 1, tmp_path / "r.csv", tmp_path / "k")
    verdict = {r["schedule"]: r["verified"] for r in rows}
    assert verdict == {"baseline": True, "lamb AR-C": False}


def test_torchrun_runs_the_same_runtime(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "experiments", "adam_fusion", "--scale", "smoke", "--out", str(tmp_path),
           "--repeats", "1"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    table = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(table) == 5 * 6 and all(r["verified"] == "True" for r in table)
