"""Every runnable command of the manual's tutorials (docs/tutorials/*.md) runs as written.

The pages mark what runs, with HTML comments (invisible in the built manual):

- `<!-- run -->` on the line before a ```sh block: the block is run with bash
  (`set -euo pipefail`) and must exit 0.
- `<!-- file: NAME -->` on the line before a fenced block: its text is written to NAME first (a
  user's experiment module, a topology file), as the reader would save it.
- `<!-- not-runnable: REASON -->`: the page's commands need what a test machine lacks (GPUs, a
  SLURM cluster); the page says so in its text too.

Each page runs in a fresh temporary directory, its current directory, its blocks and files in page
order, with `python` resolving to this interpreter (its folder first on PATH) and the checkout on
PYTHONPATH. Runnable commands are cheap (scale=smoke, backend=sim where they can, tiny sizes) and
write only under their current directory (`hydra.run.dir=runs/...`), never into the checkout.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
MARKER = re.compile(r"^<!--\s*(run|file:\s*(\S+)|not-runnable:.*?)\s*-->\s*$")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Item:
    kind: str  # "run" | "file"
    text: str
    name: str = ""  # the file's name, for "file"
    line: int = 0  # where the block starts on its page


def items(page: Path) -> list[Item]:
    """The page's runnable blocks and files, in page order."""
    lines = page.read_text().splitlines()
    out, k = [], 0
    while k < len(lines):
        found = MARKER.match(lines[k].strip())
        if not found or found.group(1).startswith("not-runnable"):
            k += 1
            continue
        fence = k + 1
        assert fence < len(lines) and lines[fence].startswith("```"), (
            f"{page.name}:{k + 1}: a marker must sit on the line before a fenced block"
        )
        if found.group(1) == "run":
            assert lines[fence].strip() in ("```sh", "```bash"), (
                f"{page.name}:{fence + 1}: a runnable block is ```sh"
            )
        end = next(j for j in range(fence + 1, len(lines)) if lines[j].startswith("```"))
        text = "\n".join(lines[fence + 1 : end]) + "\n"
        if found.group(1) == "run":
            out.append(Item("run", text, line=fence + 1))
        else:
            out.append(Item("file", text, name=found.group(2), line=fence + 1))
        k = end + 1
    return out


def pages() -> list:
    return [pytest.param(p, id=p.name) for p in sorted(TUTORIALS.glob("*.md"))]


def test_there_are_tutorials_with_runnable_commands():
    assert sum(1 for p in TUTORIALS.glob("*.md") for i in items(p) if i.kind == "run") >= 5


@pytest.mark.parametrize("page", pages())
def test_a_tutorial_says_what_runs(page):
    """A page runs something, is tested as a script (tests/test_doc_scripts.py), or says why not."""
    text = page.read_text()
    runs = any(i.kind == "run" for i in items(page))
    script = '__name__ == "__main__"' in text
    assert runs or script or "<!-- not-runnable:" in text, page.name


@pytest.mark.parametrize("page", pages())
def test_runnable_commands_write_under_their_directory(page):
    for item in items(page):
        if item.kind == "file":
            assert "/" not in item.name and not item.name.startswith("."), item.name
            continue
        for found in re.finditer(r"hydra\.(?:run|sweep)\.dir=(\S+)", item.text):
            where = found.group(1)
            assert not where.startswith(("/", "..", "docs")), f"{page.name}:{item.line}: {where}"


@pytest.mark.slow
@pytest.mark.timeout(BLOCK_TIMEOUT_S * 6)
@pytest.mark.parametrize("page", pages())
def test_a_tutorial_runs_as_written(page, tmp_path):
    todo = items(page)
    if not any(i.kind == "run" for i in todo):
        pytest.skip(f"{page.name} has no runnable command (see its not-runnable note)")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    for item in todo:
        if item.kind == "file":
            (tmp_path / item.name).write_text(item.text)
            continue
        proc = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + item.text],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        assert proc.returncode == 0, (
            f"{page.name}:{item.line}: exit {proc.returncode}\n"
            f"{item.text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
