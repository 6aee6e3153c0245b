"""The transformer ops on the CUDA backend: NVRTC compiles them, the host emulation runs them.

- Compiles: every op x dtype of tests/test_ops_transformer.py (and the rank-offset row kernels)
  as one module for compute_80 (PTX: each kernel an entry, no local memory)
  and as a CUBIN for sm_90. Skipped where NVRTC is missing.
- Runs: the same kernels compiled for the host by tests/cuda_emulation.py (64 threads a block,
  up to 3 blocks: a row kernel's blocks stride over the rows and combine each row's max and sums
  by warp shuffles and shared memory) equal `dsl.interpret` within the tolerances of
  tests/test_ops_transformer.py (the emulation's math is the host's libm, not CUDA's), in one
  call and cut into pieces that split rows, and on rank 1 of 2 reading its rows of a
  Replicated matrix.
- On a GPU (skipped without one): the compiled module on the device, against the interpreter
  and within the error bounds (CUDA's tanhf/erff 2 ulp, erfcf 4 ulp).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from codegen import build_cuda
from codegen.lower import lower
from codegen.plan import Collective, Compute, Copy
from dsl import bf16, f32, interpret

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulation import EmulatedModule  # noqa: E402
from test_build import TORCH, assert_close  # noqa: E402
from test_build_cuda import needs_gpu, needs_nvrtc, run_emulated  # noqa: E402
from test_ops_transformer import (  # noqa: E402
    CASES,
    IDS,
    ROW,
    SIZES,
    assert_kernel,
    draw,
    one_op,
    sliced_rows,
)

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to emulate kernels with")


@pytest.fixture(scope="module")
def plans():
    cases = {(op, dt): (p := one_op(op, dt), lower(p, SIZES, 1)) for op, dt in CASES}
    rows = {op: (p := sliced_rows(op), lower(p, SIZES, 2)) for op in ROW}
    kernels = [k for _, pl in list(cases.values()) + list(rows.values()) for k in pl.kernels()]
    return cases, rows, list({k.name: k for k in kernels}.values())


# -- NVRTC -------------------------------------------------------------------------------------------
@needs_nvrtc
def test_every_transformer_op_compiles_to_ptx(plans):
    _, _, kernels = plans
    ptx = build_cuda.compile_module(
        build_cuda.module_source(kernels), "compute_80", "test_tf"
    ).decode()
    for k in kernels:
        assert f".entry {k.name}(" in ptx
    assert ".local" not in ptx  # (CUDA's exp and erfc use fma themselves: no check for it)


@needs_nvrtc
def test_every_transformer_op_compiles_to_a_cubin_for_sm_90(plans):
    _, _, kernels = plans
    cubin = build_cuda.compile_module(build_cuda.module_source(kernels), "sm_90", "test_tf90")
    assert cubin[:4] == b"\x7fELF"


def test_row_kernels_launch_without_vectors_or_sums(plans):
    cases, _, _ = plans
    for op in ROW:
        (k,) = cases[(op, f32)][1].kernels()
        launch = build_cuda.launches([k])[k.name]
        assert (launch.vec, launch.sums, launch.workspace_bytes) == (1, 0, 0)


# -- emulated on the host ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulated(plans, tmp_path_factory):
    return EmulatedModule(plans[2], tmp_path_factory.mktemp("emulated_tf"))


@needs_cxx
@pytest.mark.parametrize("op, dt", CASES, ids=IDS)
def test_emulated_op_matches_interpret(plans, emulated, op, dt):
    program, plan = plans[0][(op, dt)]
    x = draw(dt, seed=1)
    want = interpret(program, [{"x": x}], 1, SIZES)[0]["y"]
    for chunks in (1, 5):  # 5 pieces of 24 x 37 elements: every cut splits a row
        got = run_emulated(emulated, plan, program, {"x": x}, chunks=chunks)["y"]
        assert_kernel(got, want, x, op, dt, f"{op} {dt} in {chunks} piece(s)")


@needs_cxx
@pytest.mark.parametrize("op", ROW)
def test_emulated_row_op_of_rank_1s_rows(plans, emulated, op):
    program, plan = plans[1][op]
    x = draw(f32, seed=2)
    want = interpret(program, [{"x": x}, {"x": x}], 2, SIZES)
    for rank in (0, 1):
        got = run_emulated(emulated, plan, program, {"x": x}, rank=rank)["y"]
        assert_close(got, want[rank]["y"], f32, 1, f"{op} rank {rank}")


# -- on a GPU ----------------------------------------------------------------------------------------
def run_device(plan, program, fns, given: dict) -> dict:
    """A world-size-1 plan on the GPU (collectives as copies)."""
    dev = torch.device("cuda")
    bufs = {b.id: torch.zeros(b.shape, dtype=TORCH[b.dtype], device=dev) for b in plan.buffers}
    for name, bid in plan.inputs:
        bufs[bid].copy_(torch.as_tensor(given[name]).to(TORCH[plan.buffer(bid).dtype]))
    for step in plan.steps:
        if isinstance(step, (Collective, Copy)):
            bufs[step.dst].copy_(bufs[step.src])
            continue
        assert isinstance(step, Compute), step
        k = step.kernel
        fns[k.name](0, k.numel, 0, [bufs[i] for i in k.args()])
    torch.cuda.synchronize()
    out = {}
    for name, bid in plan.outputs:
        t = bufs[bid].cpu()
        out[name] = (t.float() if plan.buffer(bid).dtype is bf16 else t).numpy()
    return out


@needs_gpu
@needs_nvrtc
def test_on_the_gpu_every_op_matches_interpret(plans):
    cases, _, kernels = plans
    fns = build_cuda.build(kernels, name="test_tf_gpu")
    for (op, dt), (program, plan) in cases.items():
        x = draw(dt, seed=1)
        want = interpret(program, [{"x": x}], 1, SIZES)[0]["y"]
        got = run_device(plan, program, fns, {"x": x})["y"]
        assert_kernel(got, want, x, op, dt, f"{op} {dt} on the GPU")
        assert np.isfinite(got).all()
