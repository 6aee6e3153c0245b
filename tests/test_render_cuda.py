"""Rendering kernels as CUDA text: the op table, golden text of the four kernels the C++ goldens
use (tests/golden/cuda/<name>.cu), launch descriptions, and the kernels the GPU cannot run.
Pure: nothing compiles here (tests/test_build_cuda.py compiles and runs them).

Regenerate the goldens after a deliberate change: `python tests/test_render_cuda.py --update`.
"""

import dataclasses
import sys
from pathlib import Path

import pytest

from codegen.plan import Access, Kernel
from codegen.render import Renderer, RenderError
from codegen.render_cpp import CppRenderer
from codegen.render_cuda import BLOCKS_PER_SM, MAX_BLOCKS, THREADS, CudaRenderer, Launch
from dsl import Builder, Local, bf16, f16, f32, f64, i64, sym
from dsl.ops import COLLECTIVE, POINTWISE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_render import axpy, bias_add, drop, sumsq  # noqa: E402  (the C++ goldens' kernels)

R = CudaRenderer()
N = sym("N")
GOLDEN = Path(__file__).resolve().parent / "golden" / "cuda"
KERNELS = {"axpy": axpy, "bias_add": bias_add, "sumsq": sumsq, "drop": drop}


def _kernel(name, loop, prog, **fields):
    defaults = dict(scalars=(), reads=(), writes=(), reduces=(), scalar_outs=(), dropout_index=())
    return Kernel(name, loop, prog.body, **{**defaults, **fields})


# -- the op table -----------------------------------------------------------------------------------
def test_cuda_and_cpp_share_the_base_walk():
    assert issubclass(CudaRenderer, Renderer) and issubclass(CppRenderer, Renderer)
    assert CudaRenderer.walk is CppRenderer.walk is Renderer.walk


@pytest.mark.parametrize("op", POINTWISE + ("sum", "update"))
def test_every_kernel_op_has_a_render_rule(op):
    assert op in CudaRenderer.code_for_op


@pytest.mark.parametrize("op", ("matmul", "norm", "mean", "slice") + COLLECTIVE + ("p2p",))
def test_ops_that_never_reach_kernels_have_no_rule(op):
    assert op not in CudaRenderer.code_for_op


@pytest.mark.parametrize(
    "op, dt, want",
    [
        ("sqrt", f32, "sqrtf(a)"),
        ("sqrt", f64, "sqrt(a)"),
        ("sqrt", f16, "sqrtf(a)"),
        ("rsqrt", f32, "(1 / sqrtf(a))"),
        ("exp", bf16, "expf(a)"),
        ("exp", f64, "exp(a)"),
    ],
)
def test_math_uses_the_cuda_function_of_the_compute_type(op, dt, want):
    assert CudaRenderer.code_for_op[op]("a", dt) == want


@pytest.mark.parametrize(
    "dt, want", [(f32, "powf(a, b)"), (f64, "pow(a, b)"), (i64, "cc_ipow(a, b)")]
)
def test_pow(dt, want):
    assert CudaRenderer.code_for_op["pow"]("a", "b", dt) == want


@pytest.mark.parametrize(
    "value, dt, want",
    [
        (0.1, f32, "0.1f"),
        (0.1, f16, "0.099975586f"),
        (-5, i64, "INT64_C(-5)"),
        (float("inf"), f32, "float(CC_INF)"),
        (float("-inf"), f64, "-CC_INF"),
        (float("nan"), f64, "CC_NAN"),
    ],
)
def test_constants(value, dt, want):
    assert R.const(value, dt) == want


# -- golden text ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_golden(name):
    assert R.render(KERNELS[name]()) == (GOLDEN / f"{name}.cu").read_text()


def test_module_has_the_header_once_and_deduplicates_functions():
    text = R.render_module([axpy(), sumsq(), axpy()])
    assert text.count("__device__ __forceinline__ uint32_t cc_mix32") == 1
    assert text.count("\naxpy(") == 1 and text.count("\nsumsq(") == 1
    assert "PYBIND11" not in text and text.count('extern "C" __global__') == 2


def test_two_different_kernels_with_one_name_are_an_error():
    with pytest.raises(RenderError, match="both named axpy"):
        R.render_module([axpy(), dataclasses.replace(sumsq(), name="axpy")])


def test_half_types_are_bits_converted_in_f32():
    b = Builder("halves")
    x, y = b.input("x", f16, [N], Local()), b.input("y", bf16, [N], Local())
    b.output("z", b.cast(b.op("add", b.cast(x, f32), b.cast(y, f32)), bf16))
    k = _kernel(
        "halves", (64,), b.build(), reads=(Access(0, 0, (1,)), Access(1, 1, (1,))), writes=((5, 5),)
    )
    text = R.render(k)
    assert "const uint16_t* __restrict__ b0, const uint16_t* __restrict__ b1" in text
    assert (
        "const float v0 = cc_h2f(b0[e]);" in text
        and "const float v1 = cc_bf16_load(b1[e]);" in text
    )
    assert "cc_bf16_load(cc_bf16_store(" in text and "b5[e] = cc_bf16_store(v5);" in text


# -- launch descriptions ----------------------------------------------------------------------------
def _copy(dts, loop=(64,)):
    """A kernel reading one operand per dtype in `dts` and writing the last one, contiguous."""
    b = Builder("copy")
    xs = [b.input(f"x{i}", dt, [N], Local()) for i, dt in enumerate(dts)]
    out = b.op("add", xs[-1], xs[-1])
    reads = tuple(Access(x.value.id, x.value.id, (1,) * len(loop)) for x in xs)
    return _kernel("copy", loop, b.build(), reads=reads, writes=((out.value.id, 99),))


@pytest.mark.parametrize(
    "dts, vec",
    [((f32,), 4), ((f16,), 8), ((bf16, f16), 8), ((f16, f32), 4), ((f64,), 2), ((f32, f64), 2)],
)
def test_vector_width_is_16_bytes_of_the_widest_operand(dts, vec):
    assert R.launch(_copy(dts)).vec == vec


def test_no_vector_loop_without_contiguous_operands():
    b = Builder("bcast")
    x = b.input("x", f32, [N], Local())
    b.output("y", x * 2.0)
    k = _kernel("bcast", (4, 8), b.build(), reads=(Access(0, 0, (0, 1)),), writes=())
    assert R.launch(k).vec == 1 and "cc_ldv" not in R.render(k)


def test_sums_take_a_workspace_with_a_slot_per_block():
    launch = R.launch(sumsq())
    assert launch.sums == 1 and launch.workspace_bytes == 8 * MAX_BLOCKS + 16
    assert "unsigned char* __restrict__ cc_ws)" in R.render(sumsq())
    assert R.launch(axpy()).workspace_bytes == 0


@pytest.mark.parametrize(
    "n, sms, grid",
    [
        (1, 132, 1),
        (4 * THREADS, 132, 1),
        (4 * THREADS + 1, 132, 2),
        (1 << 28, 132, 132 * BLOCKS_PER_SM),
        (1 << 28, 400, MAX_BLOCKS),
    ],
)
def test_grid(n, sms, grid):
    assert Launch("k", (), vec=4, sums=0).grid(n, sms) == grid


# -- kernels a GPU cannot run -----------------------------------------------------------------------
def test_reading_a_written_buffer_at_other_elements_is_a_race():
    b = Builder("shift")
    x = b.input("x", f32, [N], Local())
    b.update(x, x * 2.0)
    k = _kernel("shift", (8,), b.build(), reads=(Access(0, 0, (0,), 3),), writes=((2, 0),))
    with pytest.raises(RenderError, match="at other elements than it writes"):
        R.render(k)


def test_writing_a_scalar_it_reads_is_a_race():
    b = Builder("count")
    s = b.param("s", 1.0)
    b.update(s, s + 1.0)
    k = _kernel("count", (), b.build(), scalars=(0,), writes=((2, 0),))
    with pytest.raises(RenderError, match="0-d buffer"):
        R.render(k)
    assert "b0[0] = v2;" in CppRenderer().render(k)  # serial on the CPU: fine there


def update_goldens() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, make in KERNELS.items():
        (GOLDEN / f"{name}.cu").write_text(R.render(make()))
        print(f"wrote {GOLDEN / name}.cu")


if __name__ == "__main__" and "--update" in sys.argv:
    update_goldens()
