"""The CUDA backend without a GPU: every kernel compiles with NVRTC, and runs correctly.

- Compiles: every op x dtype of the CPU build's table (tests/test_build.py) renders and compiles with
  NVRTC through CuPy (PTX for compute_80, each case alone; all of them as one CUBIN for sm_90), and
  so does every schedule of every experiment (`suite.generate` with the CUDA backend, which writes
  the .cu and the PTX for sm_80 and sm_90); the PTX has 16-byte vector loads, no local memory, no
  contracted FMA. Skipped, with the reason, where NVRTC is missing (the `gpu` or `dev` extra
  brings it).
- Runs: the same kernels, compiled for the host by `tests/cuda_emulation.py` (threads as CUDA
  threads, real grid-stride, vector, tail and grid-wide-sum code), equal `dsl.interpret` with the
  CPU build's tolerances, chunked (an odd chunk start takes the unaligned path) and on rank 1 of 2.
- On a GPU (skipped without one): `python -m suite experiment=adam_fusion backend=cuda` measures
  every schedule through the one PlanRunner on the CUDA backend, each point verified.
"""

import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from codegen import build_cuda
from codegen.build import BuildError
from codegen.lower import lower
from codegen.plan import Collective, Compute, Copy
from dsl import bf16, f16, f32, interpret
from dsl.interpret import dropout_keep, global_flat_index

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulation import EmulatedModule  # noqa: E402
from test_build import CASES, TORCH, ULPS, ULPS_HALF, assert_close, extra_programs, inputs, one_op  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SIZE = 4099  # odd: vector loops end in a tail; a second chunk starts unaligned
IDS = [f"{op}-{dt}" for op, dt in CASES]


def _nvrtc_found() -> bool:
    try:
        build_cuda.nvrtc_version()
    except BuildError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(
    not _nvrtc_found(),
    reason="NVRTC not found: install the gpu "
    "extra (pip install -e '.[gpu]', nvidia-cuda-nvrtc-cu12)",
)
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to emulate kernels with")
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU (CUDA) on this machine"
)


@pytest.fixture(scope="module")
def plans():
    cases = {(op, dt): (p := one_op(op, dt), lower(p, {"N": SIZE}, 1)) for op, dt in CASES}
    extras = {k: (p, lower(p, b, w), b) for k, (p, b, w) in extra_programs().items()}
    kernels = [k for _, pl in cases.values() for k in pl.kernels()]
    kernels += [k for _, pl, _ in extras.values() for k in pl.kernels()]
    return SimpleNamespace(cases=cases, extras=extras, kernels=kernels)


# -- NVRTC -------------------------------------------------------------------------------------------
@needs_nvrtc
def test_nvrtc_is_found_and_builds_the_default_archs():
    assert build_cuda.nvrtc_version().startswith(("NVRTC 12.", "NVRTC 13."))
    assert set(build_cuda.DEFAULT_ARCHS) <= set(build_cuda.nvrtc_archs())


@needs_nvrtc
@pytest.mark.parametrize("op, dt", CASES, ids=IDS)
def test_every_op_compiles(plans, op, dt):
    source = build_cuda.module_source(plans.cases[(op, dt)][1].kernels())
    ptx = build_cuda.compile_module(source, "compute_80", "test_op").decode()
    for k in plans.cases[(op, dt)][1].kernels():
        assert f".entry {k.name}(" in ptx


@needs_nvrtc
def test_all_kernels_as_one_cubin_for_sm_90(plans):
    cubin = build_cuda.compile_module(build_cuda.module_source(plans.kernels), "sm_90", "test_all")
    assert cubin[:4] == b"\x7fELF"


@needs_nvrtc
def test_ptx_has_vector_loads_no_local_memory_and_no_contracted_fma(plans):
    adam = build_cuda.module_source(plans.extras["adam"][1].kernels())
    ptx = build_cuda.compile_module(adam, "compute_90", "test_adam").decode()
    assert "ld.global.nc.v2.u64" in ptx or "ld.global.nc.v4" in ptx
    assert ".local" not in ptx
    plain = build_cuda.module_source(plans.cases[("const", f32)][1].kernels())  # x * 0.1 + 3
    text = build_cuda.compile_module(plain, "compute_80", "test_const").decode()
    assert "mul.rn.f32" in text and "add.rn.f32" in text and "fma" not in text


@needs_nvrtc
def test_the_cache_returns_the_compiled_module(plans):
    source = build_cuda.module_source(plans.extras["lamb"][1].kernels())
    first = build_cuda.compile_module(source, "compute_80", "test_cache")
    path = build_cuda.cache_path(source, "compute_80")
    assert path.read_bytes() == first
    start = time.perf_counter()
    assert build_cuda.compile_module(source, "compute_80", "another name") == first
    assert time.perf_counter() - start < 0.05


@needs_nvrtc
def test_a_damaged_cached_module_is_reported_and_compiled_again(plans, capfd):
    source = build_cuda.module_source(plans.extras["adam"][1].kernels())
    good = build_cuda.compile_module(source, "compute_80", "test_damaged")
    path = build_cuda.cache_path(source, "compute_80")
    path.write_bytes(good[: len(good) // 2])  # cut short
    assert build_cuda.compile_module(source, "compute_80", "test_damaged") == good
    assert "does not match its checksum" in capfd.readouterr().err
    assert path.read_bytes() == good


@needs_nvrtc
def test_write_sources_writes_the_cu_and_ptx_per_arch(plans, tmp_path):
    kernels = plans.extras["adam"][1].kernels()
    paths = build_cuda.write_sources(kernels, tmp_path / "kernels", "adam_fusion_AR-C")
    assert [p.name for p in paths] == [
        "adam_fusion_AR-C.cu",
        "adam_fusion_AR-C.sm_80.ptx",
        "adam_fusion_AR-C.sm_90.ptx",
    ]
    assert paths[0].read_text() == build_cuda.module_source(kernels)
    for p, arch in zip(paths[1:], ("sm_80", "sm_90")):
        assert f"\n.target {arch}\n" in p.read_text()


@needs_nvrtc
def test_a_compile_error_is_one_line_with_the_log_kept(monkeypatch):
    monkeypatch.setattr(build_cuda, "module_source", lambda kernels: "this is not CUDA;\n")
    with pytest.raises(BuildError) as err:
        build_cuda.compile_module(build_cuda.module_source([]), "compute_80", "broken")
    assert "\n" not in str(err.value) and "error" in str(err.value)
    assert err.value.log and err.value.log_path.read_text() == err.value.log


@needs_nvrtc
@pytest.mark.parametrize(
    "archs, match", [(["sm80"], "not of the form"), (["sm_999"], "cannot build")]
)
def test_bad_archs_are_named(archs, match):
    with pytest.raises(BuildError, match=match):
        build_cuda.check_archs(archs)


def test_missing_nvrtc_says_how_to_install_it(monkeypatch):
    def missing():
        raise OSError("libnvrtc.so.12: cannot open shared object file")

    monkeypatch.setattr(build_cuda.nvrtc, "getVersion", missing)
    build_cuda.nvrtc_version.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"NVRTC not found .* install the gpu extra"):
            build_cuda.module_name("x")
    finally:
        build_cuda.nvrtc_version.cache_clear()


# -- every experiment, as `python -m suite experiment=NAME backend=cuda` does ------------------------
def _cfg(experiment: str):
    from suite.cli import prevalidate

    return prevalidate([f"experiment={experiment}", "backend=cuda", "scale=smoke"])


@needs_nvrtc
@pytest.mark.parametrize(
    "experiment", ["adam_fusion", "lamb_fusion", "model_parallel", "pipeline_parallel"]
)
def test_generate_writes_every_schedules_source_and_ptx(experiment, tmp_path, capsys):
    import experiments
    from codegen.runtime.cuda_backend import CudaBackend
    from suite.generate import file_name, generate

    exp = experiments.get(experiment)
    schedules = exp.schedules()
    paths = generate(_cfg(experiment), exp, schedules, CudaBackend(), tmp_path)
    assert capsys.readouterr().out.count(" kernels -> ") == len(schedules)
    assert len(paths) == 3 * len(schedules)
    for name in schedules:
        stem = tmp_path / "kernels" / f"{experiment}_{file_name(name)}"
        assert stem.with_suffix(".cu").read_text().count('extern "C" __global__') >= 1
        for arch in ("sm_80", "sm_90"):
            assert f".target {arch}" in Path(f"{stem}.{arch}.ptx").read_text()


def _suite(tmp_path, *args):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "experiment=adam_fusion",
            "scale=smoke",
            "backend=cuda",
            f"hydra.run.dir={tmp_path}",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the run measures")
def test_python_m_suite_backend_cuda_without_a_gpu(tmp_path):
    out = _suite(tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "kernels").glob("*.cu"))) == 5
    assert len(list((tmp_path / "kernels").glob("*.ptx"))) == 10
    said = [ln for ln in out.stdout.splitlines() if "cannot measure" in ln]
    assert len(said) == 1 and "backend cuda" in said[0]


@pytest.mark.slow
def test_an_unknown_arch_is_a_one_line_error(tmp_path):
    out = _suite(tmp_path, "backend.archs=[sm80]")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "sm80" in out.stderr


# -- the kernels, run on the CPU by emulation --------------------------------------------------------
@pytest.fixture(scope="module")
def emulated(plans, tmp_path_factory):
    return EmulatedModule(plans.kernels, tmp_path_factory.mktemp("emulated"))


def run_emulated(mod, plan, program, given: dict, rank: int = 0, chunks: int = 1) -> dict:
    """Run a world-size-1 plan (collectives as copies) with emulated kernels, in `chunks` calls."""
    bufs = {b.id: torch.zeros(b.shape, dtype=TORCH[b.dtype]) for b in plan.buffers}
    for name, bid in plan.inputs:
        x = given.get(name, program.input(name).default)
        if x is not None:
            bufs[bid].copy_(torch.as_tensor(np.asarray(x)).to(TORCH[plan.buffer(bid).dtype]))
    for step in plan.steps:
        if isinstance(step, (Collective, Copy)):
            bufs[step.dst].copy_(bufs[step.src])
            continue
        assert isinstance(step, Compute), step
        k = step.kernel
        for _, b in k.reduces:
            bufs[b].zero_()
        ws = torch.zeros(max(1, mod.launches[k.name].workspace_bytes), dtype=torch.uint8)
        cuts = [k.numel * i // chunks for i in range(chunks + 1)]
        for lo, hi in zip(cuts, cuts[1:]):
            mod.run(k, lo, hi, rank, [bufs[i] for i in k.args()], ws)
    return {
        name: bufs[bid]
        .to(torch.float32 if plan.buffer(bid).dtype is bf16 else bufs[bid].dtype)
        .numpy()
        for name, bid in plan.outputs
    }


@pytest.mark.slow
@needs_cxx
@pytest.mark.parametrize("op, dt", CASES, ids=IDS)
def test_emulated_op_matches_interpret(plans, emulated, op, dt):
    program, plan = plans.cases[(op, dt)]
    given = {
        k: v for k, v in inputs(op, dt, SIZE).items() if k in {i.value.name for i in program.inputs}
    }
    want = interpret(program, [given], 1, {"N": SIZE})[0]
    for chunks in (1, 2):
        got = run_emulated(emulated, plan, program, given, chunks=chunks)
        for name in want:
            out_dt = program.value(dict(program.outputs)[name].id).type.dtype
            what = f"{op} {dt} in {chunks} chunk(s)"
            if op.startswith("sum") and out_dt.is_float and out_dt.eps < 1e-10:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-12, err_msg=what)
            else:
                ulps = (ULPS_HALF if dt in (f16, bf16) else {}).get(op, ULPS.get(op, 0))
                assert_close(got[name], want[name], out_dt, ulps, what)


@needs_cxx
@pytest.mark.parametrize("key", ["drop_sliced", "drop_sliced2"])
def test_emulated_dropout_of_a_slice_on_rank_1_of_2(plans, emulated, key):
    program, plan, bnd = plans.extras[key]
    full = program.inputs[0].value
    shape = tuple(d.evaluate({**bnd, "P": 2}) for d in full.type.shape)
    x = (np.random.default_rng(1).standard_normal(shape) + 5).astype(full.type.dtype.numpy)
    want = interpret(program, [{"x": x}, {"x": x}], 2, bnd)
    for rank in (0, 1):
        got = run_emulated(emulated, plan, program, {"x": x}, rank=rank, chunks=2)["y"]
        np.testing.assert_array_equal(got, want[rank]["y"])
    index = global_flat_index(got.shape, program.outputs[0][1].type.layout, 2, 1)
    attrs = dict(program.body[-1].attrs)
    np.testing.assert_array_equal(got != 0, dropout_keep(attrs["seed"], index, attrs["p"]))


@needs_cxx
def test_emulated_broadcast_and_rank_offset_reads(plans, emulated):
    program, plan, bnd = plans.extras["bias_rows"]
    rng = np.random.default_rng(2)
    r, bias = (
        rng.standard_normal((8, 12)).astype(np.float32),
        rng.standard_normal(12).astype(np.float32),
    )
    xs = [rng.standard_normal((4, 12)).astype(np.float32) for _ in range(2)]
    want = interpret(program, [{"x": xs[i], "r": r, "bias": bias} for i in range(2)], 2, bnd)
    for rank in (0, 1):
        got = run_emulated(
            emulated, plan, program, {"x": xs[rank], "r": r, "bias": bias}, rank=rank
        )
        np.testing.assert_array_equal(got["y"], want[rank]["y"])


@needs_cxx
@pytest.mark.parametrize("key, rtol", [("adam", 0), ("lamb", 1e-6)])
def test_emulated_optimizers_at_world_size_1(plans, emulated, key, rtol):
    program, plan, bnd = plans.extras[key]
    rng = np.random.default_rng(3)
    given = {k: rng.standard_normal(bnd["N"]).astype(np.float32) for k in ("g", "w", "m")}
    given["v"] = rng.random(bnd["N"]).astype(np.float32)
    want = interpret(program, [given], 1, bnd)[0]
    for chunks in (1, 3):
        got = run_emulated(
            emulated, plan, program, {k: v.copy() for k, v in given.items()}, chunks=chunks
        )
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=0)


# -- on a GPU ----------------------------------------------------------------------------------------
@pytest.mark.cuda
@needs_gpu
@needs_nvrtc
def test_python_m_suite_backend_cuda_measures_on_the_gpu(tmp_path):
    import pandas as pd

    out = _suite(tmp_path, "world_size=1")
    assert out.returncode == 0, out.stderr[-2000:]
    df = pd.read_csv(tmp_path / "results.csv")
    measured = df[df.source == "measured"]
    assert len(measured) and set(measured.backend) == {"cuda"} and measured.verified.all()
