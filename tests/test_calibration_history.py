"""Calibrations fitted together (experiments.calibration.history, experiments.calibration.fit.pool):
pooling takes each benchmark's median over calibrations, identical calibrations pool to the
same fit, the history keeps every calibration and hands back the latest of the same scale and
ranks, and calibrate's fit reads them pooled and names how many (no ranks here)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace as N

import pytest
from test_calibrate import synthetic, truth

from cost_model.topology import load_topology
from experiments.calibration.cache import CODE, MEASURING, fingerprint, history_dir, key_of
from experiments.calibration.fit import fit, pool
from experiments.calibration.history import keep, kept, pooled
from experiments.calibration.measure import POOLED, with_history


def _m(kind, nbytes, t, **kw):
    return {
        "kind": kind,
        "nbytes": nbytes,
        "time_ms": t,
        "time_ms_min": t / 2,
        "time_ms_max": t * 2,
        "time_ms_mean": t * 1.1,
        "world_size": 2,
        "rounds": 20,
        **kw,
    }


def test_pool_takes_each_benchmarks_median_over_the_calibrations_that_measured_it():
    cals = [
        [_m("exchange", 1024, 1.0), _m("matmul", 64, 5.0, flops=10)],
        [_m("exchange", 1024, 2.0), _m("matmul", 64, 7.0, flops=20)],
        [_m("exchange", 1024, 10.0), _m("kernel", 64, 3.0)],
    ]
    got = {(m["kind"], m.get("flops")): m for m in pool(cals)}
    ex = got[("exchange", None)]
    assert ex["time_ms"] == 2.0 and ex["time_ms_mean"] == pytest.approx(2.2)  # medians
    assert ex["time_ms_min"] == 0.5 and ex["time_ms_max"] == 20.0  # the widest range
    assert ex["rounds"] == 60 and ex["calibrations"] == 3
    # other flops are another benchmark; one calibration's alone is kept as it was
    assert got[("matmul", 10)]["time_ms"] == 5.0 and got[("matmul", 20)]["time_ms"] == 7.0
    assert got[("kernel", None)]["time_ms"] == 3.0 and got[("kernel", None)]["calibrations"] == 1
    assert len(got) == 4


@pytest.mark.slow
def test_identical_calibrations_pool_to_the_same_fit_and_an_outlier_moves_it_less():
    ms = [dataclasses.asdict(m) for m in synthetic(truth())]
    one = fit(ms, load_topology("local"), 2)
    assert fit(pool([ms, ms, ms]), load_topology("local"), 2) == one
    slow = [{**m, "time_ms": m["time_ms"] * 1.3} if m["kind"] == "exchange" else m for m in ms]
    alone = fit(slow, load_topology("local"), 2).intra.link.bandwidth_gbps
    pooled_bw = fit(pool([slow, ms, ms]), load_topology("local"), 2).intra.link.bandwidth_gbps
    assert alone < 0.85 * one.intra.link.bandwidth_gbps
    assert pooled_bw == pytest.approx(one.intra.link.bandwidth_gbps, rel=0.01)


def test_the_history_keeps_every_calibration_and_pools_the_latest_of_its_scale_and_ranks(
    tmp_path, capsys
):
    h = tmp_path / "history"
    assert kept(h, "default", 2) == [] and pooled(h, [_m("kernel", 1, 1.0)], "default", 2, 8) == [
        ("this run", [_m("kernel", 1, 1.0)])
    ]
    names = [keep(h, [_m("kernel", 1, float(i))], "default", 2).name for i in range(4)]
    keep(h, [_m("kernel", 1, 99.0)], "smoke", 2)
    keep(h, [_m("kernel", 1, 98.0, world_size=4)], "default", 4)
    (h / "00000000T000000000000-default-p2.json").write_text("{not json")
    assert len(set(names)) == 4 and kept(h, "default", 2)[1:] == [h / n for n in names]
    got = pooled(h, [_m("kernel", 1, -1.0)], "default", 2, 3)
    assert [name for name, _ in got] == ["this run", names[3], names[2]]  # newest first
    assert [cal[0]["time_ms"] for _, cal in got] == [-1.0, 3.0, 2.0]
    every = pooled(h, [_m("kernel", 1, -1.0)], "default", 2, 100)
    assert len(every) == 5  # the four kept, never the other scale, ranks or the broken file
    assert "skipped" in capsys.readouterr().err
    assert len(list(h.iterdir())) == 7  # nothing deleted


def test_calibrate_fits_its_measurements_pooled_with_the_history_and_keeps_them(tmp_path):
    h, out = tmp_path / "history", tmp_path / "run"
    out.mkdir()
    ms = [dataclasses.asdict(m) for m in synthetic(truth())]
    settings = N(calibration_history=h, calibration_pool=3, scale="default", world_size=2)
    first, source = with_history(ms, settings, out)  # nothing kept yet: its own
    assert first == ms and source == "" and not (out / POOLED).exists()
    slow = [{**m, "time_ms": m["time_ms"] * 1.3} for m in ms]
    with_history(ms, settings, out)
    got, source = with_history(slow, settings, out)  # with the two kept: three
    assert "median of 3 calibrations" in source
    assert json.loads((out / POOLED).read_text()) == got
    assert {m["kind"]: m["time_ms"] for m in got} == {m["kind"]: m["time_ms"] for m in ms}
    assert len(kept(h, "default", 2)) == 3
    alone, _ = with_history(slow, N(**{**vars(settings), "calibration_pool": 1}), out)
    assert alone == slow
    got, _ = with_history(ms, N(**{**vars(settings), "calibration_history": None}), out)
    assert got == ms and len(kept(h, "default", 2)) == 4


def test_the_history_is_keyed_by_the_machine_and_the_measurement_code_alone(tmp_path):
    assert set(MEASURING) < set(CODE) and all(f.startswith("experiments/") for f in MEASURING)
    where = history_dir(True, tmp_path)
    assert where == tmp_path / "history" / key_of(fingerprint(True, MEASURING))
    assert where.name != key_of(fingerprint(True)) and history_dir(False, tmp_path) != where


def test_a_history_that_cannot_be_written_does_not_stop_the_calibration(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    ms = [dataclasses.asdict(m) for m in synthetic(truth())]
    settings = N(
        calibration_history=blocked / "history", calibration_pool=8, scale="default", world_size=2
    )
    got, source = with_history(ms, settings, tmp_path)
    assert got == ms and source == "" and "not kept" in capsys.readouterr().out
