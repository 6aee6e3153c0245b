"""Calibration: the fit recovers a known topology from its own predictions (pure), and the
calibrate experiment runs its microbenchmarks on 2 gloo ranks and writes a loadable topology."""

from __future__ import annotations

import dataclasses
import json

import pytest

import experiments
from cost_model.topology import LinkClass, load_topology
from experiments import MeasureSettings, PredictSettings
from experiments.calibration.fit import Measurement, fit, predict_ms


def truth():
    base = load_topology("local")
    link = LinkClass(
        bandwidth_gbps=2.0,
        latency_us=300.0,
        overhead_us=40.0,
        rate_by="transfer",
        efficiency={1 << 16: 0.5, 1 << 22: 0.8, 1 << 27: 1.0},
    )
    lib = LinkClass(
        bandwidth_gbps=1.5,
        latency_us=500.0,
        rate_by="transfer",
        efficiency={1 << 20: 0.6, 1 << 26: 1.0},
    )
    device = dataclasses.replace(
        base.device,
        memory_bandwidth_gbps=20.0,
        launch_us=30.0,
        memory_efficiency={},
        matmul_efficiency=1.0,
        peak_tflops={**base.device.peak_tflops, "f32": 0.05},
    )
    return dataclasses.replace(
        base,
        device=device,
        library=lib,
        compute_slowdown=0.3,
        comm_slowdown=0.2,
        wake_us=3000.0,
        intra=dataclasses.replace(base.intra, link=link),
    )


def synthetic(topo, P=2) -> list[Measurement]:
    ms = []
    for k in range(12, 28):
        b = 1 << k
        for kind in ("exchange", "all_reduce", "kernel"):
            ms.append(Measurement(kind, b, 0.0, P))
        if b >= 1 << 16:
            ms.append(Measurement("exchange_chunked", b, 0.0, P, chunks=16))
        if 1 << 23 <= b <= 1 << 26:
            ms += [Measurement(k, b, 0.0, P, chunks=4) for k in ("exchange_first", "exchange_last")]
    ms.append(Measurement("matmul", 3 * 512 * 512 * 4, 0.0, P, flops=2 * 512**3))
    E, K = 1 << 26, 28 << 22
    ms += [
        Measurement("overlap_kernel", K, 0.0, P),
        Measurement("overlap_exchange", E, 0.0, P),
        Measurement("overlap_inside", K, 0.0, P, exchange_bytes=E, kernel_bytes=K),
        Measurement("overlap_both", K, 0.0, P, exchange_bytes=E, kernel_bytes=K),
    ]
    return [dataclasses.replace(m, time_ms=predict_ms(topo, m)) for m in ms]


def _adds_and_copies(w: float, sizes, launch_us: float = 5.0) -> list[Measurement]:
    """torch's in-place add (2b read, b written in place) and copy (b read, b written fresh: 3b
    on a write-allocate device) of b bytes at 10 GB/s a counted byte, an in-place byte weighing w."""
    at = lambda kind, b, units: Measurement(kind, b, (launch_us + units * b / 1e4) / 1e3, 2)  # noqa
    return [m for b in sizes for m in (at("add", b, 2 + w), at("copy", b, 3))]


@pytest.mark.slow
def test_the_fit_reads_the_in_place_write_weight_from_adds_and_copies():
    """copy / add = 3 / (2 + w) at the sizes whose traffic streams from memory; cache-resident
    sizes (here with w = 1: their writes cost nothing extra) do not count; 1 without such sizes,
    or on a device that does not allocate on write; within [0, 1]."""
    from experiments.calibration.fit import STREAM_FROM, inplace_write_weight

    big = [1 << k for k in range(25, 28)]
    assert all(3 * b >= STREAM_FROM for b in big)
    small = [1 << k for k in range(12, 20)]
    ms = _adds_and_copies(0.45, big) + _adds_and_copies(1.0, small)
    assert inplace_write_weight(ms, True) == pytest.approx(0.45, abs=0.01)
    assert inplace_write_weight(ms, False) == 1.0
    assert inplace_write_weight(_adds_and_copies(0.45, small), True) == 1.0
    assert inplace_write_weight(_adds_and_copies(-0.5, big), True) == 0.0
    assert inplace_write_weight(_adds_and_copies(1.6, big), True) == 1.0
    got = fit(synthetic(truth()) + ms, load_topology("local"), 2)
    assert got.device.inplace_write_weight == pytest.approx(0.45, abs=0.01)
    assert fit(synthetic(truth()), load_topology("local"), 2).device.inplace_write_weight == 1.0


@pytest.mark.slow
def test_the_fit_reads_how_much_faster_collectives_run_among_collectives_only():
    """alone_scale: the geometric mean of alone_<kind> over <kind> at the same size and ranks;
    an alone_<kind> without its pair does not count; 1 without any; within ALONE_RANGE; the
    full fit carries it, and the model's time for an alone_<kind> is its kind's times the
    scale (comm=shm's topology keeps 1: tests/test_shm_calibration.py)."""
    from experiments.calibration.fit import ALONE_RANGE, alone_scale

    among = [
        Measurement(k, b, t, 2)
        for k, t in (("all_reduce", 4.0), ("reduce_scatter", 2.0))
        for b in (1 << 20, 1 << 22)
    ]
    ratios = {
        ("all_reduce", 1 << 20): 0.8,
        ("all_reduce", 1 << 22): 0.9,
        ("reduce_scatter", 1 << 20): 1.0,
        ("reduce_scatter", 1 << 22): 0.95,
    }
    alone = [
        Measurement("alone_" + m.kind, m.nbytes, m.time_ms * ratios[(m.kind, m.nbytes)], 2)
        for m in among
    ]
    unpaired = [
        Measurement("alone_all_gather", 1 << 20, 0.1, 2),  # no all_gather measured
        Measurement("alone_all_reduce", 1 << 20, 0.1, 4),
    ]  # nor at 4 ranks
    want = (0.8 * 0.9 * 1.0 * 0.95) ** 0.25
    assert alone_scale(among + alone + unpaired) == pytest.approx(want, abs=1e-4)
    assert alone_scale(among) == 1.0
    slow = [dataclasses.replace(m, time_ms=m.time_ms * 5) for m in alone]
    assert alone_scale(among + slow) == ALONE_RANGE[1]
    base = synthetic(truth())
    paired = [
        dataclasses.replace(m, kind="alone_" + m.kind, time_ms=0.9 * m.time_ms)
        for m in base
        if m.kind in ("all_reduce", "reduce_scatter", "all_gather")
    ]
    got = fit(base + paired, load_topology("local"), 2)
    assert got.alone_scale == pytest.approx(0.9, abs=1e-3)
    assert fit(base, load_topology("local"), 2).alone_scale == 1.0
    m = paired[0]
    plain = dataclasses.replace(m, kind=m.kind.removeprefix("alone_"))
    assert predict_ms(got, m) == pytest.approx(0.9 * predict_ms(got, plain), rel=1e-3)


@pytest.mark.slow
def test_the_fit_recovers_the_topology_that_made_the_measurements():
    t = truth()
    got = fit(synthetic(t), load_topology("local"), 2)
    link = got.intra.link
    assert link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)
    assert link.overhead_us == pytest.approx(40.0, rel=0.15)  # wire hides a little
    assert link.latency_us == pytest.approx(300.0, rel=0.1)
    assert link.rate_by == "transfer"
    for size, eff in ((1 << 22, 0.8), (1 << 25, t.intra.link.eff(1 << 25))):
        assert link.eff(size) == pytest.approx(eff, abs=0.04)
    assert got.library.bandwidth_gbps == pytest.approx(1.5, rel=0.02)
    assert got.library.latency_us == pytest.approx(500.0, rel=0.1)
    assert got.library.eff(1 << 23) == pytest.approx(t.library.eff(1 << 23), abs=0.04)
    assert got.device.memory_bandwidth_gbps == pytest.approx(20.0, rel=0.02)
    assert got.device.launch_us == pytest.approx(30.0, rel=0.02)
    assert got.device.peak("f32") == pytest.approx(0.05, rel=0.02)
    assert got.compute_slowdown == pytest.approx(0.3, abs=0.02)
    assert got.comm_slowdown == pytest.approx(0.2, abs=0.03)
    assert got.wake_us == pytest.approx(3000.0, rel=0.1)
    for m in synthetic(t):  # and predicts them back, the chunked exchange too
        assert predict_ms(got, m) == pytest.approx(m.time_ms, rel=0.1), m


@pytest.mark.slow
def test_communication_is_fitted_at_its_means_and_the_rest_at_its_medians():
    """Medians made by one topology, means by another whose links are slower and whose memory
    is faster: the fit takes the links from the means, the device from the medians, keeps the
    medians' links for lone calls (`Topology.lone`), and fits a calibration without means (an
    old calibration.json) at its medians."""
    t = truth()
    slow = dataclasses.replace(
        t,
        intra=dataclasses.replace(
            t.intra, link=dataclasses.replace(t.intra.link, bandwidth_gbps=1.0)
        ),
        library=dataclasses.replace(t.library, bandwidth_gbps=0.75),
        device=dataclasses.replace(t.device, memory_bandwidth_gbps=40.0),
    )
    ms = [dataclasses.replace(m, time_ms_mean=predict_ms(slow, m)) for m in synthetic(t)]
    got = fit(ms, load_topology("local"), 2)
    assert got.intra.link.bandwidth_gbps == pytest.approx(1.0, rel=0.02)
    assert got.library.bandwidth_gbps == pytest.approx(0.75, rel=0.02)
    assert got.device.memory_bandwidth_gbps == pytest.approx(20.0, rel=0.02)
    lone = got.lone()  # a lone call's median: the links fitted at the medians
    assert lone.intra.link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)
    assert lone.library.bandwidth_gbps == pytest.approx(1.5, rel=0.02)
    assert lone.device == got.device and lone.lone() == lone
    old = fit([dataclasses.replace(m, time_ms_mean=None) for m in ms], load_topology("local"), 2)
    assert old.intra.link.bandwidth_gbps == pytest.approx(2.0, rel=0.02)


@pytest.mark.slow
def test_a_wake_longer_than_every_exchange_is_fitted_as_its_lower_bound():
    """`wake_us`: where the first chunk's wait ends with the whole exchange at every size, the
    fit keeps the largest lower bound it has (above 0, below the truth); without the kinds, the
    base topology's (0: a thread runs at once)."""
    t = dataclasses.replace(truth(), wake_us=1e6)
    got = fit(synthetic(t), load_topology("local"), 2)
    assert 0.0 < got.wake_us < 1e6
    waits = [m for m in synthetic(t) if m.kind == "exchange_first"]
    assert max(m.time_ms for m in waits) * 1e3 > got.wake_us
    plain = [
        m
        for m in synthetic(truth())
        if not m.kind.startswith("exchange_") or m.kind in ("exchange", "exchange_chunked")
    ]
    assert fit(plain, load_topology("local"), 2).wake_us == 0.0


def test_chunks_of_one_transfer_go_at_the_transfers_rate():
    """`rate_by: transfer`: C chunks cost what the whole message costs plus their posts (as the
    CPU runtime measures); `message`: each chunk at its own (lower) efficiency, so more."""
    t = truth()
    whole, chunked = (
        Measurement("exchange", 1 << 24, 0.0, 2),
        Measurement("exchange_chunked", 1 << 24, 0.0, 2, chunks=16),
    )
    posts = 15 * t.intra.link.overhead_us / 1e3
    by_transfer = predict_ms(t, chunked)
    assert predict_ms(t, whole) < by_transfer <= predict_ms(t, whole) + posts + 0.3
    own = dataclasses.replace(
        t,
        intra=dataclasses.replace(
            t.intra, link=dataclasses.replace(t.intra.link, rate_by="message")
        ),
    )
    assert predict_ms(own, chunked) > 1.2 * by_transfer


def test_a_short_noisy_kernel_sweep_still_fits_a_bandwidth():
    """smoke's four kernel sizes, the largest barely above the fixed cost: the fixed cost comes
    from the smaller half and the bandwidth from what is left (it failed once in CI)."""
    from experiments.calibration.fit import fit_device

    base = load_topology("local").device
    times = {1 << 12: 0.012, 1 << 15: 0.011, 1 << 18: 0.014, 1 << 21: 0.016}  # ms
    got = fit_device([Measurement("kernel", b, t, 2) for b, t in times.items()], base)
    assert got.launch_us < 12.0 and got.memory_bandwidth_gbps > 0


@pytest.mark.slow
def test_calibrate_runs_on_local_ranks_and_writes_a_topology(tmp_path):
    exp = experiments.get("calibrate")
    settings = MeasureSettings(
        scale="smoke",
        max_elements=1 << 16,
        world_size=2,
        warmup=1,
        repeats=3,
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
    )
    rows = exp.measure(settings)
    kinds = {r["schedule"] for r in rows}
    assert {"exchange", "all_reduce", "kernel", "matmul", "overlap_both", "library_adam"} <= kinds
    # the collectives again, in rounds of their own, at the same sizes as among the others
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        alone = {r["size"] for r in rows if r["schedule"] == "alone_" + kind}
        assert alone and alone <= {r["size"] for r in rows if r["schedule"] == kind}
    topo = load_topology(path=tmp_path / "topology.yaml")
    # the baselines' optimizer steps, timed alone: the curves a run's memory scale reads
    assert set(topo.device.library_steps_us) == {"adam"}
    assert all(t > 0 for c in topo.device.library_steps_us.values() for t in c.values())
    assert topo.name == "local" and topo.intra.kind == "bus"
    assert "calibrated" in topo.source
    raw = json.loads((tmp_path / "calibration.json").read_text())
    assert all(m["time_ms_min"] <= m["time_ms_mean"] <= m["time_ms_max"] for m in raw)
    overlap = {m["kind"]: m for m in raw if m["kind"].startswith("overlap_")}
    assert overlap["overlap_exchange"]["nbytes"] == overlap["overlap_both"]["exchange_bytes"]
    assert overlap["overlap_kernel"]["nbytes"] == overlap["overlap_both"]["kernel_bytes"]
    pred = exp.predict(
        PredictSettings(
            scale="smoke",
            backend="cpu",
            topology=topo,
            world_size=2,
            max_elements=1 << 16,
            measured=rows,
            out_dir=tmp_path,
        )
    )
    assert len(pred) == len(rows) and all(r["source"] == "predicted" for r in pred)


@pytest.mark.slow
def test_the_matmul_rate_is_fitted_by_size_from_the_medians():
    """A CPU's matmul is faster where its operands fit the caches: the fit keeps the rate by
    flops (each size's median; the best is the peak), so the model times each size as measured
    (the best rate alone made the large matmuls of model_parallel 2x too fast)."""
    base = load_topology("local")
    rates = {1 << 27: 0.09, 1 << 29: 0.07, 1 << 31: 0.05, 1 << 33: 0.05}  # TFLOP/s by flops
    ms = [
        Measurement("matmul", 1 << 20, f / (r * 1e9) * noise, 2, flops=f)
        for f, r in rates.items()
        for noise in (0.9, 1.0, 1.6)
    ]  # median: the 1.0
    others = [m for m in synthetic(truth()) if m.kind != "matmul"]
    dev = fit(others + ms, base, 2).device
    assert dev.peak("f32") == pytest.approx(0.09, rel=1e-3)
    for f, r in rates.items():
        assert dev.matmul_us(1 << 20, f, "f32") - dev.launch_us == pytest.approx(
            f / (r * 1e6), rel=0.01
        )
    assert dev.matmul_us(1 << 20, 1 << 30, "f32") > dev.matmul_us(1 << 20, 1 << 29, "f32") * 2


@pytest.mark.slow
def test_a_stalled_small_size_bends_neither_the_latency_nor_the_link_curve():
    """A share of gloo's two-way exchanges stalls for a 4 ms scheduler tick; a size whose
    measurement caught it (here 8 KiB of the exchange, 16 KiB of the reduce-scatter: +4 ms) is
    slower than larger sizes. The fit takes each link benchmark's times non-decreasing in size,
    so the link it fits still predicts the clean times, and larger is never faster (a 4 KiB
    reduce-scatter predicted 5x its measurement, and 5x the 8 KiB one, when it did not)."""
    t = truth()
    clean = synthetic(t) + [
        dataclasses.replace(m, time_ms=predict_ms(t, m))
        for m in (
            Measurement(kind, 1 << k, 0.0, 2)
            for kind in ("reduce_scatter", "all_gather")
            for k in range(12, 28)
        )
    ]
    stalled = {("exchange", 1 << 13), ("reduce_scatter", 1 << 14), ("all_reduce", 1 << 12)}
    ms = [
        dataclasses.replace(m, time_ms=m.time_ms + 4.0) if (m.kind, m.nbytes) in stalled else m
        for m in clean
    ]
    got = fit(ms, load_topology("local"), 2)
    assert got.intra.link.latency_us == pytest.approx(300.0, rel=0.15)
    assert got.library.latency_us == pytest.approx(500.0, rel=0.15)
    for m in clean:
        if m.kind in ("exchange", "reduce_scatter", "all_gather", "all_reduce"):
            assert predict_ms(got, m) == pytest.approx(m.time_ms, rel=0.2), m
    for kind in ("reduce_scatter", "all_gather", "all_reduce"):
        times = [predict_ms(got, Measurement(kind, 1 << k, 0.0, 2)) for k in range(10, 28)]
        assert times == sorted(times), kind


def test_a_stall_between_clean_sizes_is_interpolated_not_pooled_into_them():
    """One size far slower than the next larger one (gloo's 512 KiB all-reduce at 2.2 ms in
    most rounds, between 0.44 and 0.78 ms) is a stall: it takes its neighbours' log-log
    interpolation, and they keep their own times (pooled at the block's median, 512 KiB to
    2 MiB all read 1.4 ms); an inversion within 25% (noise in a flat run) is pooled."""
    from cost_model.curves import monotone

    sizes = [1 << k for k in range(16, 22)]
    stalled = dict(zip(sizes, (0.35, 0.44, 0.44, 2.2, 0.78, 1.42)))
    got = dict(monotone(sorted(stalled.items())))
    assert got[1 << 19] == pytest.approx(0.44**0.5 * 0.78**0.5, rel=1e-9)
    assert {b: got[b] for b in sizes if b != 1 << 19} == {
        b: t for b, t in stalled.items() if b != 1 << 19
    }
    noisy = dict(zip(sizes, (0.30, 0.33, 0.31, 0.32, 0.78, 1.42)))
    got = dict(monotone(sorted(noisy.items())))
    assert got[1 << 17] == got[1 << 18] == pytest.approx(0.32)  # pooled: 0.33, 0.31 -> 0.32
    assert list(got.values()) == sorted(got.values())


def _calls_per_sample(rank, world):
    from experiments.benches import Bench
    from experiments.calibration.measure import interleaved

    seen = {"x": [], "y": []}

    def bench(kind, **kw):
        def sample(calls):
            seen[kind].append(calls)
            return (6.0,)  # ms a call: long enough for one call a sample by itself

        return Bench((kind,), 4, sample, **kw)

    interleaved([bench("x", min_calls=5), bench("y")], rounds=3, warmup=1, rank=1)
    return seen


def _long_bench(rank, world):
    from experiments.benches import Bench
    from experiments.calibration.measure import interleaved
    from experiments.rounds import LONG_CALL_MS

    seen = []

    def sample(calls):
        seen.append(calls)
        return (LONG_CALL_MS,)  # ms a call: long enough to need no untimed call

    interleaved([Bench(("z",), 4, sample)], rounds=3, warmup=1, rank=1)
    return seen


@pytest.mark.slow
def test_a_long_bench_is_sampled_without_an_untimed_call_before_it():
    """As the rounds' (`experiments.rounds.needs_untimed`): a bench of LONG_CALL_MS a call and
    more takes its samples at once, a round a call."""
    from codegen.runtime.launch import run_ranks

    for seen in run_ranks(_long_bench, 2, timeout_s=60):
        assert seen == [1, 1, 1, 1]  # warm-up, then 3 rounds of one sample each


@pytest.mark.slow
def test_a_bench_with_min_calls_takes_that_many_calls_per_sample_however_long_they_are():
    """The library steps a run's memory scale divides by (`library_steps`) are sampled as the
    median of LIBRARY_CALLS calls at least, not one call a round."""
    from codegen.runtime.launch import run_ranks
    from experiments.benches import LIBRARY_CALLS

    for seen in run_ranks(_calls_per_sample, 2, timeout_s=60):
        # warm-up, then 3 rounds: each sample after an untimed call of its own
        assert seen["x"] == [1, 1, 5, 1, 5, 1, 5] and seen["y"] == [1] * 7
    assert LIBRARY_CALLS >= 3


def _waited(rank, world):
    import torch

    from experiments.benches import waited

    bench = waited(1 << 16, torch.randn(1 << 14), torch.empty(1 << 14))
    return bench.kinds, bench.extra, bench.sample(3)


@pytest.mark.slow
def test_the_first_chunks_wait_is_timed_with_the_whole_exchange_on_real_ranks():
    """`exchange_first` / `exchange_last` (`benches.waited`): 4 chunks posted at once over
    gloo; the wait for the first ends no later than the whole exchange."""
    from codegen.runtime.launch import run_ranks

    for kinds, extra, (first, last) in run_ranks(_waited, 2, timeout_s=60):
        assert kinds == ("exchange_first", "exchange_last") and extra == {"chunks": 4}
        assert 0.0 < first <= last
