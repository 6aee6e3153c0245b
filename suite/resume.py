"""A run directory's history: earlier results kept, interrupted runs resumed.

- `keep_earlier_results(out_dir)`: a run into a directory that holds a results.csv moves it to
  the next free `results.<k>.csv` (k = 1, 2, ...): a re-run never deletes measured rows.
- `settings.json` (`write_settings`): what makes two runs' points comparable: experiment, scale,
  seed, backend, transport, schedules and sizes asked for, and the timing budget.
- `resume_rows(out_dir, settings)` (`resume=true`): the measured rows of the directory's
  results.csv when it was written with the same settings (else SuiteError: one line, exit 2);
  `done_points(rows)`: the (world size, bindings) points that hold a row for every schedule,
  which the harness then skips (`MeasureSettings.skip`). The earlier file is kept numbered as
  above, and the new results.csv starts from those measured rows (their predictions are made
  again with the rest).

Units: none; files are CSV and JSON.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from reports.table import append_row, read_table

from .errors import SuiteError

SETTINGS = "settings.json"


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
    print(f"kept the directory's earlier results as {kept}", flush=True)
    return kept


def write_settings(out_dir: Path, settings: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SETTINGS).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def resume_rows(out_dir: Path, settings: dict) -> list[dict]:
    """The measured rows to keep when resuming into out_dir (see the module)."""
    csv, saved = out_dir / "results.csv", out_dir / SETTINGS
    if not csv.exists():
        return []
    if not saved.exists():
        raise SuiteError(f"resume=true: {out_dir} has results but no {SETTINGS}; it was not "
                         "written by a run that can be resumed")
    before = json.loads(saved.read_text())
    differ = sorted(k for k in {*before, *settings} if before.get(k) != settings.get(k))
    if differ:
        k = differ[0]
        raise SuiteError(f"resume=true: {out_dir} was run with {k}={before.get(k)!r}, this run "
                         f"has {k}={settings.get(k)!r}; resume with the same settings")
    df = read_table(csv)
    df = df[(df.source == "measured") & (df.experiment == settings["experiment"])]
    return [{k: v for k, v in r.items() if v == v} for r in df.to_dict("records")]


def done_points(rows: list[dict], schedules: list[str], experiment) -> frozenset:
    """(world size, sorted bindings) of every point that has a measured row per schedule."""
    seen: dict[tuple, set] = {}
    for r in rows:
        b = experiment.bindings_of(int(r["size"]), str(r["shape"]))
        seen.setdefault((int(r["world_size"]), tuple(sorted(b.items()))), set()).add(r["schedule"])
    want = {"baseline", *schedules}
    return frozenset(p for p, have in seen.items() if want <= have)


def restart_with(out_dir: Path, rows: list[dict]) -> None:
    """A fresh results.csv holding the kept measured rows."""
    for r in rows:
        append_row(out_dir / "results.csv", r)
