"""The layering docs/architecture.md draws, kept by an import-linter contract (pyproject.toml,
[tool.importlinter]): suite -> experiments -> cost_model | coconet -> codegen -> dsl (coconet, the
library, beside cost_model), cost_model taking only
the Plan's data types from codegen, reports standing apart, and no import cycle between the
modules of a package. Function-level imports count (grimp reads every import statement).

The second test copies the packages, adds one deliberate back-edge inside a function
(cost_model importing experiments) and checks that the same contract then fails, naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("suite", "experiments", "coconet", "cost_model", "codegen", "dsl", "reports")
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"
)


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_the_import_contract_holds():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in out.stdout


def test_a_back_edge_inside_a_function_breaks_it(tmp_path):
    for name in PACKAGES:
        shutil.copytree(
            ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "reference")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    workload = tmp_path / "cost_model" / "workload.py"
    workload.write_text(
        workload.read_text() + "\n\ndef _back_edge():\n    import experiments  # noqa: F401\n"
    )
    out = lint(tmp_path)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "BROKEN" in out.stdout and "cost_model.workload -> experiments" in out.stdout
