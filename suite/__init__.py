"""coconet-suite's entry point and orchestration: `python -m suite experiment=NAME [key=value ...]`.

`PROJECT_ROOT` is the checkout this package lives in and `CONF_DIR` its Hydra configuration
(`conf/`, found next to this package, so install the project editable: `pip install -e .`).
Importing the package points matplotlib's and torch's build caches into the project's `.cache/`
(unless the environment already sets them), so generated kernels and font caches stay inside it.
"""
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"
CACHE_DIR = PROJECT_ROOT / ".cache"

os.environ.setdefault("MPLCONFIGDIR", str(CACHE_DIR / "matplotlib"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(CACHE_DIR / "torch_extensions"))
