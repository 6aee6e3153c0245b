"""Where the suite keeps its caches (compiled kernels, calibrations, font caches).

`cache_dir()`: `$COCONET_CACHE_DIR` where set; else `<checkout>/.cache` when the packages live in a
source checkout (their parent folder holds pyproject.toml: an editable install, or tests run from
the checkout), so caches stay inside the project; else (an installed package)
`$XDG_CACHE_HOME/coconet-suite` (`~/.cache/coconet-suite`). Never inside site-packages.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGES_ROOT = Path(__file__).resolve().parent.parent  # the folder holding the packages


def cache_dir() -> Path:
    if os.environ.get("COCONET_CACHE_DIR"):
        return Path(os.environ["COCONET_CACHE_DIR"])
    if (PACKAGES_ROOT / "pyproject.toml").exists():
        return PACKAGES_ROOT / ".cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coconet-suite"
