"""Every complete script in the README and the manual (a ```python block with an
`if __name__ == "__main__":`) runs as written, from a file, and says True: an example a user
copies works (the README's own PlanRunner example once raised TypeError)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def scripts() -> list:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for k, block in enumerate(BLOCK.findall(page.read_text())):
            if '__name__ == "__main__"' in block:
                found.append(pytest.param(block, id=f"{page.relative_to(ROOT)}#{k}"))
    return found


def test_the_docs_have_scripts():
    assert scripts()


@pytest.mark.slow
@pytest.mark.parametrize("script", scripts())
def test_a_documented_script_runs_and_checks_out(script, tmp_path):
    path = tmp_path / "example.py"
    path.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "True", proc.stdout[-2000:]
