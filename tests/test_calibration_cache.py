"""Calibrated by default (experiments.calibration.cache): the fingerprint keys the cache, auto reuses a cached
calibration without measuring, off and a given topology.path use none, refresh calibrates again
(a real quick calibration on 2 ranks, once), and the report names the calibration used."""

import hashlib
import json
from types import SimpleNamespace as N

import pytest

import experiments
from experiments.calibration import cache as calibration
from experiments.calibration.cache import describe, fingerprint, key_of, local_calibration

ADAM = experiments.get("adam_fusion")


def _cfg(mode="auto", path=None, topology="local", backend="cpu", keep_awake=True):
    return N(
        calibration=mode,
        topology=N(path=path, name=topology),
        backend=N(name=backend, comm="ring"),
        keep_awake=keep_awake,
        calibration_pool=8,
    )


def test_fingerprint_names_the_machine_and_the_code():
    fp = fingerprint()
    assert set(fp) == {"cpu", "cores", "memory_gib", "torch", "compiler", "code", "keep_awake"}
    assert fp["cores"] >= 1 and fp["torch"] and len(fp["code"]) == 16
    assert key_of(fp) == key_of(dict(fp)) != key_of({**fp, "torch": "0.0"})
    assert key_of(fingerprint(keep_awake=False)) != key_of(fp)  # calibrated with the spinners


def test_auto_reuses_a_cached_calibration(tmp_path, monkeypatch):
    where = tmp_path / key_of(fingerprint())
    where.mkdir()
    text = (calibration.PACKAGES_ROOT / "suite" / "conf" / "topology" / "local.yaml").read_bytes()
    (where / "topology.yaml").write_bytes(text)
    (where / "fingerprint.json").write_text(
        json.dumps(
            {
                "created": "then",
                "schema": calibration.SCHEMA,
                "checksums": {"topology.yaml": hashlib.sha256(text).hexdigest()},
            }
        )
    )
    monkeypatch.setattr(calibration, "_calibrate", lambda *a: pytest.fail("recalibrated"))
    found = local_calibration(_cfg(), ADAM, 2, cache=tmp_path)
    assert found.path == where / "topology.yaml" and not found.fresh
    assert found.key in describe(found, _cfg()) and "cached" in describe(found, _cfg())


@pytest.mark.parametrize(
    "cfg,exp",
    [
        (_cfg("off"), ADAM),
        (_cfg(path="/x/topology.yaml"), ADAM),
        (_cfg(topology="dgx2"), ADAM),
        (_cfg(backend="sim"), ADAM),
        (_cfg(), experiments.get("calibrate")),
    ],
)
def test_no_calibration_where_none_applies(tmp_path, cfg, exp):
    assert local_calibration(cfg, exp, 2, cache=tmp_path) is None
    assert not list(tmp_path.iterdir())
    text = describe(None, cfg)
    assert ("given" in text) if cfg.topology.path else ("shipped figures" in text)


@pytest.mark.slow
def test_refresh_calibrates_for_real_and_replaces_the_cache(tmp_path, capfd, monkeypatch):
    """A real calibration, at smoke's sizes rather than the quick pass's (a third of the time:
    what is tested is the cache, not the fit)."""
    monkeypatch.setattr(calibration, "QUICK", "smoke")
    where = tmp_path / key_of(fingerprint())
    where.mkdir()
    (where / "stale").write_text("old")
    found = local_calibration(_cfg("refresh"), ADAM, 2, cache=tmp_path)
    out = capfd.readouterr().out  # the progress bar comes from rank 0, another process
    assert "calibrating this machine first (calibration=refresh" in out and "calibrate [" in out
    assert found.fresh and found.took_s > 0 and found.path == where / "topology.yaml"
    assert not (where / "stale").exists() and (where / "calibration.json").exists()
    # and kept in the history, where the next calibration's fit finds it
    assert len(list(calibration.history_dir(True, tmp_path).glob("*-smoke-p2.json"))) == 1
    assert json.loads((where / "fingerprint.json").read_text())["cores"] == fingerprint()["cores"]
    # no temporary folder left
    left = sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock")
    assert left == sorted([where.name, "history"])
    again = local_calibration(_cfg(), ADAM, 2, cache=tmp_path)
    assert not again.fresh and again.created == found.created


def test_a_run_without_the_spinners_does_not_use_their_calibration(tmp_path, monkeypatch):
    """keep_awake (codegen.runtime.awake) keys the cache: each setting calibrates its own."""
    seen = []

    def fake(where, fp, *a):
        seen.append(fp["keep_awake"])
        where.mkdir(parents=True)
        (where / "topology.yaml").write_text("name: local\n")
        (where / "fingerprint.json").write_text(json.dumps({**fp, "created": "now"}))

    monkeypatch.setattr(calibration, "_calibrate", fake)
    a = local_calibration(_cfg(keep_awake=True), ADAM, 2, cache=tmp_path)
    b = local_calibration(_cfg(keep_awake=False), ADAM, 2, cache=tmp_path)
    assert a.key != b.key and seen == [True, False]
