"""report.md for a run: a pure function of what the run produced (no computation here).

Sections: the experiment and the paper figure it reproduces, the settings, each schedule's printed
program in a code block, and the verification table (schedule, world size, bindings, max abs error,
verified), followed by the messages of failed checks, then `results`: the measured and predicted
sections `suite.run` builds with `reports/` from the results table alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from .verification import Check, format_bindings, format_error


def render_report(*, experiment: str, figure: str, settings: Mapping[str, object],
                  programs: Mapping[str, str], checks: Sequence[Check], results: str = "") -> str:
    lines = [f"# {experiment}", "", f"Reproduces the paper's {figure}.", "", "## Settings", ""]
    lines += [f"- {key}: `{value}`" for key, value in settings.items()]
    lines += ["", "## Schedules", ""]
    for name, text in programs.items():
        lines += [f"### {name}", "", "```", text.rstrip("\n"), "```", ""]
    lines += ["## Verification", ""]
    verified = sum(c.verified for c in checks)
    lines += [f"{verified} of {len(checks)} checks verified against the unscheduled program.", ""]
    lines += ["| schedule | world size | bindings | max abs error | verified |",
              "|---|---:|---|---:|---|"]
    for c in checks:
        lines.append(f"| `{c.schedule}` | {c.world_size} | {format_bindings(c.bindings)} | "
                     f"{format_error(c.max_abs_error)} | {'yes' if c.verified else 'no'} |")
    failed = [c for c in checks if not c.verified]
    if failed:
        lines += ["", "### Failures", ""]
        lines += [f"- `{c.schedule}` at P={c.world_size}, {format_bindings(c.bindings)}: "
                  f"{c.message}" for c in failed]
    if results:
        lines += ["", results.rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, text: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.md"
    path.write_text(text)
    return path
