"""Calibrated by default: the local topology fitted to this machine, cached per machine fingerprint.

    found = local_calibration(cfg, exp)   # -> Calibration | None, calibrating first when needed

`calibration=auto` (the default): a run that predicts this machine (topology=local, no
`topology.path`, a measuring backend, an experiment that does not fit its own topology) uses the
calibration cached in `.cache/calibration/<key>/` (topology.yaml, calibration.json,
fingerprint.json), where `key` hashes the machine's `fingerprint()`: CPU model, cores, memory,
torch and C++ compiler versions, the calibration code's version (a hash of the files in `CODE`:
calibrate's measurement, its rounds, its benchmarks and the fit) and the run's `keep_awake`. When
none matches, the run calibrates first, says so, and shows calibrate's progress bar: a quick pass
(`QUICK`, experiments.calibration.measure's "quick" scale: smoke's single pass and repeats over
the default scale's range of sizes, every other one; at smoke's sizes, which fit in the CPU's caches, the fit overrates memory bandwidth),
written to a temporary folder and moved into place whole, so a crash leaves no half calibration
(and a temporary folder older than `STALE_S`, a run killed outright left, is removed). One
machine calibrates once at a time: runs that start together (two test workers) wait on a lock
file (`.<key>.lock`, flock), and the one that waited takes what the other cached. The cache
is checked before it is used (`cached`): fingerprint.json carries its layout's version (`SCHEMA`:
an older one is calibrated again) and the topology files' checksums; a file that is not as it
was written, a fingerprint.json that does not parse, a topology that does not load end the run
before any work with one line naming the fix. `calibration=refresh` calibrates again and replaces the cache;
`calibration=off` uses the shipped figures (suite/conf/topology/local.yaml, uncalibrated).
With comm=shm the calibration also measures the shared-memory collectives and the run predicts
with the topology fitted to them (topology_shm.yaml, beside topology.yaml; a cached calibration
without it is measured again); the library baseline on gloo, which such a run times too, is
predicted with the same calibration's topology.yaml (`Calibration.gloo_path`).
`topology.path=FILE` always wins (and predicts no gloo baseline). Every report names the
calibration it used (`describe`). Every calibration, the quick pass and experiment=calibrate's
alike, is also kept in `.cache/calibration/history/<key>/` (`history_dir`: keyed by the machine
and the measurement code alone), and the fit reads it pooled with the `calibration_pool - 1`
latest kept ones of the same scale and ranks (`experiments.calibration.history`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import yaml

from codegen.cache import PACKAGES_ROOT, cache_dir
from cost_model.topology import TopologyError, load_topology

from ..api import MeasureSettings
from ..registry import get
from .machine import compiler, cpu_model, memory_gib

log = logging.getLogger(__name__)

MODES = ("auto", "refresh", "off")
# the calibration code's version (experiments.rounds: how calibrate samples communications;
# experiments.benches: what it measures, experiments.optimizers the baseline step it times;
# .fit and cost_model.curves and .microbench: how the fit reads the sizes and models each benchmark)
CODE = (
    "experiments/calibration/measure.py",
    "experiments/benches.py",
    "experiments/rounds.py",
    "experiments/optimizers.py",
    "experiments/calibration/fit.py",
    "cost_model/curves.py",
    "cost_model/microbench.py",
    "experiments/calibration/fit_device.py",
)
MEASURING = CODE[:4]  # what the measurements alone depend on: the history's key (`history_dir`)
TOPOLOGY, CALIBRATION, FINGERPRINT = "topology.yaml", "calibration.json", "fingerprint.json"
TOPOLOGY_SHM = "topology_shm.yaml"  # comm=shm's (.measure measures it with comm=shm)
SCHEMA = 2  # fingerprint.json's layout: 2 = with the topology files' checksums
QUICK = "quick"  # the scale of the pass a run calibrates first with (.measure's SCALES)
STALE_S = 6 * 3600.0  # a temporary calibration folder older than this was left by a dead run


class CalibrationError(Exception):
    """A cached calibration that is damaged; the message is one line naming the fix."""


@dataclass(frozen=True)
class Calibration:
    key: str
    path: Path  # the cached topology.yaml (comm=shm: topology_shm.yaml)
    created: str  # UTC time it was measured
    fresh: bool  # calibrated by this run
    took_s: float = 0.0
    gloo_path: Optional[Path] = None  # comm=shm: the same calibration's gloo topology.yaml


def fingerprint(keep_awake: bool = True, files=CODE) -> dict:
    """What makes one machine's calibration another's: hardware, software, calibration code (a
    hash of `files`), and whether the CPUs were kept awake (`codegen.runtime.awake`: it changes
    every communication's time)."""
    code = hashlib.sha256()
    for rel in files:
        code.update((PACKAGES_ROOT / rel).read_bytes())
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib() or 0),
        "torch": torch.__version__,
        "compiler": compiler(),
        "code": code.hexdigest()[:16],
        "keep_awake": bool(keep_awake),
    }


def key_of(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def local_calibration(
    cfg, exp, world_size: int, cache: Optional[Path] = None
) -> Optional[Calibration]:
    """The calibration the run predicts this machine with (see the module); None: none applies.
    `cfg`: the run's settings (`suite.config.Config`; read, attribute by attribute), `exp` its
    experiment; `cache`: the cache's folder (default `<suite cache>/calibration`)."""
    cache = cache or default_cache()
    if (
        cfg.calibration == "off"
        or cfg.topology.path
        or cfg.topology.name != "local"
        or cfg.backend.name != "cpu"
        or exp.fits_topology
    ):
        return None
    fp = fingerprint(cfg.keep_awake)
    key = key_of(fp)
    where = cache / key
    shm = cfg.backend.comm == "shm"
    name = TOPOLOGY_SHM if shm else TOPOLOGY
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}.lock", "w") as lock:
        # one calibration of a machine at a time: a run that waited here takes what the
        # other one cached (two runs, or two test workers, starting at once)
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = cached(where, name) if cfg.calibration == "auto" else None
        if meta is not None:
            return Calibration(
                key,
                where / name,
                meta.get("created", "?"),
                False,
                gloo_path=where / TOPOLOGY if shm else None,
            )
        why = (
            "calibration=refresh"
            if cfg.calibration == "refresh"
            else "none cached for this machine"
        )
        log.info(
            f"calibrating this machine first ({why}; a quick pass of experiment=calibrate, "
            f"cached in {where} for later runs) ..."
        )
        started = time.monotonic()
        _calibrate(
            where,
            fp,
            world_size,
            "shm" if shm else None,
            history_dir(cfg.keep_awake, cache),
            cfg.calibration_pool,
        )
        took = time.monotonic() - started
    log.info(f"calibrated in {took:.0f} s: {where / name}")
    meta = json.loads((where / FINGERPRINT).read_text())
    return Calibration(
        key, where / name, meta["created"], True, took, gloo_path=where / TOPOLOGY if shm else None
    )


def cached(where: Path, name: str) -> Optional[dict]:
    """The cached calibration's fingerprint.json where `where` holds a whole one for `name`
    (every file its checksums name as written, the topology loading); None where there is
    none or it was written by an older version of this cache (`SCHEMA`: calibrate again);
    CalibrationError (one line, naming the fix) where it is damaged."""
    if not (where / name).exists() and not (where / FINGERPRINT).exists():
        return None
    try:
        meta = json.loads((where / FINGERPRINT).read_text())
        if not isinstance(meta, dict):
            raise ValueError(f"{FINGERPRINT} is not an object")
        if meta.get("schema") != SCHEMA:
            return None
        if not (where / name).exists():
            return None
        sums = meta.get("checksums", {})
        for file in {name, *sums}:
            if sums.get(file) != _sha256(where / file):
                raise ValueError(f"{file} is not as it was written (checksum)")
        load_topology(path=where / name)
    except (OSError, ValueError, TopologyError, yaml.YAMLError) as e:
        why = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise CalibrationError(
            f"the cached calibration in {where} is damaged ({why[:200]}); "
            "calibrate again with calibration=refresh"
        ) from None
    return meta


def _sha256(path: Path) -> Optional[str]:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def default_cache() -> Path:
    """The calibrations' folder in the suite's cache (`codegen.cache.cache_dir`)."""
    return cache_dir() / "calibration"


def history_dir(keep_awake: bool = True, cache: Optional[Path] = None) -> Path:
    """Where this machine's calibrations are kept, to be fitted together
    (`experiments.calibration.history`): keyed as the cache is, but by the measurement code
    alone (`MEASURING`), so a change to the fit keeps the measurements it can read."""
    return (cache or default_cache()) / "history" / key_of(fingerprint(keep_awake, MEASURING))


def describe(found: Optional[Calibration], cfg, fitted: Optional[Path] = None) -> str:
    """How a report names the calibration it used; `fitted`: the topology.yaml the run fitted
    itself (experiment=calibrate), named by its source (what it pooled)."""
    if fitted is not None and fitted.exists():
        return f"fitted by this run, {load_topology(path=fitted).source}: {fitted}"
    if cfg.topology.path:
        return f"topology.path={cfg.topology.path} (given)"
    if found is None:
        return (
            f"none (calibration={cfg.calibration}): the shipped figures of "
            f"suite/conf/topology/{cfg.topology.name}.yaml"
        )
    how = f"measured by this run in {found.took_s:.0f} s" if found.fresh else "cached"
    return f"{found.key} ({how}, {found.created}): {found.path}"


def _calibrate(
    where: Path,
    fp: dict,
    world_size: int,
    comm: Optional[str] = None,
    history: Optional[Path] = None,
    pool: int = 1,
) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    for stale in where.parent.glob(".calibrating-*"):  # left by a calibration killed outright
        if time.time() - stale.stat().st_mtime > STALE_S:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".calibrating-", dir=where.parent))
    try:
        settings = MeasureSettings(
            scale=QUICK,
            max_elements=1 << 25,
            world_size=max(2, world_size),
            warmup=1,
            repeats=3,
            csv_path=tmp / "results.csv",
            kernels_dir=tmp / "kernels",
            comm=comm,
            calibration_history=history,
            calibration_pool=pool,
        )
        get("calibrate").measure(settings)
        created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        sums = {f.name: _sha256(f) for f in sorted(tmp.glob("topology*.yaml"))}
        (tmp / FINGERPRINT).write_text(
            json.dumps({**fp, "created": created, "schema": SCHEMA, "checksums": sums}, indent=2)
            + "\n"
        )
        if where.exists():
            shutil.rmtree(where)
        tmp.replace(where)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
