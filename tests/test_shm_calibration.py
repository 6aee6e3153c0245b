"""comm=shm's calibrated topology: `fit_shm` recovers the shared-memory links that made a set of
measurements (pure), and with comm=shm a run predicts with topology_shm.yaml, calibrating (with
comm=shm) when the cached calibration lacks it."""

import dataclasses
import hashlib
import json
from types import SimpleNamespace as N

import pytest

import experiments
from codegen.lower import lower
from cost_model.topology import LinkClass, load_topology
from cost_model.workload import simulate
from experiments import MeasureSettings, PredictSettings, adam_fusion
from experiments.calibration import cache as calibration
from experiments.calibration.cache import fingerprint, key_of, local_calibration
from experiments.calibration.fit import Measurement, fit, fit_shm, predict_ms
from tests.test_calibrate import synthetic, truth


def shm_truth(base):
    link = LinkClass(
        bandwidth_gbps=9.0,
        latency_us=150.0,
        rate_by="transfer",
        efficiency={1 << 20: 0.7, 1 << 23: 1.0, 1 << 25: 1.0, 1 << 27: 0.6},
    )
    lib = LinkClass(
        bandwidth_gbps=7.0,
        latency_us=250.0,
        rate_by="transfer",
        efficiency={1 << 20: 0.6, 1 << 23: 1.0, 1 << 25: 1.0, 1 << 27: 0.5},
    )
    return dataclasses.replace(base, library=lib, intra=dataclasses.replace(base.intra, link=link))


def test_fit_shm_recovers_the_shared_memory_links():
    gloo = truth()
    t = shm_truth(gloo)
    shm = [
        Measurement(f"shm_{k}", 1 << e, 0.0, 2)
        for e in range(12, 28)
        for k in ("all_reduce", "reduce_scatter", "all_gather")
    ]
    shm = [
        dataclasses.replace(m, time_ms=predict_ms(t, dataclasses.replace(m, kind=m.kind[4:])))
        for m in shm
    ]
    ms = synthetic(gloo) + shm
    one_way = LinkClass(bandwidth_gbps=1.0, latency_us=100.0)  # gloo's send: not shm's P2P
    fitted = dataclasses.replace(
        fit(ms, load_topology("local"), 2), alone_scale=0.9, p2p_link=one_way, lone_p2p_link=one_way
    )
    got = fit_shm(ms, fitted, 2)
    assert got.device == fitted.device and got.compute_slowdown == fitted.compute_slowdown
    assert got.alone_scale == 1.0  # gloo's, not measured for shared memory
    assert got.p2p_link is None and got.lone_p2p_link is None  # shm's P2P: its ring link
    assert got.library.bandwidth_gbps == pytest.approx(7.0, rel=0.03)
    assert got.intra.link.bandwidth_gbps == pytest.approx(9.0, rel=0.03)
    assert got.library.latency_us == pytest.approx(250.0, rel=0.1)
    for m in shm:  # and predicts them back (predict_ms reads shm_* kinds on fit_shm's topology)
        assert predict_ms(got, m) == pytest.approx(m.time_ms, rel=0.1), m
    with pytest.raises(ValueError, match="no shm_"):
        fit_shm(synthetic(gloo), fitted, 2)
    assert got.peer_reads and not fitted.peer_reads  # at the device's (fitted) streaming rate


@pytest.mark.slow
def test_the_fused_step_streams_at_the_concurrent_rate_not_the_lone_sweeps():
    """The peer reads stream at the device's stream_memory_gbps, kernel_stream's rate (every
    rank at once, beyond the caches), not the kernel sweep's best (cached) one, and the fused
    step's prediction follows it: at a fifth of the rate its memory traffic takes about five
    times as long."""
    gloo = truth()
    t = shm_truth(gloo)
    shm = [
        Measurement(f"shm_{k}", 1 << e, 0.0, 2)
        for e in range(12, 28, 3)
        for k in ("all_reduce", "reduce_scatter", "all_gather")
    ]
    shm = [
        dataclasses.replace(m, time_ms=predict_ms(t, dataclasses.replace(m, kind=m.kind[4:])))
        for m in shm
    ]
    launch = fit(synthetic(gloo), load_topology("local"), 2).device.launch_us
    stream = [
        Measurement("kernel_stream", 28 << e, (launch + (28 << e) / 4e3) / 1e3, 2)
        for e in (18, 19, 20, 21, 22)
    ]  # 4 GB/s per rank
    fitted = fit(synthetic(gloo) + stream, load_topology("local"), 2)
    got = fit_shm(synthetic(gloo) + shm + stream, fitted, 2)
    rate = got.device.stream_memory_gbps
    assert rate == pytest.approx(4.0, rel=1e-3)
    assert got.device.memory_bandwidth_gbps > 2 * rate  # the sweep's best
    for m in stream:
        assert predict_ms(got, m) == pytest.approx(m.time_ms, rel=1e-6)
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 1 << 24}, 2)
    fast = simulate(
        plan,
        dataclasses.replace(got, device=dataclasses.replace(got.device, stream_memory_gbps=20.0)),
    ).time_us
    slow = simulate(plan, got).time_us
    assert 3.5 < (slow - got.step_overhead_us) / (fast - got.step_overhead_us) < 5.5


def _cfg(comm):
    return N(
        calibration="auto",
        topology=N(path=None, name="local"),
        backend=N(name="cpu", comm=comm),
        keep_awake=True,
        calibration_pool=8,
    )


def _write_cache(folder, created: str, *files: str) -> None:
    """A cached calibration as `experiments.calibration.cache` writes it: the topology files (the shipped
    local topology's text) and a fingerprint.json naming their checksums."""
    text = (calibration.PACKAGES_ROOT / "suite" / "conf" / "topology" / "local.yaml").read_bytes()
    for name in files:
        (folder / name).write_bytes(text)
    sums = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.glob("topology*.yaml"))
    }
    (folder / "fingerprint.json").write_text(
        json.dumps({"created": created, "schema": calibration.SCHEMA, "checksums": sums})
    )


def test_comm_shm_predicts_with_the_shm_topology_calibrating_it_when_missing(tmp_path, monkeypatch):
    adam = experiments.get("adam_fusion")
    where = tmp_path / key_of(fingerprint())
    where.mkdir()
    _write_cache(where, "then", "topology.yaml")  # a calibration made without comm=shm
    asked = []

    def calibrate(folder, fp, world, comm=None, history=None, pool=1):
        asked.append(comm)
        assert history.parent == tmp_path / "history" and pool == 8
        _write_cache(folder, "now", "topology_shm.yaml")

    monkeypatch.setattr(calibration, "_calibrate", calibrate)
    assert local_calibration(_cfg("ring"), adam, 2, cache=tmp_path).path == where / "topology.yaml"
    assert asked == []
    found = local_calibration(_cfg("shm"), adam, 2, cache=tmp_path)
    assert asked == ["shm"] and found.fresh and found.path == where / "topology_shm.yaml"
    assert found.gloo_path == where / "topology.yaml"  # the gloo baseline is predicted on it
    assert local_calibration(_cfg("ring"), adam, 2, cache=tmp_path).gloo_path is None
    again = local_calibration(_cfg("shm"), adam, 2, cache=tmp_path)
    assert asked == ["shm"] and not again.fresh and again.gloo_path == where / "topology.yaml"


@pytest.mark.slow
def test_calibrate_with_comm_shm_writes_the_shm_topology(tmp_path):
    exp = experiments.get("calibrate")
    settings = MeasureSettings(
        scale="smoke",
        max_elements=1 << 16,
        world_size=2,
        warmup=1,
        repeats=3,
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
        comm="shm",
    )
    rows = exp.measure(settings)
    kinds = {r["schedule"] for r in rows}
    assert {
        "shm_all_reduce",
        "shm_reduce_scatter",
        "shm_all_gather",
        "all_reduce",
        "kernel_stream",
    } <= kinds
    gloo = load_topology(path=tmp_path / "topology.yaml")
    shm = load_topology(path=tmp_path / "topology_shm.yaml")
    assert shm.device == gloo.device and "comm=shm" in shm.source
    assert shm.library != gloo.library
    assert shm.peer_reads and not gloo.peer_reads and shm.device.stream_memory_gbps > 0
    pred = exp.predict(
        PredictSettings(
            scale="smoke",
            backend="cpu",
            topology=gloo,
            world_size=2,
            max_elements=1 << 16,
            measured=rows,
            out_dir=tmp_path,
        )
    )
    assert len(pred) == len(rows) and all(r["time_ms"] > 0 for r in pred)


def test_comm_shm_predicts_the_gloo_baseline_on_the_gloo_topology_and_speedups_over_it():
    """Given the gloo topology, `predict` adds the library baseline on it (its computation the
    measured gloo baseline's) and every row's speedup_gloo over it; `predictions` does so only
    where the run measured that baseline and was given that topology (calibration=off: none)."""
    gloo = truth()
    shm = shm_truth(gloo)
    n, shape = 1 << 22, f"[{1 << 22}]"
    rows = {
        r["schedule"]: r
        for r in experiments.predict.predict(
            adam_fusion.EXPERIMENT,
            shm,
            [{"N": n}],
            2,
            baseline_compute_ms={shape: 5.0},
            gloo=gloo,
            gloo_compute_ms={shape: 7.0},
        )
    }
    plan = lower(adam_fusion.EXPERIMENT.program(), {"N": n}, 2)
    on_gloo = simulate(plan, gloo, compute_us=experiments.predict.library_compute_us(plan, 7.0))
    g = rows["baseline(gloo)"]
    assert g["time_ms"] == pytest.approx(on_gloo.time_ms, rel=1e-5)
    assert g["compute_ms"] == pytest.approx(7.0, rel=1e-5) and g["speedup_gloo"] == 1.0
    assert g["speedup"] == pytest.approx(rows["baseline"]["time_ms"] / g["time_ms"], rel=1e-3)
    assert g["time_ms"] != pytest.approx(rows["baseline"]["time_ms"], rel=1e-2)
    for name, r in rows.items():
        assert r["speedup_gloo"] == pytest.approx(g["time_ms"] / r["time_ms"], rel=1e-3), name
    plain = experiments.predict.predict(adam_fusion.EXPERIMENT, shm, [{"N": n}], 2)
    assert "baseline(gloo)" not in {r["schedule"] for r in plain}
    assert not any("speedup_gloo" in r for r in plain)
    measured = [
        {
            "source": "measured",
            "schedule": s,
            "world_size": 2,
            "size": n,
            "shape": shape,
            "compute_ms": ms,
        }
        for s, ms in (("baseline", 5.0), ("baseline(gloo)", 7.0))
    ]
    settings = PredictSettings(
        scale="smoke",
        backend="cpu",
        topology=shm,
        world_size=2,
        max_elements=n,
        measured=measured,
        out_dir=None,
        schedules={},
        gloo_topology=gloo,
    )
    got = {
        r["schedule"]: r
        for r in experiments.predict.predictions(adam_fusion.EXPERIMENT, settings)
        if r["source"] == "predicted" and r["topology"] == shm.name
    }
    assert got["baseline(gloo)"]["time_ms"] == g["time_ms"]
    off = dataclasses.replace(settings, gloo_topology=None)
    assert "baseline(gloo)" not in {
        r["schedule"] for r in experiments.predict.predictions(adam_fusion.EXPERIMENT, off)
    }
