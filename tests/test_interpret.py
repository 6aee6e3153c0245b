"""`interpret`: collectives against numpy on several world sizes, p2p, binding errors, printing."""

import numpy as np
import pytest

import dsl
from dsl import (
    BindError,
    Builder,
    Local,
    P,
    Replicated,
    ShapeError,
    Sliced,
    f32,
    f64,
    i64,
    interpret,
    sym,
)

N, M = sym("N"), sym("M")
WORLDS = [1, 2, 3, 4]


def locals_(world, shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed + world)
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-8, 9, shape).astype(dtype) for _ in range(world)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(world)]


def one_op(kind, layout=Local(), shape=(N, M), dtype=f64, **attrs):
    b = Builder(kind)
    x = b.input("x", dtype, list(shape), layout)
    b.output("y", getattr(b, kind)(x, **attrs))
    return b.build()


def run(program, xs, **bindings):
    return [o["y"] for o in interpret(program, [{"x": x} for x in xs], len(xs), bindings)]


# -- collectives ----------------------------------------------------------------------------------
REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", list(REDUCERS))
def test_all_reduce(op, world):
    xs = locals_(world, (12, 3))
    want = REDUCERS[op](np.stack(xs), axis=0)
    for got in run(one_op("all_reduce", op=op), xs, N=12, M=3):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_of_integers_is_exact(world):
    xs = locals_(world, (12, 3), np.int64)
    for got in run(one_op("all_reduce", dtype=i64), xs, N=12, M=3):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.sum(xs, axis=0))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_scatter(op, dim, world):
    xs = locals_(world, (12, 24))
    full = REDUCERS[op](np.stack(xs), axis=0)
    outs = run(one_op("reduce_scatter", dim=dim, op=op), xs, N=12, M=24)
    for i, got in enumerate(outs):
        np.testing.assert_array_equal(got, np.split(full, world, axis=dim)[i])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dim", [0, 1])
def test_all_gather(dim, world):
    shape = (12, 24 // world) if dim else (12 // world, 24)
    xs = locals_(world, shape)
    sliced = [N, M / P] if dim else [N / P, M]
    for got in run(one_op("all_gather", Sliced(dim), sliced), xs, N=12, M=24):
        np.testing.assert_array_equal(got, np.concatenate(xs, axis=dim))


@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_from_the_last_rank(world):
    xs = locals_(world, (12, 3))
    for got in run(one_op("broadcast", root=world - 1), xs, N=12, M=3):
        np.testing.assert_array_equal(got, xs[-1])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", ["sum", "min"])
def test_reduce_to_a_root(op, world):
    xs, root = locals_(world, (12, 3)), world // 2
    outs = run(one_op("reduce", root=root, op=op), xs, N=12, M=3)
    for i, got in enumerate(outs):
        want = REDUCERS[op](np.stack(xs), axis=0) if i == root else np.zeros((12, 3))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("split,concat", [(0, 1), (1, 0)])
def test_all_to_all_of_a_local_tensor(split, concat, world):
    xs = locals_(world, (12, 24))
    outs = run(one_op("all_to_all", split_dim=split, concat_dim=concat), xs, N=12, M=24)
    for j, got in enumerate(outs):
        want = np.concatenate([np.split(x, world, axis=split)[j] for x in xs], axis=concat)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_reslices_a_sliced_tensor(world):
    full = locals_(1, (12, 24))[0]
    xs = np.split(full, world, axis=1)  # Sliced(1) -> Sliced(0): the same global tensor
    outs = run(
        one_op("all_to_all", Sliced(1), [N, M / P], split_dim=0, concat_dim=1), xs, N=12, M=24
    )
    np.testing.assert_array_equal(np.concatenate(outs, axis=0), full)


@pytest.mark.parametrize("world", [2, 4])
def test_root_outside_the_group_is_a_bind_error(world):
    with pytest.raises(BindError, match=f"root {world} .* P={world}"):
        run(one_op("broadcast", root=world), locals_(world, (4, 3)), N=4, M=3)


# -- pipeline stages and p2p ----------------------------------------------------------------------
def pipeline():
    b = Builder("pp", stages=2)
    x = b.input("x", f64, [N], Local(), stage=0)
    y = b.all_reduce(x)
    z = b.send(y, dst=1)
    h = b.input("h", f64, [N], Replicated(), stage=1)
    b.output("y0", y)
    b.output("z", z + h)
    b.output("lr", b.param("lr", 0.5) * 2)
    return b.build()


@pytest.mark.parametrize("world", [2, 4, 6])
def test_p2p_moves_tp_index_i_of_one_stage_to_the_next(world):
    P_ = world // 2
    xs, h = locals_(P_, (6,)), np.arange(6.0)
    inputs = [{"x": x} for x in xs] + [{"h": h}] * P_
    outs = interpret(pipeline(), inputs, world, {"N": 6})
    total = np.sum(np.stack(xs), axis=0)
    for r, out in enumerate(outs):
        assert set(out) == ({"y0", "lr"} if r < P_ else {"z", "lr"})
        assert out["lr"] == 1.0
        np.testing.assert_array_equal(
            out["y0"] if r < P_ else out["z"], total if r < P_ else total + h
        )


def test_p2p_sends_rank_i_to_rank_i():
    b = Builder("send", stages=2)
    b.output("y", b.send(b.input("x", f64, [N], Local(), stage=0), dst=1))
    xs = locals_(3, (4,))
    outs = interpret(b.build(), [{"x": x} for x in xs] + [{}] * 3, 6, {"N": 4})
    assert outs[:3] == [{}, {}, {}]
    for i in range(3):
        np.testing.assert_array_equal(outs[3 + i]["y"], xs[i])


def test_stage_none_communication_runs_in_each_stage_group():
    b = Builder("two", stages=2)
    b.output("y", b.all_reduce(b.input("x", f64, [N], Local())))
    xs = locals_(4, (4,))
    outs = interpret(b.build(), [{"x": x} for x in xs], 4, {"N": 4})
    for r in range(4):
        np.testing.assert_array_equal(outs[r]["y"], xs[r // 2 * 2] + xs[r // 2 * 2 + 1])


# -- binding and input errors ---------------------------------------------------------------------
def adam_like():
    b = Builder("upd")
    g = b.input("g", f32, [N], Local())
    w = b.input("w", f32, [N / P], Sliced(0))
    r = b.input("r", f32, [N], Replicated())
    b.update(w, w - b.param("lr", 0.1) * b.reduce_scatter(g) * b.slice(r))
    return b.build()


def good_inputs(world, n=8):
    return [{"g": np.ones(n), "w": np.ones(n // world), "r": np.arange(n)} for _ in range(world)]


def test_defaults_are_used_and_may_be_overridden():
    outs = interpret(adam_like(), good_inputs(2), 2, {"N": 8})
    want = 1 - np.float32(0.1) * 2 * np.arange(4, 8, dtype=np.float32)
    np.testing.assert_array_equal(outs[1]["w"], want)
    inputs = [dict(i, lr=np.float32(1.0)) for i in good_inputs(2)]
    outs = interpret(adam_like(), inputs, 2, {"N": 8})
    np.testing.assert_array_equal(outs[0]["w"], 1 - 2 * np.arange(4.0))


def test_inputs_are_converted_to_the_dtype_and_outputs_are_copies():
    inputs = good_inputs(1)
    out = interpret(adam_like(), inputs, 1, {"N": 8})[0]["w"]
    assert out.dtype == np.float32
    out[:] = 7
    assert np.all(inputs[0]["w"] == 1)


def _drop(name, rank):
    inputs = good_inputs(2)
    del inputs[rank][name]
    return inputs


def _set(name, rank, value):
    inputs = good_inputs(2)
    inputs[rank][name] = value
    return inputs


BAD = [  # (inputs, world, bindings, error, message pattern)
    (_drop("g", 1), 2, {"N": 8}, BindError, "input g .* missing on rank 1"),
    (
        _set("w", 0, np.ones(8)),
        2,
        {"N": 8},
        BindError,
        r"input w on rank 0 has shape \[8\], expected \[4\]",
    ),
    (_set("g", 1, np.ones((8, 1))), 2, {"N": 8}, BindError, "input g on rank 1"),
    (
        _set("r", 1, np.arange(8) + 1),
        2,
        {"N": 8},
        BindError,
        "replicated input r differs between rank 0 and rank 1",
    ),
    (_set("zz", 0, np.ones(1)), 2, {"N": 8}, BindError, "zz"),
    (
        [{"g": np.ones(5), "w": np.ones(2), "r": np.ones(5)}] * 2,
        2,
        {"N": 5},
        ShapeError,
        "input w .* N/P = 5/2 .* not a whole number",
    ),
    (good_inputs(2), 2, {}, BindError, "size symbol N is not bound"),
    (good_inputs(2), 2, {"N": 8, "P": 4}, BindError, "P=4 .* gives P=2"),
    (good_inputs(2), 0, {"N": 8}, BindError, "world size 0"),
    (good_inputs(2), 3, {"N": 8}, BindError, "2 input dicts given for a world size of 3"),
    (good_inputs(2)[:1], 2, {"N": 8}, BindError, "1 input dicts given for a world size of 2"),
]


@pytest.mark.parametrize("inputs,world,bindings,error,pattern", BAD)
def test_bad_inputs_and_bindings(inputs, world, bindings, error, pattern):
    with pytest.raises(error, match=pattern) as e:
        interpret(adam_like(), inputs, world, bindings)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("world", [0, -2, 3, 5])
def test_world_size_must_be_a_multiple_of_the_stages(world):
    with pytest.raises(BindError, match=f"world size {world} is not a positive multiple of the 2"):
        interpret(pipeline(), [{}] * max(world, 0), world, {"N": 6})


def test_a_rank_needs_only_the_inputs_of_its_stage():
    xs = locals_(1, (6,))
    outs = interpret(pipeline(), [{"x": xs[0]}, {"h": np.zeros(6)}], 2, {"N": 6})
    np.testing.assert_array_equal(outs[1]["z"], xs[0])


def test_a_size_that_does_not_divide_in_the_body_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"reduce_scatter\[sum,dim=0\].*N/P = 3/2 with N=6, P=4"):
        run(one_op("reduce_scatter", shape=[N]), locals_(4, (6,)), N=6)


# -- printing -------------------------------------------------------------------------------------
GOLDEN = """\
program upd(P) {
  in %0: f32[N]@local  # g
  in %1: f32[N/P]@sliced(0)  # w
  in %2: f32[N]@replicated  # r
  in %3: f32[]@replicated = 0.1  # lr
  %4: f32[N/P]@sliced(0) = reduce_scatter[sum,dim=0](%0)  # t4
  %5: f32[N/P]@sliced(0) = mul(%3, %4)  # t5
  %6: f32[N/P]@sliced(0) = slice[dim=0](%2)  # t6
  %7: f32[N/P]@sliced(0) = mul(%5, %6)  # t7
  %8: f32[N/P]@sliced(0) = sub(%1, %7)  # t8
  %9: f32[N/P]@sliced(0) = update(%1, %8)  # w.new
  out w = %9
}"""


def test_printer_golden_text():
    assert str(adam_like()) == GOLDEN


def test_printer_shows_stages_fused_groups_and_overlaps():
    p = pipeline()
    ids = [s.out.id for s in p.body]
    p = p.with_(
        fused=(dsl.Fuse((ids[0],)),),
        overlaps=(dsl.Overlap(ids[0], ids[1], 4),),
        schedule="AR-P2P-C",
    )
    text = str(p).splitlines()
    assert text[0] == "program pp(P) stages=2 schedule=AR-P2P-C {"
    assert text[1] == "  in %0: f64[N]@local@stage0  # x"
    k = text.index("  fuse#0 {")
    assert text[k : k + 3] == [
        "  fuse#0 {",
        "    %1: f64[N]@replicated@stage0 = all_reduce[sum](%0)  # t1",
        "  }",
    ]
    assert "  overlap(%1 -> %2, chunks=4)" in text and text[-1] == "}"


def test_fused_and_overlap_annotations_do_not_change_the_semantics():
    p = pipeline()
    ids = [s.out.id for s in p.body]
    q = p.with_(fused=(dsl.Fuse(tuple(ids[:2])),), overlaps=(dsl.Overlap(ids[0], ids[1], 3),))
    inputs = [{"x": np.arange(6.0)}, {"h": np.ones(6)}]
    a, b = interpret(p, inputs, 2, {"N": 6}), interpret(q, inputs, 2, {"N": 6})
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys() and all(np.array_equal(ra[k], rb[k]) for k in ra)
