"""coconet-suite's entry point and orchestration: `python -m suite experiment=NAME [key=value ...]`.

`PROJECT_ROOT` is the folder the packages live in (a checkout, or site-packages), `CONF_DIR` the
Hydra configuration this package ships (`suite/conf/`, package data: an installed package finds
it as an editable one does). Importing the package points matplotlib's font cache
into the suite's cache (`codegen.cache.cache_dir`: the checkout's `.cache/`, or the user's cache
folder for an installed package; unless the environment already sets them).
"""

import os
from pathlib import Path

from codegen.cache import cache_dir

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = Path(__file__).resolve().parent / "conf"
CACHE_DIR = cache_dir()
os.environ.setdefault("COCONET_CACHE_DIR", str(CACHE_DIR))  # the same for every process

os.environ.setdefault("MPLCONFIGDIR", str(CACHE_DIR / "matplotlib"))
