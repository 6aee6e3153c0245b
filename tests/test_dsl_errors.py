"""Invalid DSL programs and transformations: each raises a `DSLError` subclass with a one-line
message naming the problem, at the line that is wrong (never an AttributeError, IndexError or
TypeError later, or nothing at all). Table-driven, then property-based with hypothesis."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from dsl import (
    ArgumentError,
    Builder,
    DSLError,
    DTypeError,
    LayoutError,
    Local,
    Replicated,
    ShapeError,
    Sliced,
    TransformError,
    f16,
    f32,
    i32,
    sym,
)
from dsl.transforms import as_slice, fuse, overlap, reorder, split
from experiments import model_parallel
from experiments.optimizers import adam_program, optimizer_schedules

N, H = sym("N"), sym("H")


def builder():
    return Builder("t")


def vec(b, name="x", layout=None, dtype=f32):
    return b.input(name, dtype, [N], layout or Local())


def adam():
    return adam_program()


def _reduced_sliced():
    b = builder()
    y = b.reduce_scatter(vec(b))
    b.output("y", y)
    return b.build()


PROGRAMS = [  # (what, build, error, words the message must contain)
    (
        "Sliced beyond the rank",
        lambda: builder().input("x", f32, [N], Sliced(5)),
        LayoutError,
        ["input x", "sliced(5)", "rank 1"],
    ),
    (
        "Sliced(1) of a vector",
        lambda: builder().input("x", f32, [N], Sliced(1)),
        LayoutError,
        ["input x", "rank 1"],
    ),
    ("negative Sliced", lambda: Sliced(-1), LayoutError, ["Sliced", "-1"]),
    ("Sliced of a string", lambda: Sliced("0"), LayoutError, ["Sliced", "'0'"]),
    (
        "negative dimension",
        lambda: builder().input("x", f32, [-4], Local()),
        ShapeError,
        ["input x", "dimension 0", "-4", "positive"],
    ),
    (
        "zero dimension",
        lambda: builder().input("x", f32, [N, 0], Local()),
        ShapeError,
        ["input x", "dimension 1", "positive"],
    ),
    (
        "negative symbolic size",
        lambda: builder().input("x", f32, [N * -1], Local()),
        ShapeError,
        ["input x", "positive"],
    ),
    (
        "fractional dimension",
        lambda: builder().input("x", f32, [2.5], Local()),
        ShapeError,
        ["size", "2.5"],
    ),
    (
        "shape not a list",
        lambda: builder().input("x", f32, N, Local()),
        ShapeError,
        ["input x", "shape must be a list"],
    ),
    (
        "dtype as a string",
        lambda: builder().input("x", "f32", [N], Local()),
        DTypeError,
        ["input x", "dtype", "'f32'"],
    ),
    (
        "numpy dtype",
        lambda: builder().input("x", np.float32, [N], Local()),
        DTypeError,
        ["input x", "dtype"],
    ),
    (
        "layout as a string",
        lambda: builder().input("x", f32, [N], "local"),
        LayoutError,
        ["input x", "layout", "'local'"],
    ),
    (
        "layout class, not instance",
        lambda: builder().input("x", f32, [N], Local),
        LayoutError,
        ["input x", "Local()"],
    ),
    (
        "unknown init",
        lambda: builder().input("x", f32, [N], Local(), init="uniform"),
        ArgumentError,
        ["input x", "init", "uniform"],
    ),
    (
        "name not a string",
        lambda: builder().input(3, f32, [N], Local()),
        ArgumentError,
        ["input name", "3"],
    ),
    ("empty name", lambda: builder().input("", f32, [N], Local()), ArgumentError, ["input name"]),
    (
        "stage as a string",
        lambda: Builder("t", stages=2).input("x", f32, [N], Local(), stage="0"),
        ShapeError,
        ["input x", "stage"],
    ),
    (
        "stage out of range",
        lambda: Builder("t", stages=2).input("x", f32, [N], Local(), stage=2),
        ShapeError,
        ["input x", "stage 2"],
    ),
    ("no stages", lambda: Builder("t", stages=0), ShapeError, ["pipeline stage", "0"]),
    ("stages as a string", lambda: Builder("t", stages="2"), ShapeError, ["pipeline stage", "'2'"]),
    ("program name", lambda: Builder(None), ArgumentError, ["program name", "None"]),
    (
        "parameter default not a number",
        lambda: builder().param("lr", "fast"),
        ArgumentError,
        ["parameter lr", "number", "fast"],
    ),
    (
        "parameter dtype as a string",
        lambda: builder().param("lr", 1e-3, "f32"),
        DTypeError,
        ["parameter lr", "dtype"],
    ),
    (
        "duplicate input",
        lambda: (lambda b: (vec(b), vec(b)))(builder()),
        ShapeError,
        ["'x'", "already used"],
    ),
    (
        "cast to a string",
        lambda: (lambda b: b.cast(vec(b), "f16"))(builder()),
        DTypeError,
        ["cast", "dtype"],
    ),
    (
        "dropout p out of range",
        lambda: (lambda b: b.dropout(vec(b), p=1.5, seed=1))(builder()),
        ShapeError,
        ["dropout", "[0, 1)", "1.5"],
    ),
    (
        "unknown reduction",
        lambda: (lambda b: b.all_reduce(vec(b), op="avg"))(builder()),
        ShapeError,
        ["all_reduce", "avg"],
    ),
    (
        "scatter dim beyond rank",
        lambda: (lambda b: b.reduce_scatter(vec(b), dim=3))(builder()),
        ShapeError,
        ["reduce_scatter", "dim 3", "rank 1"],
    ),
    (
        "mixed dtypes",
        lambda: (lambda b: vec(b) + vec(b, "y", dtype=f16))(builder()),
        DTypeError,
        ["add", "dtypes differ", "cast first"],
    ),
    (
        "Sliced meets Local",
        lambda: (lambda b: vec(b) + b.input("y", f32, [N], Sliced(0)))(builder()),
        LayoutError,
        ["add", "Sliced operand cannot meet a Local"],
    ),
    (
        "matmul of vectors",
        lambda: (lambda b: vec(b, layout=Replicated()) @ vec(b, "y", Replicated()))(builder()),
        ShapeError,
        ["matmul", "rank 1 x rank 1"],
    ),
    (
        "arithmetic on bool",
        lambda: (lambda b: (vec(b) < 0) + 1)(builder()),
        DTypeError,
        ["add", "bool"],
    ),
    (
        "integer sqrt",
        lambda: (lambda b: b.sqrt(vec(b, dtype=i32)))(builder()),
        DTypeError,
        ["sqrt", "floating-point"],
    ),
    (
        "unknown op",
        lambda: (lambda b: b.op("frobnicate", vec(b)))(builder()),
        ShapeError,
        ["unknown op", "frobnicate"],
    ),
    (
        "update a string",
        lambda: (lambda b: b.update("x", vec(b)))(builder()),
        ArgumentError,
        ["update target", "'x'"],
    ),
    (
        "update a computed value",
        lambda: (lambda b: b.update(vec(b) * 2, vec(b, "y")))(builder()),
        ShapeError,
        ["update target", "not a program input"],
    ),
    (
        "output a number",
        lambda: builder().output("y", 3.0),
        ArgumentError,
        ["output y", "tensor", "3.0"],
    ),
    (
        "output name",
        lambda: (lambda b: b.output(None, vec(b)))(builder()),
        ArgumentError,
        ["output name", "None"],
    ),
    (
        "tensor of another program",
        lambda: builder().output("y", vec(builder())),
        ShapeError,
        ["another program"],
    ),
    (
        "send to a missing stage",
        lambda: (lambda b: b.send(b.input("x", f32, [N], Local(), stage=0), dst=5))(
            Builder("t", stages=2)
        ),
        LayoutError,
        ["p2p", "destination stage 5"],
    ),
    ("size symbol", lambda: sym("1N"), ShapeError, ["'1N'", "identifier"]),
    (
        "operand of the wrong kind",
        lambda: (lambda b: vec(b) + "1")(builder()),
        ShapeError,
        ["operand", "'1'"],
    ),
]

TRANSFORMS = [  # (what, call, words)
    ("split(None)", lambda: split(None), ["split", "expected a Program", "None"]),
    ("split a Builder", lambda: split(builder()), ["split", "expected a Program", ".build()"]),
    ("reorder(None)", lambda: reorder(None), ["reorder", "expected a Program"]),
    ("fuse(None)", lambda: fuse(None), ["fuse", "expected a Program"]),
    ("overlap(None)", lambda: overlap(None, "y"), ["overlap", "expected a Program"]),
    ("as_slice(None)", lambda: as_slice(None, "m"), ["as_slice", "expected a Program"]),
    ("split dim as a string", lambda: split(adam(), dim="0"), ["split", "dim '0'", "out of range"]),
    ("split dim beyond rank", lambda: split(adam(), dim=1), ["split", "dim 1", "out of range"]),
    ("split an unknown value", lambda: split(adam(), at="nope"), ["split", "no value 'nope'"]),
    (
        "split a matmul",
        lambda: split(model_parallel.program(), at="y"),
        ["split", "matmul", "expected a statement of kind all_reduce"],
    ),
    ("split twice", lambda: split(split(adam())), ["split", "0 statements of kind all_reduce"]),
    ("reorder without a gather", lambda: reorder(adam()), ["reorder", "0 statements"]),
    (
        "as_slice an unknown input",
        lambda: as_slice(adam(), "nope"),
        ["as_slice", "no input 'nope'"],
    ),
    ("as_slice by number", lambda: as_slice(adam(), 3), ["as_slice", "string", "3"]),
    (
        "as_slice a Local input",
        lambda: as_slice(reorder(split(adam())), "g"),
        ["as_slice", "input g", "not a replicated tensor"],
    ),
    (
        "as_slice before reorder",
        lambda: as_slice(adam(), "m"),
        ["as_slice", "needs the full tensor m"],
    ),
    (
        "split after fuse",
        lambda: split(fuse(reorder(split(adam())))),
        ["split", "already fused, overlapped or prefetched"],
    ),
    (
        "fuse an unknown first",
        lambda: fuse(adam(), first="nope"),
        ["fuse", "'nope'", "not a statement"],
    ),
    (
        "fuse stmts as a string",
        lambda: fuse(adam(), stmts="m.next"),
        ["fuse", "list of statements"],
    ),
    ("fuse inputs", lambda: fuse(adam(), stmts=["w", "m"]), ["fuse", "not inputs"]),
    ("fuse one statement", lambda: fuse(adam(), stmts=["m.next"]), ["fuse", "nothing to fuse"]),
    (
        "fuse twice",
        lambda: fuse(fuse(reorder(split(adam()))), stmts=["m.next", "v.next"]),
        ["fuse", "already fused"],
    ),
    (
        "fuse a matmul",
        lambda: fuse(model_parallel.program(), stmts=["y", "y.sum"]),
        ["fuse", "a matmul is a library call, not fused"],
    ),
    (
        "overlap zero chunks",
        lambda: overlap(model_parallel.program(), "y", chunks=0),
        ["overlap", "chunks", "0"],
    ),
    (
        "overlap chunks as bool",
        lambda: overlap(model_parallel.program(), "y", chunks=True),
        ["overlap", "chunks", "True"],
    ),
    (
        "overlap an unknown producer",
        lambda: overlap(model_parallel.program(), "nope"),
        ["overlap", "no value 'nope'"],
    ),
    (
        "overlap a pointwise producer",
        lambda: overlap(adam(), "m.next"),
        ["overlap", "producer", "matmul"],
    ),
    (
        "overlap twice",
        lambda: (lambda p: overlap(overlap(p, "y"), "y"))(model_parallel.program()),
        ["overlap", "already overlapped"],
    ),
]


def _one_line(e: BaseException, words):
    msg = str(e)
    assert msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("what,build,error,words", PROGRAMS, ids=[c[0] for c in PROGRAMS])
def test_invalid_programs_raise_a_one_line_dsl_error(what, build, error, words):
    with pytest.raises(error) as e:
        build()
    _one_line(e.value, words)


@pytest.mark.parametrize("what,call,words", TRANSFORMS, ids=[c[0] for c in TRANSFORMS])
def test_invalid_transformations_raise_a_one_line_transform_error(what, call, words):
    with pytest.raises(TransformError) as e:
        call()
    _one_line(e.value, words)


def test_there_are_at_least_25_of_each():
    assert len(PROGRAMS) >= 25 and len(TRANSFORMS) >= 25


# -- property-based ---------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(rank=st.integers(1, 4), dim=st.integers(0, 8))
def test_sliced_is_accepted_exactly_within_the_rank(rank, dim):
    shape = [N] * rank
    if dim < rank:
        assert builder().input("x", f32, shape, Sliced(dim)).type.layout == Sliced(dim)
    else:
        with pytest.raises(
            LayoutError, match=f"sliced\\({dim}\\) needs a dimension {dim}.*rank {rank}"
        ):
            builder().input("x", f32, shape, Sliced(dim))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=4))
def test_every_nonpositive_dimension_is_refused(sizes):
    if all(s > 0 for s in sizes):
        assert builder().input("x", f32, sizes, Local()).type.rank == len(sizes)
    else:
        with pytest.raises(ShapeError, match="sizes must be positive"):
            builder().input("x", f32, sizes, Local())


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 50),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.lists(st.integers(0, 40), max_size=3),
    st.sampled_from(["m", "v", "w", "g", "y", "m.next", "g.sum", "x"]),
)


@settings(max_examples=300, deadline=None)
@given(which=st.sampled_from(["dtype", "layout", "name", "init", "stage", "shape"]), junk=JUNK)
def test_junk_arguments_to_input_raise_dsl_errors_only(which, junk):
    args = {
        "name": "x",
        "dtype": f32,
        "shape": [N, H],
        "layout": Local(),
        "stage": None,
        "init": "normal",
    }
    args[which] = junk
    try:
        builder().input(args.pop("name"), **args)
    except DSLError as e:
        _one_line(e, [])


PROGRAM_MAKERS = [
    adam,
    model_parallel.program,
    lambda: reorder(split(adam())),
    lambda: optimizer_schedules(adam())["fuse(RS-C-AG)"],
]


@settings(max_examples=400, deadline=None)
@given(
    make=st.sampled_from(PROGRAM_MAKERS),
    t=st.sampled_from(["split", "reorder", "fuse", "overlap", "as_slice"]),
    a=JUNK,
    b=JUNK,
)
def test_transforms_with_junk_arguments_return_a_program_or_raise_a_dsl_error(make, t, a, b):
    calls = {
        "split": lambda p: split(p, a, b if isinstance(b, int) else 0),
        "reorder": lambda p: reorder(p, a),
        "fuse": lambda p: fuse(p, first=a, last=b),
        "overlap": lambda p: overlap(p, a, chunks=b),
        "as_slice": lambda p: as_slice(p, a),
    }
    try:
        q = calls[t](make())
    except DSLError as e:
        _one_line(e, [t])
    else:
        dsl.verify(q)
