"""A machine's calibrations, kept side by side and fitted together (`experiment=calibrate`).

    used = pooled(history, raw, scale, world, n)   # [(name, measurements)], this one first
    keep(history, raw, scale, world)               # -> the file this calibration was kept in

`history` is a folder of one machine's calibrations (the suite keeps it in
`.cache/calibration/history/<key>/`, keyed by the machine and the measurement code:
`experiments.calibration.cache.history_dir`), one calibration.json each, named
`<UTC time, to the microsecond>-<scale>-p<ranks>.json`, so names sort by time. `pooled` gives
this calibration and the `n - 1` latest kept ones of the same scale and number of ranks;
`experiments.calibration.fit.pool` makes them one set of measurements (per benchmark the median over
the calibrations), which the fit reads as one (why, with the figures: README, "Running",
"Calibrations are fitted together").
A kept file is written whole (a temporary file renamed), so a crash leaves none half written;
no file is ever deleted or rewritten. A file that does not parse is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def _suffix(scale: str, world: int) -> str:
    return f"-{scale}-p{world}.json"


def kept(history: Path, scale: str, world: int) -> list[Path]:
    """The calibrations kept in `history` at this scale and number of ranks, oldest first."""
    if not history.is_dir():
        return []
    return sorted(p for p in history.iterdir() if p.name.endswith(_suffix(scale, world)))


def pooled(
    history: Path, raw: list[dict], scale: str, world: int, n: int
) -> list[tuple[str, list[dict]]]:
    """This calibration (`raw`, named "this run") and the n - 1 latest kept ones of the same
    scale and ranks, newest first; unreadable files are skipped (one warning each)."""
    out: list[tuple[str, list[dict]]] = [("this run", raw)]
    for path in reversed(kept(history, scale, world)):
        if len(out) >= n:
            break
        try:
            got = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            log.warning(f"calibration history: skipped {path} ({e})")
            continue
        if isinstance(got, list) and got:
            out.append((path.name, got))
    return out


def keep(history: Path, raw: list[dict], scale: str, world: int) -> Path:
    """Write this calibration into `history` (created if missing) under a new name."""
    history.mkdir(parents=True, exist_ok=True)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}"
    path = history / (stamp + _suffix(scale, world))
    tmp = history / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(raw, indent=1))
    tmp.replace(path)
    return path
