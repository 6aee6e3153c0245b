"""GPU check of the CUDA backend: a thin wrapper around the suite's own command.

    python scripts/gpu_check.py [DIR] [key=value ...]

runs `python -m suite experiment=paper backend=cuda scale=smoke hydra.run.dir=DIR` (DIR default
runs/gpu_check; further key=value overrides are passed on) with the repository as the working
directory and exits with its status. Every experiment then verifies its schedules, compiles every
kernel (CUDA source and PTX, plus a CUBIN for the GPU present) and measures every schedule and its
library baseline on the GPUs (rows with backend=cuda, each point verified against the baseline),
predicts and reports, as `backend=cpu` does on CPU ranks. Without a GPU it still compiles every
kernel and says in one line that it cannot measure here. Issue 53's own GPU figures (host time
per step as one CUDA graph, the fused step against the baseline at world_size=1, the
virtual-rank symmetric kernel, the generated Adam against torch's) come from
`scripts/gpu_figures.py`, one command of a few minutes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def command(argv: list[str]) -> list[str]:
    """The suite command for `argv` (an optional run directory first, then overrides)."""
    out = argv[0] if argv and "=" not in argv[0] else "runs/gpu_check"
    rest = argv[1:] if argv and "=" not in argv[0] else argv
    return [
        sys.executable,
        "-m",
        "suite",
        "experiment=paper",
        "backend=cuda",
        "scale=smoke",
        f"hydra.run.dir={out}",
        *rest,
    ]


if __name__ == "__main__":
    sys.exit(subprocess.run(command(sys.argv[1:]), cwd=REPO, check=False).returncode)
