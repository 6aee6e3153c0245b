"""scripts/gpu_check.py without a GPU: it imports, parses its arguments, counts the bytes its
benchmarks move as the lowering does, and ends with one line and status 2 where no GPU is present.
(What it does on a GPU is covered by the runtime's tests and by running it there.)"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402


def test_defaults():
    args = gpu_check.parse_args([])
    assert args.log2_size == 28 and args.world_size is None and args.scale == "default"
    assert args.experiments == ["adam_fusion", "lamb_fusion", "model_parallel", "pipeline_parallel"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--experiments", "collectives"])  # no DSL program to run
    assert not args.skip_verify and not args.skip_bench and args.repeats >= 1


def test_arguments():
    args = gpu_check.parse_args(["--experiments", "adam_fusion", "lamb_fusion", "--world-size", "2",
                                 "--log2-size", "20", "--repeats", "3", "--skip-bench"])
    assert args.experiments == ["adam_fusion", "lamb_fusion"] and args.world_size == 2
    assert args.log2_size == 20 and args.repeats == 3 and args.skip_bench


@pytest.mark.parametrize("argv", [["--log2-size", "0"], ["--world-size", "-1"],
                                  ["--experiments", "bert"], ["--repeats", "x"], ["--scale", "huge"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.parse_args(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err


@pytest.mark.parametrize("optimizer, kernels, per_element", [("adam", 1, 7 * 4), ("lamb", None, None)])
def test_benchmarked_kernels_and_bytes(optimizer, kernels, per_element):
    n = 1 << 12
    plan, computes = gpu_check.optimizer_plan(optimizer, n)
    assert plan.schedule == "AR-C" and plan.world_size == 1 and len(computes) == (kernels or len(plan.kernels()))
    nbytes = gpu_check.bytes_moved(computes)
    assert nbytes == (per_element * n if per_element else sum(c.nbytes for c in computes))
    assert gpu_check.gbps(nbytes, 1.0) == pytest.approx(nbytes / 1e6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the script would run")
def test_without_a_gpu_one_line_and_status_2():
    out = subprocess.run([sys.executable, str(SCRIPT), "--skip-bench"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no GPU" in out.stderr
