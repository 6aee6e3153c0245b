"""A run directory's history: earlier results kept, interrupted runs resumed.

- `keep_earlier_results(out_dir)`: a run into a directory that holds a results.csv moves it to
  the next free `results.<k>.csv` (k = 1, 2, ...): a re-run never deletes measured rows.
- `settings.json` (`write_settings`): what makes two runs' points comparable: experiment, scale,
  seed, backend, transport, schedules and sizes asked for, and the timing budget.
- `resume_rows(out_dir, settings)` (`resume=true`): the measured rows of the directory's
  results.csv when it was written with the same settings (else SuiteError: one line, exit 2);
  `done_points(rows)`: the (world size, bindings) points that hold a row for every schedule,
  which the harness then skips (`MeasureSettings.skip`). The earlier file is kept numbered as
  above, and the new results.csv starts from the measured rows of the complete points
  (`complete`: a point cut short is measured again whole; a last row cut mid-line is not read,
  `whole_rows`); their predictions are made again with the rest.

Units: none; files are CSV and JSON.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Optional

from reports.results import append_row, read_table

from .errors import SuiteError

log = logging.getLogger(__name__)

SETTINGS = "settings.json"
REPORT = "report"  # settings.json's record of the report's own inputs (`record_report`)


def keep_earlier_results(out_dir: Path) -> Optional[Path]:
    """Move out_dir/results.csv to the next free results.<k>.csv; its new path, or None."""
    old = out_dir / "results.csv"
    if not old.exists():
        return None
    k = 1
    while (out_dir / f"results.{k}.csv").exists():
        k += 1
    kept = out_dir / f"results.{k}.csv"
    old.replace(kept)
    log.info(f"kept the directory's earlier results as {kept}")
    return kept


def write_settings(out_dir: Path, settings: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SETTINGS).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def record_report(out_dir: Path, recorded: dict) -> None:
    """Keep under settings.json's `REPORT` key what a report shows that results.csv does not
    hold (the verification checks, the calibration used), so `python -m suite.report` remakes
    it as the run wrote it; resume does not compare it."""
    path = out_dir / SETTINGS
    saved = json.loads(path.read_text()) if path.exists() else {}
    write_settings(out_dir, {**saved, REPORT: recorded})


def recorded_report(out_dir: Path) -> Optional[dict]:
    """What `record_report` kept, or None (a run from before it, or none)."""
    path = out_dir / SETTINGS
    return json.loads(path.read_text()).get(REPORT) if path.exists() else None


def resume_rows(out_dir: Path, settings: dict) -> list[dict]:
    """The measured rows to keep when resuming into out_dir (see the module)."""
    csv, saved = out_dir / "results.csv", out_dir / SETTINGS
    if not csv.exists():
        return []
    if not saved.exists():
        raise SuiteError(
            f"resume=true: {out_dir} has results but no {SETTINGS}; it was not "
            "written by a run that can be resumed"
        )
    before = json.loads(saved.read_text())
    differ = sorted(k for k in {*before, *settings} - {REPORT} if before.get(k) != settings.get(k))
    if differ:
        k = differ[0]
        raise SuiteError(
            f"resume=true: {out_dir} was run with {k}={before.get(k)!r}, this run "
            f"has {k}={settings.get(k)!r}; resume with the same settings"
        )
    df = whole_rows(csv)
    df = df[(df.source == "measured") & (df.experiment == settings["experiment"])]
    return [{k: v for k, v in r.items() if v == v} for r in df.to_dict("records")]


def whole_rows(path: Path):
    """The table at `path` without a last row cut short (no newline: the run was killed or the
    disk filled while writing it)."""
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return read_table(io.StringIO(text))


def complete(rows: list[dict], schedules: list[str], experiment) -> list[dict]:
    """The rows of the points `done_points` finds complete: a point that lacks a schedule's row
    is measured again whole, so no point ends with two rows of a schedule."""
    done = done_points(rows, schedules, experiment)
    return [r for r in rows if _point(r, experiment) in done]


def _point(r: dict, experiment) -> tuple:
    b = experiment.bindings_of(int(r["size"]), str(r["shape"]))
    return int(r["world_size"]), tuple(sorted(b.items()))


def done_points(rows: list[dict], schedules: list[str], experiment) -> frozenset:
    """(world size, sorted bindings) of every point that has a measured row per schedule."""
    seen: dict[tuple, set] = {}
    for r in rows:
        seen.setdefault(_point(r, experiment), set()).add(r["schedule"])
    want = {"baseline", *schedules}
    return frozenset(p for p, have in seen.items() if want <= have)


def restart_with(out_dir: Path, rows: list[dict]) -> None:
    """A fresh results.csv holding the kept measured rows."""
    for r in rows:
        append_row(out_dir / "results.csv", r)
