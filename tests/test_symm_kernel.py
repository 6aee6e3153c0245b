"""comm=symm on cuda: the fused all-reduce as one generated kernel over symmetric memory, checked
without a GPU.

- Plan side (`codegen.symm_fuse`): Adam's fused steps become one kernel that reads every member's
  gradient block and writes every member's gather destination; LAMB's (a barrier inside) is
  refused with a `SymmError` naming why.
- One chunk schedule: the table rendered into the kernel is `chunk_bounds`, and comm=shm's
  `pipelined.peer_fused` runs its kernels on exactly those ranges, in that order.
- Compiles: NVRTC builds it for sm_80, sm_90 and sm_100 (CUBIN) with acquire/release flags.
- Runs (tests/cuda_emulation.py: every block of every member at once, one std::thread per CUDA
  thread): for P = 2, 4, 8 on adam_fusion's `fuse(RS-C-AG)+as_slice` and `fuse(RS-C-AG)`,
  replayed twice without resetting the pads, over virtual ranks (`codegen.runtime.symm_ranks`):
  bit-equal to comm=shm's kernels (the C++ build of `codegen.shm_fuse`'s, the same f32 additions
  in the same order), within `dsl.error_bounds` of `dsl.interpret` for every P (which sums the P
  gradients in float64) and bit-equal to it at P = 2. Launched one member at a time (as on real
  GPUs: one launch per rank), the first members wait until the last one has run.
- The suite: `backend.comm=symm` writes the kernels of every schedule and says in one line that
  it cannot measure here.
"""

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import dsl
from codegen import build_cuda
from codegen.build import build
from codegen.chunk_schedule import chunk_bounds
from codegen.lower import lower
from codegen.plan import FusedCollective
from codegen.render_symm import PadLayout, render_step, symm_launch
from codegen.runtime import backend as backends
from codegen.runtime.backend import TORCH
from codegen.runtime.symm_ranks import VirtualRanks, only_step
from codegen.shm_fuse import peer_step
from codegen.symm_fuse import SymmError, symm_step, symm_steps
from experiments import adam_fusion, lamb_fusion

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulation import EmulatedModule  # noqa: E402
from test_build_cuda import needs_cxx, needs_nvrtc  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ADAM = ("fuse(RS-C-AG)+as_slice", "fuse(RS-C-AG)")


def _plan(name, P, n=96, chunks=4, experiment=adam_fusion):
    b = {"N": n * P}
    prog = experiment.schedules()[name]
    return prog, b, lower(prog, b, P, fused_chunks=chunks)


# -- the Plan rewrite ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ADAM)
def test_the_kernel_reads_every_members_gradient_and_writes_every_members_destination(name):
    _, _, plan = _plan(name, 4)
    ps = peer_step(plan, plan.steps[0])
    step = only_step(plan)
    k = step.kernel
    assert {a.buffer for a in k.reads} >= set(step.peers) and len(step.peers) == 4
    assert len(step.pushes) == len(ps.gathers)
    for p in step.pushes:
        assert len(p.targets) == 4 and {t for _, t in k.writes} >= set(p.targets)
        assert p.src not in {b for _, b in k.writes}  # no slot for the peers to read: pushed
    assert not set(ps.own_blocks) & {b for _, b in k.writes}
    assert set(step.symmetric) == {ps.head.src} | {g.dst for g in ps.gathers}
    assert set(step.symmetric) <= set(step.slots)


def test_lambs_barrier_is_refused_with_why():
    _, _, plan = _plan("fuse(RS-C-AG)", 2, experiment=lamb_fusion)
    (f,) = [s for s in plan.steps if isinstance(s, FusedCollective)]
    with pytest.raises(SymmError, match="0-d all_reduce inside"):
        symm_step(plan, f)
    steps, refused = symm_steps(plan)
    assert not steps and "LAMB's norms" in refused[f.id]


def test_one_member_is_refused():
    _, _, plan = _plan("fuse(RS-C-AG)", 1)
    with pytest.raises(SymmError, match="one member"):
        symm_step(plan, plan.steps[0])


# -- one chunk schedule ----------------------------------------------------------------------------
class _Ring:
    def __init__(self, peers):
        self._peers = peers

    def start(self, send=True):
        return self

    def peers(self):
        return self._peers

    def send_chunk(self, c):
        pass

    def wait_chunk(self, c):
        pass

    def wait(self):
        pass


class _Gather:
    def __init__(self, n):
        self.slot, self.own_block = torch.zeros(n), torch.zeros(n)

    def start_chunk(self, c):
        pass

    def wait(self, own=True):
        pass


class _Runner:
    """What `pipelined.peer_fused` uses of a PlanRunner, recording the kernels' element ranges."""

    def __init__(self, plan, n):
        self.plan, self.calls = plan, []
        self.bufs = {b.id: torch.zeros(b.shape) for b in plan.buffers}
        r = self

        class Comm:
            def reduce_scatter_chunks(self, x, out, op, C, reduce=True):
                return _Ring([torch.zeros(n) for _ in range(plan.P)])

            def all_gather_chunks(self, src, out, C, in_slot=False):
                return _Gather(src.numel())

        self.comm = Comm()
        r.compute = lambda s, lo, hi, zero=False, bufs=None: self.calls.append((lo, hi))


@pytest.mark.parametrize("P, n, chunks", [(2, 96, 4), (4, 100, 3), (8, 7, 4)])
def test_the_kernels_chunk_schedule_is_the_shm_paths(P, n, chunks):
    from codegen.runtime.pipelined import peer_fused

    _, _, plan = _plan("fuse(RS-C-AG)+as_slice", P, n=n, chunks=chunks)
    step = only_step(plan)
    table = re.search(r"_chunks\[\d+\]\[2\] = \{(.*)\};", render_step(step)).group(1)
    rendered = tuple(tuple(map(int, pair)) for pair in re.findall(r"\{(\d+), (\d+)\}", table))
    assert rendered == step.chunks == chunk_bounds(step.n, plan.steps[0].chunks)
    r = _Runner(plan, step.n)
    peer_fused(r, plan.steps[0], peer_step(plan, plan.steps[0]))
    assert tuple(r.calls) == rendered  # comm=shm runs its kernel on the same ranges, in order


def test_the_pad_layout_has_a_word_for_every_flag():
    lay = PadLayout(8, 4)
    words = [
        lay.epoch,
        lay.exit,
        *range(lay.count, lay.count + 4),
        *range(lay.ready, lay.ready + 8),
        *range(lay.done, lay.done + 32),
    ]
    assert sorted(words) == list(range(lay.words)) and lay.nbytes % 128 == 0


# -- NVRTC -----------------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("name", ADAM)
def test_it_compiles_for_sm_80_sm_90_and_sm_100(name):
    _, _, plan = _plan(name, 4, n=1024)
    step = only_step(plan)
    source = build_cuda.module_source(plan.kernels() + [step])
    for arch in ("sm_80", "sm_90", "sm_100"):
        assert build_cuda.compile_module(source, arch, "test_symm")[:4] == b"\x7fELF"
    ptx = build_cuda.compile_module(source, "compute_90", "test_symm").decode()
    assert f".entry {step.name}(" in ptx
    assert "ld.acquire.sys" in ptx and "st.release.sys" in ptx
    assert symm_launch(step).table_len == (len(step.slots) + 1) * 4


# -- run, emulated on the CPU ----------------------------------------------------------------------
def shm_reference(plan, inputs):
    """comm=shm's kernels (the C++ build of codegen.shm_fuse's), member by member, chunk by chunk
    (`chunk_bounds`), then the all-gathers as copies: what `pipelined.peer_fused` computes."""
    f, P = plan.steps[0], plan.P
    ps = peer_step(plan, f)
    fns = build([s.kernel for s in ps.kernels])
    ids, bufs = dict(plan.inputs), []
    for given in inputs:
        d = {b.id: torch.zeros(b.shape, dtype=TORCH[b.dtype]) for b in plan.buffers}
        for name, v in plan.defaults:
            d[ids[name]].fill_(v)
        for name, a in given.items():
            d[ids[name]].copy_(torch.from_numpy(np.array(a)).reshape(d[ids[name]].shape))
        bufs.append(d)
    n = ps.kernels[0].kernel.numel
    srcs = [{g.src: bufs[j][g.src].clone() for g in ps.gathers} for j in range(P)]
    for me in range(P):
        view = dict(bufs[me])
        view.update(
            {
                pb: bufs[i][ps.head.src].view(-1)[me * n : (me + 1) * n]
                for i, pb in enumerate(ps.peer_buffers)
            }
        )
        for o, g in zip(ps.own_blocks, ps.gathers):
            k = plan.buffer(g.src).numel
            view[o] = bufs[me][g.dst].view(-1)[me * k : (me + 1) * k]
            view[g.src] = srcs[me][g.src]
        for s in ps.kernels:
            for lo, hi in chunk_bounds(s.kernel.numel, f.chunks):
                fns[s.kernel.name](lo, hi, me, [view[b] for b in s.kernel.args()])
    for j in range(P):
        for g in ps.gathers:
            k = plan.buffer(g.src).numel
            for i in range(P):
                if i != j:
                    bufs[j][g.dst].view(-1)[i * k : (i + 1) * k].copy_(srcs[i][g.src].view(-1))
    return [{name: bufs[j][b].numpy().copy() for name, b in plan.outputs} for j in range(P)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("symm")


def _host(shape, dtype):
    return torch.zeros(shape, dtype=dtype)


@needs_cxx
@pytest.mark.parametrize("P", [2, 4, 8])
@pytest.mark.parametrize("name", ADAM)
def test_emulated_virtual_ranks_match_shm_and_the_interpreter(name, P, workdir):
    prog, b, plan = _plan(name, P, n=96 + 4 * P + 1)  # odd slices: vector path, then the tail
    step = only_step(plan)
    mod = EmulatedModule([], workdir, steps=[step])
    vr = VirtualRanks(plan, step, _host)
    rng = np.random.default_rng(P)
    for launch in (1, 2):  # a replay: the pads are not reset, the epoch counts up
        inputs = dsl.random_inputs(prog, P, b, rng)
        want, bounds = dsl.interpret(prog, inputs, P, b), dsl.error_bounds(prog, inputs, P, b)
        ref = shm_reference(plan, inputs)
        vr.load(inputs)
        mod.run_symm(step, 2, P, 0, vr.table)
        got = vr.outputs()
        assert vr.epochs() == [launch] * P
        for j in range(P):
            assert dsl.runs_agree(got[j], want[j], bounds[j]), (name, P, j)
            for out in got[j]:
                np.testing.assert_array_equal(got[j][out], ref[j][out], err_msg=f"{out}@{j}")
                if P == 2:
                    np.testing.assert_array_equal(got[j][out], want[j][out])


@needs_cxx
def test_members_launched_apart_wait_for_each_other(tmp_path):
    """One launch per member (grid (B, 1), rank0 = member), as on real GPUs: the first members'
    kernels do not return until the last member has launched and pushed its chunks."""
    P = 3
    prog, b, plan = _plan("fuse(RS-C-AG)+as_slice", P)
    step = only_step(plan)
    mod = EmulatedModule([], tmp_path, steps=[step])
    vr = VirtualRanks(plan, step, _host)
    inputs = dsl.random_inputs(prog, P, b, np.random.default_rng(7))
    vr.load(inputs)
    early = [
        threading.Thread(target=mod.run_symm, args=(step, 2, 1, j, vr.table)) for j in range(P - 1)
    ]
    for t in early:
        t.start()
    time.sleep(1.0)
    assert all(t.is_alive() for t in early), "a member returned before its peers had run"
    mod.run_symm(step, 2, 1, P - 1, vr.table)
    for t in early:
        t.join(timeout=60)
        assert not t.is_alive()
    ref = shm_reference(plan, inputs)
    for j, got in enumerate(vr.outputs()):
        for out in got:
            np.testing.assert_array_equal(got[out], ref[j][out])


# -- the backend and the suite ---------------------------------------------------------------------
def test_comm_symm_selects_the_symm_backend_and_refuses_unknown_comms():
    from codegen.runtime.symm import SymmBackend

    be = backends.get("cuda", comm="symm", archs=["sm_80"])
    assert isinstance(be, SymmBackend) and be.name == "cuda"
    _, _, plan = _plan("fuse(RS-C-AG)", 2)
    assert [s.name for s in be.step_kernels(plan)] == [only_step(plan).name]
    assert backends.get("cpu").step_kernels(plan) == []
    with pytest.raises(ValueError, match="known: nccl, symm"):
        backends.get("cuda", comm="shm")
    if not torch.cuda.is_available():
        assert "\n" not in be.cannot_run()


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_python_m_suite_backend_comm_symm_without_a_gpu(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "experiment=adam_fusion",
            "scale=smoke",
            "backend=cuda",
            "backend.comm=symm",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said = [ln for ln in out.stdout.splitlines() if "cannot measure" in ln]
    assert len(said) == 1 and "backend cuda" in said[0]
    fused = (tmp_path / "kernels" / "adam_fusion_fuse_RS-C-AG.cu").read_text()
    assert re.search(r'extern "C" __global__ void __launch_bounds__\(256\)\nsymm_', fused)
    assert (
        ".entry symm_" in (tmp_path / "kernels" / "adam_fusion_fuse_RS-C-AG.sm_90.ptx").read_text()
    )
    assert "symm_" not in (tmp_path / "kernels" / "adam_fusion_AR-C.cu").read_text()
