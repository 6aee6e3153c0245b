"""Rendering kernels as C++ text: the op table is complete, golden text of four small kernels,
constants, and the errors for kernels the renderer cannot express. Pure: nothing compiles here."""

import dataclasses

import numpy as np
import pytest

from codegen.plan import Access, Kernel
from codegen.render import RenderError
from codegen.render_cpp import CppRenderer
from dsl import Builder, Local, P, Replicated, Sliced, bf16, f16, f32, f64, i32, i64, sym
from dsl.ops import COLLECTIVE, POINTWISE
from dsl.types import DType

R = CppRenderer()
N, M, K = sym("N"), sym("M"), sym("K")


def _kernel(
    name, loop, prog, scalars=(), reads=(), writes=(), reduces=(), scalar_outs=(), dropout_index=()
):
    return Kernel(
        name, loop, prog.body, scalars, reads, writes, reduces, scalar_outs, dropout_index
    )


# -- the op table -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", POINTWISE + ("sum", "update"))
def test_every_kernel_op_has_a_render_rule(op):
    assert op in CppRenderer.code_for_op


@pytest.mark.parametrize("op", ("matmul", "norm", "mean", "slice") + COLLECTIVE + ("p2p",))
def test_ops_that_never_reach_kernels_have_no_rule(op):
    assert op not in CppRenderer.code_for_op


def test_a_missing_rule_is_named():
    b = Builder("n")
    x = b.input("x", f32, [N], Local())
    b.output("y", b.norm(x))
    k = _kernel("n", (8,), b.build(), reads=(Access(0, 0, (1,)),))
    with pytest.raises(RenderError, match="render rule for norm not implemented"):
        R.render(k)


def test_an_operand_neither_read_computed_nor_scalar_is_an_error():
    b = Builder("bad")
    x = b.input("x", f32, [N], Local())
    b.output("y", x * 2)
    with pytest.raises(RenderError, match="neither computed, read nor a scalar"):
        R.render(_kernel("bad", (8,), b.build(), writes=((1, 1),)))


# -- golden text ------------------------------------------------------------------------------------
def axpy():
    b = Builder("axpy")
    x, y = b.input("x", f32, [N], Local()), b.input("y", f32, [N], Local())
    a = b.param("a", 2.0)
    out = b.op("add", a * x, y, name="out")
    return _kernel(
        "axpy",
        (1024,),
        b.build(),
        scalars=(a.value.id,),
        reads=(Access(0, 0, (1,)), Access(1, 1, (1,))),
        writes=((out.value.id, 4),),
    )


AXPY = """\
extern "C" void axpy(int64_t begin, int64_t end, int64_t rank, void* const* bufs, int nt) {
  float* b0 = static_cast<float*>(bufs[0]);
  float* b1 = static_cast<float*>(bufs[1]);
  float* b2 = static_cast<float*>(bufs[2]);
  float* b4 = static_cast<float*>(bufs[3]);
  const float v2 = b2[0];
  #pragma omp parallel for simd num_threads(nt) if(parallel: end - begin >= 32768)
  for (int64_t e = begin; e < end; ++e) {
    const float v0 = b0[e];
    const float v1 = b1[e];
    const float v3 = (v2 * v0);  // t3
    const float v4 = (v3 + v1);  // out
    b4[e] = v4;
  }
}
"""


def bias_add():
    """x (rank's rows) + r (replicated, read as this rank's rows) + bias (broadcast over rows)."""
    b = Builder("bias")
    x = b.input("x", f32, [M / P, K], Sliced(0))
    r = b.input("r", f32, [M, K], Replicated())
    bias = b.input("bias", f32, [K], Replicated())
    out = b.op("add", x + r, bias, name="out")
    return _kernel(
        "bias_add",
        (4, 8),
        b.build(),
        reads=(Access(0, 0, (8, 1)), Access(1, 1, (8, 1), 32), Access(2, 2, (0, 1))),
        writes=((out.value.id, 4),),
    )


BIAS_ADD = """\
extern "C" void bias_add(int64_t begin, int64_t end, int64_t rank, void* const* bufs, int nt) {
  float* b0 = static_cast<float*>(bufs[0]);
  float* b1 = static_cast<float*>(bufs[1]);
  float* b2 = static_cast<float*>(bufs[2]);
  float* b4 = static_cast<float*>(bufs[3]);
  const int64_t ro32 = rank * 32;
  #pragma omp parallel for simd num_threads(nt) if(parallel: end - begin >= 32768)
  for (int64_t e = begin; e < end; ++e) {
    const int64_t i1 = e % 8;
    const float v0 = b0[e];
    const float v1 = b1[e + ro32];
    const float v2 = b2[i1];
    const float v3 = (v0 + v1);  // t3
    const float v4 = (v3 + v2);  // out
    b4[e] = v4;
  }
}
"""


def sumsq():
    """A 0-d statement in the prologue written to a scalar out, and a sum over the loop."""
    b = Builder("sumsq")
    x = b.input("x", f32, [N], Local())
    s = b.param("s", 0.5)
    half = b.op("mul", s, 0.5, name="half")
    tot = b.sum(b.op("mul", x, x, name="sq"), name="tot")
    return _kernel(
        "sumsq",
        (1000,),
        b.build(),
        scalars=(1,),
        reads=(Access(0, 0, (1,)),),
        reduces=((tot.value.id, 4),),
        scalar_outs=((half.value.id, 2),),
    )


SUMSQ = """\
extern "C" void sumsq(int64_t begin, int64_t end, int64_t rank, void* const* bufs, int nt) {
  float* b0 = static_cast<float*>(bufs[0]);
  float* b1 = static_cast<float*>(bufs[1]);
  float* b2 = static_cast<float*>(bufs[2]);
  float* b4 = static_cast<float*>(bufs[3]);
  const float v1 = b1[0];
  const float v2 = (v1 * 0.5f);  // half
  b2[0] = v2;
  double acc4 = 0;
  #pragma omp parallel for simd num_threads(nt) if(parallel: end - begin >= 32768) reduction(+: acc4)
  for (int64_t e = begin; e < end; ++e) {
    const float v0 = b0[e];
    const float v3 = (v0 * v0);  // sq
    acc4 += static_cast<double>(v3);
  }
  b4[0] = b4[0] + static_cast<float>(acc4);
}
"""


def drop():
    """f16 dropout of a Sliced(1) tensor: the global index of [M, K] needs both loop indices."""
    b = Builder("drop")
    x = b.input("x", f16, [M, K / P], Sliced(1))
    y = b.dropout(x, p=0.1, seed=42, name="y")
    return _kernel(
        "drop",
        (4, 8),
        b.build(),
        reads=(Access(0, 0, (8, 1)),),
        writes=((y.value.id, 1),),
        dropout_index=((y.value.id, Access(-1, -1, (16, 1), 8)),),
    )


DROP = """\
extern "C" void drop(int64_t begin, int64_t end, int64_t rank, void* const* bufs, int nt) {
  cc_half* b0 = static_cast<cc_half*>(bufs[0]);
  cc_half* b1 = static_cast<cc_half*>(bufs[1]);
  const int64_t ro8 = rank * 8;
  #pragma omp parallel for simd num_threads(nt) if(parallel: end - begin >= 32768)
  for (int64_t e = begin; e < end; ++e) {
    const int64_t i0 = e / 8;
    const int64_t i1 = e % 8;
    const float v0 = static_cast<float>(b0[e]);
    const float v1 = cc_dropout(v0, static_cast<uint64_t>(i0 * 16 + i1 + ro8), 0xa0df3600u, 1677722u, 1.1113281f);  // y
    b1[e] = static_cast<cc_half>(v1);
  }
}
"""


@pytest.mark.parametrize(
    "make, want",
    [(axpy, AXPY), (bias_add, BIAS_ADD), (sumsq, SUMSQ), (drop, DROP)],
    ids=["axpy", "bias_add", "sumsq", "drop"],
)
def test_golden(make, want):
    assert R.render(make()) == want


@pytest.mark.parametrize(
    "rows, cols, want",
    [
        (1024, 3072, "const int64_t i1 = static_cast<uint32_t>(e) % 3072u;"),  # 3M elements: 32-bit
        (2**22, 3072, "const int64_t i1 = e % 3072;"),  # 12.9G elements: e needs 64 bits
        (1024, 4096, "const int64_t i1 = e % 4096;"),
    ],
)  # a power of two: a mask, in 64 bits
def test_multi_index_divides_in_32_bits_where_the_loop_fits(rows, cols, want):
    """A bias's index e % H with H not a power of two: in 64 bits the loop does not vectorise
    (the pipeline boundary's kernel at H=3072 ran 4-5x slower per element than at H=4096)."""
    b = Builder("bias")
    x, bias = b.input("x", f32, [M, K], Local()), b.input("bias", f32, [K], Replicated())
    out = b.op("add", x, bias, name="out")
    k = _kernel(
        "bias",
        (rows, cols),
        b.build(),
        reads=(Access(0, 0, (cols, 1)), Access(1, 1, (0, 1))),
        writes=((out.value.id, 2),),
    )
    text = R.render(k)
    assert want in text and "const float v0 = b0[e];" in text


def test_a_unit_dimension_does_not_break_contiguity():
    """[S, B, H] with B=1 read with stride 0 on B is still element e (not i0 * H + i2: the
    pipeline boundary's kernel rebuilt every index and ran 4x slower per element)."""
    assert Access(0, 0, (3072, 0, 1)).is_contiguous((1024, 1, 3072))
    assert not Access(0, 0, (3072, 0, 1)).is_contiguous((1024, 2, 3072))
    assert not Access(0, 0, (1, 0, 1024)).is_contiguous((1024, 1, 3072))


def test_dropout_constants_are_the_interpreters():
    from dsl.interpret import mix32

    assert int(mix32(np.uint32(42 ^ 0x9E3779B9))) == 0xA0DF3600
    assert int(np.ceil(0.1 * 2**24)) == 1677722


def test_module_has_the_header_once_and_deduplicates_functions():
    text = R.render_module([axpy(), sumsq(), axpy()])
    assert text.count("static inline uint32_t cc_mix32") == 1
    assert text.count("void axpy(") == 1 and text.count("void sumsq(") == 1
    assert (
        text.count(
            'extern "C" void axpy(int64_t begin, int64_t end, int64_t rank, void* const* bufs, int nt)'
        )
        == 1
    )


def test_two_different_kernels_with_one_name_are_an_error():
    other = dataclasses.replace(sumsq(), name="axpy")
    with pytest.raises(RenderError, match="both named axpy"):
        R.render_module([axpy(), other])


def test_loop_invariant_read_is_hoisted_out_of_the_loop():
    b = Builder("inv")
    x = b.input("x", f32, [N], Local())
    c = b.input("c", f32, [N], Replicated())
    b.output("y", x * c)
    k = _kernel(
        "inv", (16,), b.build(), reads=(Access(0, 0, (1,)), Access(1, 1, (0,), 3)), writes=((2, 2),)
    )
    text = R.render(k)
    assert "  const float v1 = b1[ro3];\n" in text.split("#pragma")[0]


# -- constants ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, dt, want",
    [
        (0.1, f32, "0.1f"),
        (0.1, f64, "0.1"),
        (3, f32, "3.0f"),
        (1e-8, f32, "1e-08f"),
        (0.1, f16, "0.099975586f"),
        (0.1, bf16, "0.100097656f"),
        (2.7, i32, "2"),
        (-5, i64, "INT64_C(-5)"),
        (float("inf"), f32, "float(INFINITY)"),
        (float("-inf"), f64, "-INFINITY"),
        (float("nan"), f64, "NAN"),
        (1, DType.bool, "true"),
    ],
)
def test_constants_take_the_statements_dtype(value, dt, want):
    assert R.const(value, dt) == want


def test_comparison_constants_take_the_operands_dtype_and_casts_round():
    b = Builder("cmp")
    x = b.input("x", f64, [N], Local())
    c = b.op("lt", x, 0.1)
    h = b.cast(x, f16)
    b.output("c", c)
    b.output("h", h)
    text = R.render(
        _kernel("cmp", (8,), b.build(), reads=(Access(0, 0, (1,)),), writes=((1, 1), (2, 2)))
    )
    assert "const bool v1 = (v0 < 0.1);" in text
    assert (
        "const float v2 = static_cast<float>(static_cast<cc_half>(static_cast<float>(v0)));" in text
    )
    assert "b2[e] = static_cast<cc_half>(v2);" in text


def test_integer_ops_use_the_helpers():
    b = Builder("ints")
    x, y = b.input("x", i32, [N], Local()), b.input("y", i32, [N], Local())
    b.output("q", b.op("pow", b.op("div", x, y), 2))
    text = R.render(
        _kernel(
            "ints",
            (8,),
            b.build(),
            reads=(Access(0, 0, (1,)), Access(1, 1, (1,))),
            writes=((3, 3),),
        )
    )
    assert "cc_idiv(v0, v1)" in text and "cc_ipow(v2, 2)" in text
