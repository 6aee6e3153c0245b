"""The collectives experiment: nccl-tests rows predicted on any topology, measured on 2 ranks."""
from __future__ import annotations

import pytest

from cost_model.topology import load_topology
from experiments import MeasureSettings, collectives


def test_predicted_rows_follow_nccl_tests_conventions():
    topo = load_topology("dgx_a100")
    rows = collectives.predict_rows(topo, 8, "smoke")
    assert {r["schedule"] for r in rows} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert [r["size"] for r in rows if r["schedule"] == "all_reduce"] == \
        [1 << k for k in range(10, 31, 4)]
    for r in rows:
        algbw = r["size"] / (r["time_ms"] * 1e-3) / 1e9
        factor = 2 * 7 / 8 if r["schedule"] == "all_reduce" else 7 / 8
        assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-3)
        assert r["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-3)
    big = [r for r in rows if r["size"] == 1 << 30]
    assert all(150 < r["busbw_gbps"] < 300 for r in big)  # NVSwitch: 300 GB/s per direction
    assert {(r["algo"], r["proto"]) for r in big} == {("ring", "Simple")}  # NCCL's pick
    small = [r for r in rows if r["size"] == 1 << 10]
    assert {r["proto"] for r in small} == {"LL"}
    assert "busbw" in collectives.table(rows)


def test_measured_on_local_ranks(tmp_path):
    settings = MeasureSettings(scale="smoke", max_elements=1 << 12, world_size=2, warmup=1,
                               repeats=2, csv_path=tmp_path / "results.csv",
                               kernels_dir=tmp_path / "kernels")
    rows = collectives.measure(settings)
    assert len(rows) == 3 * 2  # 1 KiB and 16 KiB
    assert all(r["verified"] and r["busbw_gbps"] > 0 for r in rows)
