"""Compiled kernels against `dsl.interpret`: every op kind through real lowering of one-op programs.

All the kernels of this file compile as ONE module (one build, cached in the project's build
cache), plus one tiny module built by three processes at once in a fresh cache.

Tolerances: f32/f64 elementwise results are bit-equal to the interpreter (it computes in the same
type; the module is built without FMA contraction), except `exp` and `pow` (libm against numpy's
own SIMD loops: 1 ulp). f16/bf16 one-op results are bit-equal too (numpy computes f16 ops in f32
and rounds once, as the kernel does); integers are exact. Sums accumulate in double in another
order and round once: 1 ulp of the dtype (f64: 1e-12 relative). Chunked runs equal one run.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from codegen import build as build_mod
from codegen.build import BuildError, build, module_source, write_sources
from codegen.lower import lower
from codegen.plan import Collective, Compute, Copy
from codegen.render_cpp import CppRenderer
from dsl import Builder, Local, P, Replicated, Sliced, bf16, f16, f32, f64, i32, i64, interpret, sym
from dsl.interpret import dropout_keep, global_flat_index
from dsl.ops import BINARY, COMPARE, UNARY
from dsl.types import DType

N, M, K = sym("N"), sym("M"), sym("K")
SIZE = (
    40003  # above the OpenMP threshold (32768) in one run, below it in halves; odd (vector tails)
)
TORCH = {
    f16: torch.float16,
    bf16: torch.bfloat16,
    f32: torch.float32,
    f64: torch.float64,
    i32: torch.int32,
    i64: torch.int64,
    DType.bool: torch.bool,
}
CAST_TO = {f32: i32, f64: f32, f16: f32, bf16: f32, i32: f64, i64: f32}
SPOT = (
    "add",
    "mul",
    "div",
    "sqrt",
    "exp",
    "maximum",
    "lt",
    "where",
    "cast",
    "dropout",
    "sumsq",
    "const",
)
INT_OPS = (
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "lt",
    "eq",
    "neg",
    "where",
    "cast",
    "sum",
    "sumsq",
    "const",
)
R = CppRenderer()
ALL = BINARY + COMPARE + UNARY + ("where", "cast", "dropout", "sum", "sumsq", "update", "const")
CASES = (
    [(op, dt) for op in ALL for dt in (f32, f64)]
    + [(op, dt) for op in SPOT for dt in (f16, bf16)]
    + [(op, i32) for op in INT_OPS]
    + [("div", i64), ("sumsq", i64), ("maximum", i64)]
    + [("cast_f16", f32), ("cast_bf16", f32), ("cast_bool", f32)]
)
ULPS = {"exp": 3, "pow": 1, "sum": 1, "sumsq": 1}
ULPS_HALF = {"const": 1}  # two ops: the interpreter rounds f16/bf16 in between, the kernel does not


def one_op(op: str, dt: DType):
    b = Builder(f"{op}_{dt}")
    x, y = b.input("x", dt, [N], Local()), b.input("y", dt, [N], Local())
    if op in BINARY + COMPARE:
        out = b.op(op, x, y)
    elif op in UNARY or op == "sum":
        out = b.op(op, x)
    elif op == "sumsq":
        out = b.sum(x * x)
    elif op == "where":
        out = b.where(b.input("c", DType.bool, [N], Local()), x, y)
    elif op.startswith("cast"):
        out = b.cast(
            x, {"cast_f16": f16, "cast_bf16": bf16, "cast_bool": DType.bool}.get(op, CAST_TO[dt])
        )
    elif op == "dropout":
        out = b.dropout(x, p=0.3, seed=7)
    elif op == "update":
        b.update(y, x)
        return b.build()
    else:  # constants take the statement's dtype, rounded to it
        out = b.op("add", b.op("mul", x, 0.1), 3)
    b.output("out", out)
    return b.build()


def inputs(op: str, dt: DType, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    if dt.is_float:
        x, y = rng.standard_normal(n) * 3, rng.standard_normal(n) * 3
        if (
            op not in ("sum", "sumsq", "cast") and n >= 6
        ):  # NaN propagation, inf, 0/0, ties of -0 and +0
            x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
            y[:6] = [1.0, np.nan, 2.0, 0.0, 0.0, -0.0]
    else:
        x, y = (
            rng.integers(-8, 9, n),
            rng.integers(0 if op == "pow" else -8, 6 if op == "pow" else 9, n),
        )
    return {"x": x.astype(dt.numpy), "y": y.astype(dt.numpy), "c": rng.random(n) < 0.5}


# -- running a plan on torch tensors, one rank ------------------------------------------------------
def run_plan(plan, program, fns, given: dict, rank: int = 0, chunks: int = 1) -> dict:
    bufs = {}
    for b in sorted(plan.buffers, key=lambda b: b.alias is not None):
        bufs[b.id] = (
            bufs[b.alias] if b.alias is not None else torch.zeros(b.shape, dtype=TORCH[b.dtype])
        )
    for name, bid in plan.inputs:
        x = given.get(name, program.input(name).default)
        if x is not None:
            bufs[bid].copy_(torch.as_tensor(np.asarray(x)).to(TORCH[plan.buffer(bid).dtype]))
    for step in plan.steps:
        if isinstance(step, (Collective, Copy)):
            assert isinstance(step, Copy) or plan.P == 1, "only world-size-1 collectives here"
            bufs[step.dst].copy_(bufs[step.src])
            continue
        assert isinstance(step, Compute), step
        k = step.kernel
        for _, b in k.reduces:
            bufs[b].zero_()
        cuts = [k.numel * i // chunks for i in range(chunks + 1)]
        for lo, hi in zip(cuts, cuts[1:]):
            fns[k.name](lo, hi, rank, [bufs[i] for i in k.args()])
    return {
        name: bufs[bid]
        .to(torch.float32 if plan.buffer(bid).dtype is bf16 else bufs[bid].dtype)
        .numpy()
        for name, bid in plan.outputs
    }


def assert_close(got: np.ndarray, want: np.ndarray, dt: DType, ulps: int = 0, what: str = ""):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if not dt.is_float:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    with np.errstate(all="ignore"):
        _assert_ulps(got, want, dt, ulps, what)


def _assert_ulps(got, want, dt, ulps, what):
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions")
    g, w = got[~nan], want[~nan]
    ulp = np.spacing(np.maximum(np.abs(g), np.abs(w)).astype(want.dtype))
    if dt is bf16:
        ulp = ulp * 2.0**16  # bf16 is stored as f32: its ulp is 2^16 f32 ulps
    bad = (g != w) & ~(np.abs(g.astype(np.float64) - w) <= ulps * ulp)
    assert not bad.any(), (
        f"{what}: {bad.sum()} elements off by more than {ulps} ulp, e.g. "
        f"got {g[bad][:3]} want {w[bad][:3]}"
    )


# -- the one module ---------------------------------------------------------------------------------
def extra_programs():
    """(name, program, bindings, world_size) beyond the one-op table."""
    b = Builder("drop_sliced")  # a Replicated tensor read as this rank's slice, then dropout
    x = b.input("x", f32, [N], Replicated())
    b.output("y", b.dropout(b.slice(x), p=0.5, seed=3))
    drop1 = b.build()
    b = Builder("drop_sliced2")  # the same along dim 1 of a matrix: a non-contiguous global index
    x = b.input("x", f16, [M, K], Replicated())
    b.output("y", b.dropout(b.slice(x, dim=1), p=0.25, seed=11))
    drop2 = b.build()
    b = Builder("bias_rows")  # Sliced rows + a Replicated matrix read as rows + a broadcast bias
    xs = b.input("x", f32, [M / P, K], Sliced(0))
    r = b.input("r", f32, [M, K], Replicated())
    bias = b.input("bias", f32, [K], Replicated())
    b.output("y", (xs + r) + bias)
    rows = b.build()
    from experiments.optimizers import adam_program, lamb_program

    return {
        "drop_sliced": (drop1, {"N": 64}, 2),
        "drop_sliced2": (drop2, {"M": 6, "K": 20}, 2),
        "bias_rows": (rows, {"M": 8, "K": 12}, 2),
        "adam": (adam_program(), {"N": 1003}, 1),
        "lamb": (lamb_program(), {"N": 1003}, 1),
    }


@pytest.fixture(scope="module")
def compiled():
    """The one-op cases, the extra programs and their functions: one build for the whole file."""
    plans = {(op, dt): (p := one_op(op, dt), lower(p, {"N": SIZE}, 1)) for op, dt in CASES}
    extras = {k: (p, lower(p, bnd, w), bnd) for k, (p, bnd, w) in extra_programs().items()}
    kernels = [k for _, pl in plans.values() for k in pl.kernels()]
    kernels += [k for _, pl, _ in extras.values() for k in pl.kernels()]
    return SimpleNamespace(
        plans=plans, extras=extras, kernels=kernels, fns=build(kernels, name="test_build")
    )


@pytest.mark.parametrize("op, dt", CASES, ids=[f"{op}-{dt}" for op, dt in CASES])
def test_op_matches_interpret(compiled, op, dt):
    program, plan = compiled.plans[(op, dt)]
    given = {
        k: v for k, v in inputs(op, dt, SIZE).items() if k in {i.value.name for i in program.inputs}
    }
    want = interpret(program, [given], 1, {"N": SIZE})[0]
    for chunks in (1, 2):
        got = run_plan(plan, program, compiled.fns, given, chunks=chunks)
        for name in want:
            out_dt = program.value(dict(program.outputs)[name].id).type.dtype
            what = f"{op} {dt} in {chunks} chunk(s)"
            if op.startswith("sum") and out_dt is f64:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-12, err_msg=what)
            else:
                ulps = (ULPS_HALF if dt in (f16, bf16) else {}).get(op, ULPS.get(op, 0))
                assert_close(got[name], want[name], out_dt, ulps, what)


@pytest.mark.parametrize("op, dt", [c for c in CASES if not c[0].startswith("sum")][::7])
def test_chunks_equal_one_run_exactly(compiled, op, dt):
    program, plan = compiled.plans[(op, dt)]
    given = inputs(op, dt, SIZE, seed=5)
    one = run_plan(plan, program, compiled.fns, given)
    for chunks in (2, 3):
        for name, got in run_plan(plan, program, compiled.fns, given, chunks=chunks).items():
            np.testing.assert_array_equal(got, one[name])


@pytest.mark.parametrize("key", ["drop_sliced", "drop_sliced2"])
def test_dropout_of_a_slice_on_rank_1_of_2_keeps_the_interpreters_elements(compiled, key):
    program, plan, bnd = compiled.extras[key]
    full = program.inputs[0].value
    shape = tuple(d.evaluate({**bnd, "P": 2}) for d in full.type.shape)
    x = (np.random.default_rng(1).standard_normal(shape) + 5).astype(
        full.type.dtype.numpy
    )  # no zeros
    want = interpret(program, [{"x": x}, {"x": x}], 2, bnd)
    for rank in (0, 1):
        got = run_plan(plan, program, compiled.fns, {"x": x}, rank=rank, chunks=2)["y"]
        np.testing.assert_array_equal(got, want[rank]["y"])
    out_t = program.outputs[0][1].type
    index = global_flat_index(got.shape, out_t.layout, 2, 1)
    attrs = dict(program.body[-1].attrs)
    np.testing.assert_array_equal(got != 0, dropout_keep(attrs["seed"], index, attrs["p"]))


def test_broadcast_and_rank_offset_reads(compiled):
    program, plan, bnd = compiled.extras["bias_rows"]
    rng = np.random.default_rng(2)
    r, bias = (
        rng.standard_normal((8, 12)).astype(np.float32),
        rng.standard_normal(12).astype(np.float32),
    )
    xs = [rng.standard_normal((4, 12)).astype(np.float32) for _ in range(2)]
    want = interpret(program, [{"x": xs[i], "r": r, "bias": bias} for i in range(2)], 2, bnd)
    for rank in (0, 1):
        got = run_plan(
            plan, program, compiled.fns, {"x": xs[rank], "r": r, "bias": bias}, rank=rank
        )
        np.testing.assert_array_equal(got["y"], want[rank]["y"])


@pytest.mark.parametrize("key, rtol", [("adam", 0), ("lamb", 1e-6)])
def test_optimizer_programs_at_world_size_1(compiled, key, rtol):
    """Adam is bit-equal; LAMB's norms are sums (1 ulp), which the trust ratio carries along."""
    program, plan, bnd = compiled.extras[key]
    rng = np.random.default_rng(3)
    given = {k: rng.standard_normal(bnd["N"]).astype(np.float32) for k in ("g", "w", "m")}
    given["v"] = rng.random(bnd["N"]).astype(np.float32)
    want = interpret(program, [given], 1, bnd)[0]
    got = run_plan(plan, program, compiled.fns, {k: v.copy() for k, v in given.items()})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=0)


# -- building ----------------------------------------------------------------------------------------
def test_a_second_build_of_the_same_kernels_reuses_the_module(compiled):
    t0 = time.perf_counter()
    fns = build(compiled.kernels, name="test_build")
    assert time.perf_counter() - t0 < 1.0
    assert all(fns[k] is compiled.fns[k] for k in fns)
    source = module_source(compiled.kernels)
    assert (build_mod.cache_dir() / build_mod.module_name(source, "test_build")).is_dir()


def test_write_sources_writes_the_module(tmp_path, compiled):
    kernels = compiled.plans[("add", f32)][1].kernels()
    path = write_sources(kernels, tmp_path / "kernels", name="adam_fusion_AR-C")
    assert path == tmp_path / "kernels" / "adam_fusion_AR-C.cpp"
    assert path.read_text() == module_source(kernels)


def test_an_unusable_kernel_cache_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("COCONET_KERNELS_DIR", str(tmp_path / "file" / "kernels"))
    with pytest.raises(BuildError, match="COCONET_KERNELS_DIR") as err:
        build_mod.cache_dir()
    assert "\n" not in str(err.value)


def test_a_compile_error_is_one_line_with_the_log_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("COCONET_KERNELS_DIR", str(tmp_path))
    monkeypatch.setattr(build_mod, "module_source", lambda kernels: "this is not C++;\n")
    with pytest.raises(BuildError) as err:
        build([], name="broken")
    assert "\n" not in str(err.value) and "error" in str(err.value)
    assert (
        err.value.log_path.exists()
        and "this is not C++" in err.value.log + err.value.log_path.read_text()
    )


CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from codegen.lower import lower
    from codegen.build import build
    from dsl import Builder, Local, f32, sym
    b = Builder("concurrent")
    x = b.input("x", f32, [sym("N")], Local())
    b.output("y", x * 3 + 1)
    plan = lower(b.build(), {{"N": 10}}, 1)
    (k,) = plan.kernels()
    bufs = {{i: torch.arange(10, dtype=torch.float32) if i == 0 else torch.zeros(10) for i in k.args()}}
    build([k], name="concurrent")[k.name](0, 10, 0, [bufs[i] for i in k.args()])
    print(bufs[max(k.args())].tolist())
""")


@pytest.mark.slow
def test_ranks_building_one_module_at_once(tmp_path):
    env = {**os.environ, "COCONET_KERNELS_DIR": str(tmp_path)}
    code = CHILD.format(repo=str(Path(__file__).resolve().parent.parent))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == str([3.0 * i + 1 for i in range(10)])
    assert len(list(tmp_path.glob("concurrent_*/"))) == 1


# f32 -> f16 edges: zeros, the subnormal range's tie and ties, the normal range's bottom, the
# largest half and the overflow tie, inf, NaN, ties at 1
EDGES = [0.0, -0.0, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-24 * 1.5, 2.0**-24 * 2.5, 2.0**-14,
         2.0**-14 * (1 - 2.0**-11), 65504.0, 65519.99, 65520.0, 1e30, float("inf"),
         float("nan"), 1 + 2.0**-11, 1 + 3 * 2.0**-11]  # fmt: skip
RANDOM_FLOATS = 200_000


def _cast_kernels(src, dst, n):
    b = Builder(f"cast_{src}_{dst}")
    b.output("y", b.cast(b.input("x", src, [N], Local()), dst))
    (kernel,) = lower(b.build(), {"N": n}, 1).kernels()
    return kernel


def test_software_f16_conversions_equal_torchs(tmp_path):
    """Where the compiler has no `_Float16` (gcc before 12 on x86) f16 goes through `cc_half`'s
    conversions: built here with them forced (`CC_SOFT_HALF`), every one of the 65,536 halves
    widens exactly as torch's, and floats round as torch's do (bit-equal: edges of the subnormal
    and overflow ranges, ties, NaN, and 200,000 random bit patterns)."""
    widen, narrow = (
        _cast_kernels(f16, f32, 1 << 16),
        _cast_kernels(f32, f16, 2 * len(EDGES) + RANDOM_FLOATS),
    )
    source = "#define CC_SOFT_HALF\n" + module_source([widen, narrow])
    so = tmp_path / "soft.so"
    build_mod._compile(source, tmp_path, so)
    lib = build_mod.ctypes.CDLL(str(so))
    renderer = CppRenderer()
    fns = {
        k: build_mod.CKernel(k.name, getattr(lib, k.name), renderer.arg_dtypes(k))
        for k in (widen, narrow)
    }
    halves = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    wide = torch.empty(1 << 16, dtype=torch.float32)
    fns[widen](0, 1 << 16, 0, [halves, wide])
    expected = halves.float()
    assert torch.equal(wide.isnan(), expected.isnan())
    ok = ~expected.isnan()
    assert torch.equal(wide[ok].view(torch.int32), expected[ok].view(torch.int32))

    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (RANDOM_FLOATS,), generator=gen, dtype=torch.int64)
    floats = torch.cat(
        [torch.tensor(EDGES), -torch.tensor(EDGES), bits.to(torch.int32).view(torch.float32)]
    )
    out = torch.empty(floats.numel(), dtype=torch.float16)
    fns[narrow](0, floats.numel(), 0, [floats, out])
    expected = floats.half()
    assert torch.equal(out.isnan(), expected.isnan())
    ok = ~expected.isnan()
    assert torch.equal(out[ok].view(torch.int16), expected[ok].view(torch.int16))


def test_a_module_is_plain_cpp_and_its_calls_check_the_tensors():
    """No torch or Python header in a module (a fraction of a second to compile); a call with
    the wrong number of tensors or a tensor of another dtype is refused, not misread."""
    b = Builder("probe")
    b.output("y", b.input("x", f32, [N], Local()) * 2)
    (kernel,) = lower(b.build(), {"N": 10}, 1).kernels()
    source = module_source([kernel])
    assert "#include <torch" not in source and "#include <ATen" not in source
    fn = build([kernel], name="probe")[kernel.name]
    x, y = torch.arange(10.0), torch.zeros(10)
    fn(0, 10, 0, [x, y])
    assert y.tolist() == (2 * x).tolist()
    with pytest.raises(ValueError, match="takes 2 buffers"):
        fn(0, 10, 0, [x])
    with pytest.raises(TypeError, match="float64"):
        fn(0, 10, 0, [x.double(), y])
