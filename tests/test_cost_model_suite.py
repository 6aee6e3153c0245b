"""Predictions through `python -m suite`: backend=sim on GPU topologies, the collectives
experiment, and bad settings as one-line errors (subprocesses, as users run them)."""

from __future__ import annotations

import csv

import pytest
from test_suite_cli import assert_one_line_error, suite_cmd


def rows(run_dir):
    return list(csv.DictReader((run_dir / "results.csv").open()))


@pytest.mark.slow
def test_adam_predicted_on_dgx2_nodes(tmp_path):
    proc = suite_cmd(
        "experiment=adam_fusion",
        "backend=sim",
        "topology=dgx2",
        "topology.nodes=2",
        "scale=smoke",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "predicted speedup over baseline: dgx2, 32 ranks" in proc.stdout
    got = rows(tmp_path)
    # the paper's result and the authors' own timings (128 V100) beside
    assert {r["source"] for r in got} == {"predicted", "paper", "published"}
    pred = [r for r in got if r["source"] == "predicted"]
    assert {r["backend"] for r in pred} == {"sim"}
    assert {r["schedule"] for r in pred} >= {"baseline", "AR-C", "fuse(RS-C-AG)"}
    assert all(r["world_size"] == "32" and r["topology"] == "dgx2" for r in pred)
    # every predicted point names NCCL's pick for each collective and the hidden communication
    fused = next(r for r in pred if r["schedule"] == "fuse(RS-C-AG)")
    assert fused["algo"] and fused["proto"] and fused["overlapped_ms"]
    report = (tmp_path / "report.md").read_text()
    assert "## Predicted" in report and "## The paper's published results" in report
    assert (tmp_path / "figures" / "adam_fusion_dgx2_breakdown.png").exists()


@pytest.mark.slow
def test_collectives_on_a_dgx_a100(tmp_path):
    proc = suite_cmd(
        "experiment=collectives",
        "backend=sim",
        "topology=dgx_a100",
        "scale=smoke",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw" in proc.stdout
    got = rows(tmp_path)
    assert {r["schedule"] for r in got} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert all(float(r["busbw_gbps"]) > 0 for r in got)
    assert (tmp_path / "figures" / "busbw.png").exists()


@pytest.mark.slow
def test_calibrate_needs_the_cpu_backend(tmp_path):
    proc = suite_cmd("experiment=calibrate", "backend=sim", f"hydra.run.dir={tmp_path}")
    assert_one_line_error(proc, "experiment calibrate measures this machine")


@pytest.mark.slow
def test_pipeline_needs_two_nodes_of_a_dgx_a100(tmp_path):
    proc = suite_cmd(
        "experiment=pipeline_parallel",
        "backend=sim",
        "topology=dgx_a100",
        "scale=smoke",
        f"hydra.run.dir={tmp_path}",
    )
    assert_one_line_error(proc, "needs 16 devices", "topology.nodes")
