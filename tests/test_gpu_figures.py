"""scripts/gpu_figures.py, the one command printing issue 53's GPU figures, as far as a machine
without a GPU shows it: it lists its checks (`--list`), refuses cleanly without a GPU (one line,
exit 69) and rejects an unknown check (exit 2); its checks run end to end on a CPU rank (gloo, the
CPU backend, small sizes: every line printed, replay == eager, the generated Adam equal to
torch's fused Adam), and the virtual-rank check reads the symmetric-memory launcher's result or
says it is not available. The GPU's own figures need a GPU."""

import subprocess
import sys
import types
from pathlib import Path

import pytest

import dsl
from coconet.programs import adam_program, sliced_schedule
from codegen.lower import lower
from codegen.runtime.launch import launch
from codegen.runtime.symm_ranks import only_step

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_figures.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_figures  # noqa: E402

NAMES = ["graph_host", "one_rank", "virtual_ranks", "adam_kernel"]


def _script(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_it_lists_its_checks_and_refuses_cleanly_without_a_gpu():
    out = _script("--list")
    assert out.returncode == 0, out.stderr
    assert [ln.split(":")[0] for ln in out.stdout.splitlines()] == NAMES
    assert "target < 50 us" in out.stdout and ">= 0.95x" in out.stdout
    out = _script("--only", "adam_kernel,graph_host", "--list")
    assert [ln.split(":")[0] for ln in out.stdout.splitlines()] == ["graph_host", "adam_kernel"]
    out = _script()
    assert out.returncode == gpu_figures.NO_GPU == 69
    assert out.stdout.startswith("no GPU here: ") and len(out.stdout.splitlines()) == 1
    assert "Traceback" not in out.stderr
    out = _script("--only", "nope")
    assert out.returncode == gpu_figures.BAD_ARGS and "unknown check 'nope'" in out.stderr


def _checks_on_cpu(rank, world):
    import gpu_figures as g

    g.BACKEND = "cpu"
    g.HOST_N, g.STEP_N, g.ADAM_N = 1 << 10, 1 << 12, 1 << 12
    return {
        name: [*fn()]
        for name, fn in (
            ("graph_host", g.graph_host),
            ("one_rank", g.one_rank),
            ("adam_kernel", g.adam_kernel),
        )
    }


@pytest.mark.slow
def test_the_checks_run_end_to_end_on_a_cpu_rank():
    got = launch(_checks_on_cpu, 1, timeout_s=300)[0]
    for name, figures in got.items():
        for f in figures:
            print(gpu_figures.line(name, f))
        assert all(f.verified for f in figures), name
    host = {f.name: f for f in got["graph_host"]}
    graph = host["host per step, eager (no CUDA graphs on the CPU)"]
    assert graph.met is False and graph.target == "< 50 us"  # no graph: the target is not met
    assert host["graph replay == eager step (w, m, v)"].value == "True"
    assert [f.name for f in got["one_rank"]][-1] == (
        "fuse(RS-C-AG)+as_slice, eager (no CUDA graphs on the CPU)"
    )
    assert got["one_rank"][-1].value.count(" x") == 1
    assert got["adam_kernel"][1].met  # the generated Adam is torch's fused Adam, within 1e-5


def test_the_virtual_rank_check_reads_the_launcher_or_says_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "codegen.runtime.symm", types.ModuleType("symm"))
    (missing,) = gpu_figures.virtual_ranks()
    assert missing.value.startswith("not available: codegen.runtime.symm.run_virtual")
    assert missing.verified and missing.target == ""

    program = sliced_schedule(adam_program())
    monkeypatch.setattr(gpu_figures, "VERIFY_N", 1 << 8)
    monkeypatch.setattr(gpu_figures, "SYMM_N", 1 << 12)
    monkeypatch.setattr(gpu_figures, "copy_gbps", lambda nbytes: 1000.0)
    ms = {2: None, 4: None, 8: None}  # the launch time giving 90%, 60%, 90% of the copy
    calls = []

    def run_virtual(plan, inputs, launches=1):
        """The launcher's contract: dsl.interpret's outputs (member 0's wrong at P=8)."""
        P = plan.P
        calls.append((P, launches))
        if not any(inputs):  # the timed launches
            gbps = {2: 900.0, 4: 600.0, 8: 900.0}[P]
            ms[P] = gpu_figures.symm_bytes(only_step(plan)) / (gbps * 1e6)
            return [{}] * P, ms[P]
        out = dsl.interpret(program, inputs, P, {"N": gpu_figures.VERIFY_N})
        if P == 8:
            out[0]["w"] = out[0]["w"] + 1.0
        return out, 1.0

    symm = types.ModuleType("symm")
    symm.run_virtual = run_virtual
    monkeypatch.setitem(sys.modules, "codegen.runtime.symm", symm)
    copy, p2, p4, p8 = gpu_figures.virtual_ranks()
    assert calls == [(2, 1), (2, 3), (4, 1), (4, 3), (8, 1), (8, 3)]
    assert copy.value == "1000 GB/s"
    assert p2.value.endswith("900 GB/s = 90% of a copy") and (p2.met, p2.verified) == (True, True)
    assert p4.value.endswith("600 GB/s = 60% of a copy") and (p4.met, p4.verified) == (False, True)
    assert not p8.verified and p8.name.startswith("P=8: verified False")
    assert "MISSED" in gpu_figures.line("virtual_ranks", p4)


def test_the_symmetric_kernels_bytes_are_every_members_reads_and_writes():
    """fuse(RS-C-AG)+as_slice of Adam: a member reads its block of the P gradients, its w, m, v
    slices and writes m, v and its w slice into the P members' w: (2P + 5) slices of N/P."""
    program = sliced_schedule(adam_program())
    for P in (2, 4, 8):
        step = only_step(lower(program, {"N": 1 << 12}, P, fused_chunks=4))
        assert gpu_figures.symm_bytes(step) == (2 * P + 5) * (1 << 12) * 4


@pytest.mark.parametrize("only", [None, "one_rank"])
def test_select_keeps_the_checks_order(only):
    names = [c.name for c in gpu_figures.select(only)]
    assert names == (NAMES if only is None else ["one_rank"])
