"""What this machine is: the facts a calibration is keyed by and a report's environment states.

cpu_model() -> str       # /proc/cpuinfo's model name, else platform's
memory_gib() -> float    # /proc/meminfo's MemTotal in GiB (one decimal); None off Linux
compiler() -> str        # the first line of `c++ --version`; "none found" without one
git_commit() -> str      # the checkout's commit (12 digits), "(with uncommitted changes)"
"""

from __future__ import annotations

import platform
import subprocess
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _proc_field(path: str, key: str) -> str | None:
    """The value of `key: value` in a /proc file (None where there is none: not Linux)."""
    with suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def memory_gib() -> float | None:
    total = _proc_field("/proc/meminfo", "MemTotal:")  # "24626364 kB"
    return round(int(total.split()[0]) / 2**20, 1) if total else None


def compiler() -> str:
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0] if out.stdout else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "none found"


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
