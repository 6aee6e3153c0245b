"""Caches are checked, not trusted (issue 54): a damaged cached build is built again; a damaged
cached calibration is refused in one line before any work, naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_suite_cli import PROJECT_ROOT

BUILD = """
import sys
from codegen.build import build
from codegen.lower import lower
from dsl import Builder, Local, f32, sym
b = Builder("tiny")
x = b.input("x", f32, [sym("N")], Local())
b.output("y", x * 2.0)
fns = build(lower(b.build(), {"N": 8}, 1).kernels(), name="tiny")
print("built", len(fns))
"""


def _build(cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "COCONET_KERNELS_DIR": str(cache), "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", BUILD],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_zero_byte_cached_module_is_built_again(tmp_path):
    first = _build(tmp_path)
    assert first.returncode == 0 and "built 1" in first.stdout, first.stderr
    (so,) = tmp_path.glob("tiny_*/tiny_*.so")
    so.write_bytes(b"")  # what a full disk leaves
    again = _build(tmp_path)
    assert again.returncode == 0 and "built 1" in again.stdout, again.stderr
    assert "is damaged or would not load: building it again" in again.stderr  # a warning
    assert so.read_bytes()[:4] == b"\x7fELF"


import hashlib  # noqa: E402
import json  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from experiments.calibration.cache import (  # noqa: E402
    FINGERPRINT,
    SCHEMA,
    TOPOLOGY,
    CalibrationError,  # noqa: E402
    cached,
    fingerprint,
    key_of,
    local_calibration,
)

LOCAL = (PROJECT_ROOT / "suite" / "conf" / "topology" / "local.yaml").read_text()


def _cache(where, topology: str = LOCAL, schema: int = SCHEMA, fp: str = ""):
    where.mkdir(parents=True, exist_ok=True)
    (where / TOPOLOGY).write_text(topology)
    sums = {TOPOLOGY: hashlib.sha256(LOCAL.encode()).hexdigest()}
    (where / FINGERPRINT).write_text(
        fp or json.dumps({"created": "then", "schema": schema, "checksums": sums})
    )
    return where


def test_a_whole_cached_calibration_is_used(tmp_path):
    assert cached(_cache(tmp_path / "c"), TOPOLOGY)["created"] == "then"


def test_an_older_cache_is_calibrated_again_not_used(tmp_path):
    assert cached(_cache(tmp_path / "c", schema=1), TOPOLOGY) is None


@pytest.mark.parametrize("damage", ["cut", "garbage fingerprint", "fingerprint a list"])
def test_a_damaged_cache_is_one_line_naming_the_fix(tmp_path, damage):
    where = {
        "cut": lambda: _cache(tmp_path / "c", topology=LOCAL[: len(LOCAL) // 2]),
        "garbage fingerprint": lambda: _cache(tmp_path / "c", fp="{not json"),
        "fingerprint a list": lambda: _cache(tmp_path / "c", fp="[1, 2]"),
    }[damage]()
    with pytest.raises(CalibrationError) as got:
        cached(where, TOPOLOGY)
    assert "is damaged" in str(got.value) and "calibration=refresh" in str(got.value)
    assert "\n" not in str(got.value)


def test_a_run_refuses_a_damaged_cache_before_it_calibrates_or_measures(tmp_path):
    cfg = SimpleNamespace(
        calibration="auto",
        keep_awake=True,
        calibration_pool=1,
        topology=SimpleNamespace(path=None, name="local"),
        backend=SimpleNamespace(name="cpu", comm="ring"),
    )
    where = tmp_path / key_of(fingerprint(True))
    _cache(where, topology=LOCAL[:100])
    with pytest.raises(CalibrationError, match="is damaged"):
        local_calibration(cfg, SimpleNamespace(fits_topology=False), 2, cache=tmp_path)
