"""scripts/gpu_check.py is the suite's own command with backend=cuda (what it does on a GPU and
without one is tested through that command in tests/test_build_cuda.py)."""

import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402


def test_the_command_is_the_suites():
    cmd = gpu_check.command([])
    assert cmd[1:] == [
        "-m",
        "suite",
        "experiment=paper",
        "backend=cuda",
        "scale=smoke",
        "hydra.run.dir=runs/gpu_check",
    ]
    cmd = gpu_check.command(["/tmp/x", "world_size=4"])
    assert cmd[-2:] == ["hydra.run.dir=/tmp/x", "world_size=4"]
    assert gpu_check.command(["seed=3"])[-2:] == ["hydra.run.dir=runs/gpu_check", "seed=3"]
