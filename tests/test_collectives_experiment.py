"""The collectives experiment: nccl-tests rows predicted on any topology, measured on 2 ranks."""

from __future__ import annotations

import dataclasses

import pytest

from cost_model.topology import load_topology
from experiments import MeasureSettings, PredictSettings, collectives
from experiments.rounds import out_of_time


def test_predicted_rows_follow_nccl_tests_conventions():
    topo = load_topology("dgx_a100")
    rows = collectives.predict_rows(topo, 8, "smoke")
    assert {r["schedule"] for r in rows} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert [r["size"] for r in rows if r["schedule"] == "all_reduce"] == [
        1 << k for k in range(10, 31, 4)
    ]
    for r in rows:
        algbw = r["size"] / (r["time_ms"] * 1e-3) / 1e9
        factor = 2 * 7 / 8 if r["schedule"] == "all_reduce" else 7 / 8
        assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-3, abs=1e-4)  # 4 decimals
        assert r["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-3, abs=1e-4)
    big = [r for r in rows if r["size"] == 1 << 30]
    assert all(150 < r["busbw_gbps"] < 300 for r in big)  # NVSwitch: 300 GB/s per direction
    assert {(r["algo"], r["proto"]) for r in big} == {("ring", "Simple")}  # NCCL's pick
    small = [r for r in rows if r["size"] == 1 << 10]
    assert {r["proto"] for r in small} == {"LL"}
    assert "busbw" in collectives.table(rows)


def test_a_calibrated_topology_predicts_lone_collectives_with_its_median_links():
    """The rows are a lone call's median: `Topology.lone`'s links (fitted at the medians), not
    the links fitted at the means that steps are predicted with."""
    local = load_topology("local")
    slow = dataclasses.replace(local.intra.link, bandwidth_gbps=local.intra.link.bandwidth_gbps / 4)
    lib = dataclasses.replace(local.library, bandwidth_gbps=local.library.bandwidth_gbps / 4)
    means = dataclasses.replace(
        local,
        intra=dataclasses.replace(local.intra, link=slow),
        library=lib,
        lone_link=local.intra.link,
        lone_library=local.library,
    )
    times = lambda t: [r["time_ms"] for r in collectives.predict_rows(t, 2, "smoke")]  # noqa: E731
    assert times(means) == times(local)
    stripped = dataclasses.replace(means, lone_link=None, lone_library=None)  # steps' links
    big = [(a, b) for a, b in zip(times(stripped), times(local)) if b > 1.0]
    assert big and all(a > 2 * b for a, b in big)


def test_a_calibrated_topology_predicts_the_sweep_times_its_alone_scale():
    """The sweep times collectives among collectives only, the links are fitted among
    calibration's other benchmarks: its rows are the lone call's time x `alone_scale` (1 on the
    shipped topologies, which leaves them as they were)."""
    local = load_topology("local")
    assert local.alone_scale == 1.0 and load_topology("dgx_a100").alone_scale == 1.0
    times = lambda t: [r["time_ms"] for r in collectives.predict_rows(t, 2, "smoke")]  # noqa: E731
    scaled = times(dataclasses.replace(local, alone_scale=0.9))
    assert scaled == pytest.approx([0.9 * t for t in times(local)], rel=1e-4, abs=1e-6)


def test_gpu_measurements_are_not_predicted_on_the_cpu_topology(tmp_path):
    """backend=cuda measured NCCL on a GPU: the local topology (CPU ranks) does not predict
    it (on an H200 it did: 68.5% 'time error' against a model of this machine's gloo)."""
    settings = lambda backend: PredictSettings(  # noqa: E731
        scale="smoke",
        backend=backend,
        topology=load_topology("local"),
        world_size=2,
        max_elements=1 << 12,
        measured=[],
        out_dir=tmp_path,
    )
    assert collectives.predict(settings("cuda")) == []
    assert {r["topology"] for r in collectives.predict(settings("cpu"))} == {"local"}


@pytest.mark.slow
def test_measured_on_local_ranks(tmp_path):
    settings = MeasureSettings(
        scale="smoke",
        max_elements=1 << 12,
        world_size=2,
        warmup=1,
        repeats=2,
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
    )
    rows = collectives.measure(settings)
    assert len(rows) == 3 * 2  # 1 KiB and 16 KiB
    assert all(r["verified"] and r["busbw_gbps"] > 0 for r in rows)


@pytest.mark.slow
def test_shm_and_gloo_interleaved_in_one_run(tmp_path):
    """comm=shm: every (collective, size) timed on gloo and on shared memory in the same rounds;
    the shm row's speedup is over gloo, paired per round, with its interval."""
    settings = MeasureSettings(
        scale="smoke",
        max_elements=1 << 12,
        world_size=2,
        warmup=1,
        repeats=2,
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
        comm="shm",
        min_rounds=3,
        max_rounds=5,
        point_budget_s=2.0,
    )
    rows = collectives.measure(settings)
    assert len(rows) == 3 * 2 * 2  # 3 collectives x (1 KiB, 16 KiB) x (gloo, shm)
    by = {(r["schedule"], r["size"], r["comm"]): r for r in rows}
    for kind in collectives.KINDS:
        for b in (1 << 10, 1 << 14):
            gloo, shm = by[(kind, b, "gloo")], by[(kind, b, "shm")]
            assert gloo["verified"] and shm["verified"]
            assert gloo["rounds"] == shm["rounds"] >= 3  # the same rounds
            assert gloo["speedup"] == 1.0
            assert shm["speedup_lo"] <= shm["speedup"] <= shm["speedup_hi"]
            assert shm["time_ms_lo"] <= shm["time_ms"] <= shm["time_ms_hi"]
    assert "measured/shm" in collectives.table(rows) and "measured/gloo" in collectives.table(rows)


def test_comm_shm_predicts_both_transports(tmp_path):
    """With comm=shm the run measured gloo and shared memory side by side: each is predicted on
    its own topology (the shm one the run's, gloo's the same calibration's), rows naming it."""
    from pathlib import Path

    from experiments import PredictSettings

    data = Path(__file__).resolve().parents[1] / "cost_model" / "data"
    shm, gloo = load_topology(path=data / "local_shm.yaml"), load_topology("local")
    settings = PredictSettings(
        scale="smoke",
        backend="cpu",
        topology=shm,
        world_size=2,
        max_elements=1 << 12,
        measured=[],
        out_dir=tmp_path,
        gloo_topology=gloo,
    )
    rows = collectives.predict(settings)
    by = {(r["schedule"], r["size"], r["comm"]): r for r in rows}
    assert len(by) == len(rows) == 3 * 2 * 2
    for kind in collectives.KINDS:
        alone = {
            r["size"]: r["time_ms"]
            for r in collectives.predict_rows(gloo, 2, "smoke", 1 << 14)
            if r["schedule"] == kind
        }
        for b in (1 << 10, 1 << 14):
            assert by[(kind, b, "gloo")]["time_ms"] == alone[b]
            assert by[(kind, b, "shm")]["time_ms"] != by[(kind, b, "gloo")]["time_ms"]
    without = collectives.predict(
        PredictSettings(
            scale="smoke",
            backend="cpu",
            topology=gloo,
            world_size=2,
            max_elements=1 << 12,
            measured=[],
            out_dir=tmp_path,
        )
    )
    assert len(without) == 3 * 2 and all("comm" not in r for r in without)
    # topology.path=FILE with comm=shm predicts no gloo rows: shm's still say they are shm's
    alone = collectives.predict(
        PredictSettings(
            scale="smoke",
            backend="cpu",
            topology=shm,
            world_size=2,
            max_elements=1 << 12,
            measured=[],
            out_dir=tmp_path,
        )
    )
    assert len(alone) == 3 * 2 and all(r["comm"] == "shm" for r in alone)


def test_a_measured_sweep_in_one_set_of_rounds_gets_the_long_step_extension(tmp_path):
    """One transport times the whole sweep in one set of rounds, whose rounds are long (every
    size up to 128 MiB): past budget_s it goes on to long_rounds, as a long step's point does.
    Several transports (comm=shm) time each point in its own short rounds: no extension."""
    s = MeasureSettings(
        scale="default",
        max_elements=1 << 25,
        world_size=2,
        warmup=1,
        repeats=5,
        csv_path=tmp_path / "r.csv",
        kernels_dir=tmp_path,
        min_rounds=10,
        max_rounds=400,
        point_budget_s=25.0,
        long_rounds=80,
        long_budget_s=90.0,
    )
    one = collectives.sweep_budget(s, 1)
    assert (one.budget_s, one.long_rounds, one.long_budget_s) == (25.0, 80, 90.0)
    assert not out_of_time(30.0, 15, one) and out_of_time(91.0, 60, one)
    assert out_of_time(30.0, 80, one)  # enough rounds: the budget holds
    shm = collectives.sweep_budget(s, 2)
    assert (shm.budget_s, shm.long_rounds, shm.long_budget_s) == (
        collectives.POINT_BUDGET_S,
        0,
        0.0,
    )
    assert out_of_time(collectives.POINT_BUDGET_S + 1, 3, shm)
