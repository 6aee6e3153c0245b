"""The manual builds and the README stays short.

- `mkdocs build --strict` of mkdocs.yml (the manual in docs/: MkDocs, Material, mkdocstrings)
  exits 0 with no warning; skipped, saying so, where the docs tools are not installed
  (`pip install mkdocs-material 'mkdocstrings[python]'`).
- README.md has at most README_MAX_LINES lines, and its quickstart is one code block of exactly
  two commands: the install and the default run, the install and the tests (what .ci/run does).
- No README command writes into a committed folder (docs/reference/ holds the committed
  reference run), and the README keeps no measurement history (that is docs/results_history.md).
- Every column of results.csv (`reports.results.COLUMNS`) is documented in docs/ref/results-csv.md.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200
DOCS_TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_tools() -> list[str]:
    missing = []
    for name in DOCS_TOOLS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_manual_builds_strict_without_warnings(tmp_path):
    missing = _missing_tools()
    if missing:
        pytest.skip(
            f"the docs tools are not installed ({', '.join(missing)}): "
            "pip install mkdocs-material 'mkdocstrings[python]'"
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "ref" / "config" / "index.html").exists()


def _lines() -> list[str]:
    return README.read_text().splitlines()


def quickstart_block() -> list[str]:
    """The lines of the first fenced block under the README's `## Quickstart` heading."""
    lines = _lines()
    start = next(k for k, line in enumerate(lines) if line.strip() == "## Quickstart")
    fence = next(k for k in range(start + 1, len(lines)) if lines[k].startswith("```"))
    assert not any(line.startswith("## ") for line in lines[start + 1 : fence]), (
        "no code block in the Quickstart section"
    )
    end = next(k for k in range(fence + 1, len(lines)) if lines[k].startswith("```"))
    return lines[fence + 1 : end]


def commands(block: list[str]) -> list[str]:
    """Shell commands of a block: its non-blank, non-comment lines, continuations joined."""
    out, pending = [], ""
    for line in block:
        text = line.strip()
        if not pending and (not text or text.startswith("#")):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        out.append(pending + text)
        pending = ""
    if pending:
        out.append(pending)
    return out


def test_readme_is_short():
    assert len(_lines()) <= README_MAX_LINES, f"README.md has {len(_lines())} lines"


def test_quickstart_is_exactly_two_commands():
    found = commands(quickstart_block())
    assert len(found) == 2, found
    run, tests = found
    for command in found:
        assert "python3.11 -m venv .venv" in command and "torch==2.13.0" in command, command
    assert "pip install -e . " in run and run.endswith("python -m suite"), run
    assert "pip install -e '.[dev]'" in tests and tests.endswith("python -m pytest -q"), tests


def test_readme_commands_write_no_committed_folder():
    text = README.read_text()
    for found in re.finditer(r"hydra\.(?:run|sweep)\.dir=(\S+)", text):
        assert not found.group(1).startswith("docs"), found.group(0)


def test_readme_keeps_no_measurement_history():
    text = README.read_text()
    assert not re.search(r"\bruns? \d{2,}", text), "run numbers belong in docs/results_history.md"
    assert "| experiment (paper figure)" not in text, "the headline table is docs/results.md's"


def test_every_results_column_is_documented():
    from reports.results import COLUMNS

    page = (ROOT / "docs" / "ref" / "results-csv.md").read_text()
    assert [c for c in COLUMNS if f"`{c}`" not in page] == []
