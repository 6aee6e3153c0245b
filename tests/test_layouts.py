"""The layout, shape and dtype rules of `dsl.ops`, as seen through the Builder."""

import pytest

import dsl
from dsl import (
    Builder,
    DTypeError,
    LayoutError,
    Local,
    P,
    Replicated,
    ShapeError,
    Sliced,
    f32,
    f64,
    i32,
    sym,
)

N, M, B, K, H = sym("N"), sym("M"), sym("B"), sym("K"), sym("H")
BOOL = dsl.DType.bool

# name -> (dtype, per-rank shape, layout); stage-bound tensors in a 2-stage builder
TENSORS = {
    "loc": (f32, [N], Local()),
    "rep": (f32, [N], Replicated()),
    "sl0": (f32, [N / P], Sliced(0)),
    "loc2": (f32, [B, N], Local()),
    "rep2": (f32, [B, N], Replicated()),
    "s20": (f32, [B / P, N], Sliced(0)),
    "s21": (f32, [B, N / P], Sliced(1)),
    "rep1": (f32, [B, 1], Replicated()),
    "repB": (f32, [B], Replicated()),
    "i": (i32, [N], Local()),
    "d": (f64, [N], Local()),
    "m": (f32, [M], Local()),
    "bool": (BOOL, [N], Local()),
    "a_rep": (f32, [B, K], Replicated()),
    "a_s0": (f32, [B / P, K], Sliced(0)),
    "a_sK": (f32, [B, K / P], Sliced(1)),
    "a_loc": (f32, [B, K], Local()),
    "a3_rep": (f32, [B, N, K], Replicated()),
    "a3_sK": (f32, [B, N, K / P], Sliced(2)),
    "w_rep": (f32, [K, H], Replicated()),
    "w_s1": (f32, [K, H / P], Sliced(1)),
    "w_s0": (f32, [K / P, H], Sliced(0)),
    "w_loc": (f32, [K, H], Local()),
    "big": (f32, [N, M], Local()),
    "bs1": (f32, [N, M / P], Sliced(1)),
}


def _id(v):
    return v if isinstance(v, str) else ""


def builder(stages=1):
    b = Builder("layouts", stages)
    t = {name: b.input(name, *spec) for name, spec in TENSORS.items()}
    if stages > 1:
        t["st0"] = b.input("st0", f32, [N], Local(), stage=0)
        t["st1"] = b.input("st1", f32, [N], Local(), stage=1)
    return b, t


ACCEPTED = [  # (expression, printed type of the result)
    (lambda b, t: t["loc"] + t["loc"], "f32[N]@local"),
    (lambda b, t: t["rep"] * t["rep"], "f32[N]@replicated"),
    (lambda b, t: t["sl0"] - t["sl0"], "f32[N/P]@sliced(0)"),
    (lambda b, t: t["sl0"] * t["rep"], "f32[N/P]@sliced(0)"),
    (lambda b, t: t["rep"] / t["sl0"], "f32[N/P]@sliced(0)"),
    (lambda b, t: t["loc"] + t["rep"], "f32[N]@local"),
    (lambda b, t: t["s21"] + t["rep"], "f32[B,N/P]@sliced(1)"),
    (lambda b, t: t["s20"] + t["rep"], "f32[B/P,N]@sliced(0)"),
    (lambda b, t: t["s20"] + t["rep1"], "f32[B/P,N]@sliced(0)"),
    (lambda b, t: t["loc2"] + t["rep"], "f32[B,N]@local"),
    (lambda b, t: t["sl0"] * 2.0 + (1 / P), "f32[N/P]@sliced(0)"),
    (lambda b, t: t["loc"] < t["rep"], "bool[N]@local"),
    (lambda b, t: b.where(t["bool"], t["loc"], 1.0), "f32[N]@local"),
    (lambda b, t: b.cast(t["sl0"], f64), "f64[N/P]@sliced(0)"),
    (lambda b, t: b.dropout(t["s21"], p=0.1, seed=1), "f32[B,N/P]@sliced(1)"),
    (lambda b, t: b.sqrt(t["rep2"]), "f32[B,N]@replicated"),
    # matmul
    (lambda b, t: t["a_s0"] @ t["w_rep"], "f32[B/P,H]@sliced(0)"),
    (lambda b, t: t["a_rep"] @ t["w_s1"], "f32[B,H/P]@sliced(1)"),
    (lambda b, t: t["a3_rep"] @ t["w_s1"], "f32[B,N,H/P]@sliced(2)"),
    (lambda b, t: t["a_sK"] @ t["w_s0"], "f32[B,H]@local"),
    (lambda b, t: t["a3_sK"] @ t["w_s0"], "f32[B,N,H]@local"),
    (lambda b, t: t["a_loc"] @ t["w_rep"], "f32[B,H]@local"),
    (lambda b, t: t["a_rep"] @ t["w_loc"], "f32[B,H]@local"),
    (lambda b, t: t["a_rep"] @ t["w_rep"], "f32[B,H]@replicated"),
    # reductions
    (lambda b, t: b.sum(t["rep2"]), "f32[]@replicated"),
    (lambda b, t: b.mean(t["loc2"]), "f32[]@local"),
    (lambda b, t: b.norm(t["s21"]), "f32[]@local"),
    # slice, update targets are inputs
    (lambda b, t: b.slice(t["rep2"], 1), "f32[B,N/P]@sliced(1)"),
    (lambda b, t: b.update(t["sl0"], t["sl0"] * 2), "f32[N/P]@sliced(0)"),
    # communication
    (lambda b, t: b.all_reduce(t["loc2"]), "f32[B,N]@replicated"),
    (lambda b, t: b.all_reduce(t["loc"], op="max"), "f32[N]@replicated"),
    (lambda b, t: b.reduce_scatter(t["loc2"], 1), "f32[B,N/P]@sliced(1)"),
    (lambda b, t: b.all_gather(t["s21"]), "f32[B,N]@replicated"),
    (lambda b, t: b.all_gather(t["sl0"]), "f32[N]@replicated"),
    (lambda b, t: b.broadcast(t["loc"], root=1), "f32[N]@replicated"),
    (lambda b, t: b.broadcast(t["rep"]), "f32[N]@replicated"),
    (lambda b, t: b.reduce(t["loc"], root=0), "f32[N]@local"),
    (lambda b, t: b.all_to_all(t["big"], 0, 1), "f32[N/P,M*P]@local"),
    (lambda b, t: b.all_to_all(t["bs1"], 0, 1), "f32[N/P,M]@sliced(0)"),
]


@pytest.mark.parametrize("expr,want", ACCEPTED, ids=_id)
def test_accepted_layouts_give_the_stated_type(expr, want):
    b, t = builder()
    assert str(expr(b, t).type) == want
    b.build()  # verify re-infers every recorded type


REJECTED = [  # (expression, error, printed statement ({name}: that input's %id), reason in the message)
    (lambda b, t: t["sl0"] + t["loc"], LayoutError, "add({sl0}, {loc})", "Local"),
    (lambda b, t: b.where(t["loc"] > 0, t["sl0"], t["rep"]), LayoutError, "where(", "Local"),
    (lambda b, t: t["s20"] * t["s21"], LayoutError, "mul({s20}, {s21})", "different dimensions"),
    (lambda b, t: b.all_reduce(t["rep"]), LayoutError, "all_reduce[sum]({rep})", "Local"),
    (lambda b, t: b.all_reduce(t["sl0"]), LayoutError, "all_reduce[sum]({sl0})", "Local"),
    (
        lambda b, t: b.reduce_scatter(t["rep"]),
        LayoutError,
        "reduce_scatter[sum,dim=0]({rep})",
        "Local",
    ),
    (lambda b, t: b.all_gather(t["loc"]), LayoutError, "all_gather({loc})", "Sliced"),
    (lambda b, t: b.all_gather(t["rep"]), LayoutError, "all_gather({rep})", "Sliced"),
    (
        lambda b, t: b.broadcast(t["sl0"]),
        LayoutError,
        "broadcast[root=0]({sl0})",
        "Local or Replicated",
    ),
    (lambda b, t: b.reduce(t["rep"]), LayoutError, "reduce[sum,root=0]({rep})", "Local"),
    (
        lambda b, t: b.all_to_all(t["bs1"], 1, 0),
        LayoutError,
        "all_to_all[split_dim=1,concat_dim=0]({bs1})",
        "concat_dim=0",
    ),
    (lambda b, t: t["a_s0"] @ t["w_loc"], LayoutError, "matmul({a_s0}, {w_loc})", "no rule"),
    (lambda b, t: t["a_loc"] @ t["w_s1"], LayoutError, "matmul({a_loc}, {w_s1})", "no rule"),
    (lambda b, t: t["a_s0"] @ t["w_s1"], LayoutError, "matmul({a_s0}, {w_s1})", "no rule"),
    (lambda b, t: b.update(t["rep"], t["sl0"]), LayoutError, "update({rep}, {sl0})", "all_gather"),
    (lambda b, t: b.update(t["loc"], t["rep"]), LayoutError, "update({loc}, {rep})", "must match"),
    (lambda b, t: b.slice(t["loc"]), LayoutError, "slice[dim=0]({loc})", "Replicated"),
    (lambda b, t: b.slice(t["sl0"]), LayoutError, "slice[dim=0]({sl0})", "Replicated"),
    (lambda b, t: b.send(t["loc"], dst=0), LayoutError, "p2p[dst=0]({loc})", "every stage"),
    # dtypes
    (lambda b, t: t["loc"] + t["d"], DTypeError, "add({loc}, {d})", "cast first"),
    (lambda b, t: t["i"] < t["loc"], DTypeError, "lt({i}, {loc})", "cast first"),
    (lambda b, t: t["bool"] + t["bool"], DTypeError, "add({bool}, {bool})", "bool"),
    (lambda b, t: b.sqrt(t["i"]), DTypeError, "sqrt({i})", "floating-point"),
    (
        lambda b, t: b.where(t["loc"], t["loc"], t["loc"]),
        DTypeError,
        "where({loc}, {loc}, {loc})",
        "bool",
    ),
    (
        lambda b, t: b.dropout(t["i"], p=0.5, seed=0),
        DTypeError,
        "dropout[p=0.5,seed=0]({i})",
        "floating",
    ),
    (lambda b, t: b.cast(t["loc"], "f16"), DTypeError, "cast[dtype=f16]({loc})", "dtype"),
    # shapes and attributes
    (lambda b, t: t["loc"] + t["m"], ShapeError, "add({loc}, {m})", "do not broadcast"),
    (lambda b, t: t["loc2"] + t["repB"], ShapeError, "add({loc2}, {repB})", "do not broadcast"),
    (
        lambda b, t: t["a_rep"] @ t["a_rep"],
        ShapeError,
        "matmul({a_rep}, {a_rep})",
        "contracted sizes",
    ),
    (lambda b, t: t["loc"] @ t["w_rep"], ShapeError, "matmul({loc}, {w_rep})", "rank 1 x rank 2"),
    (lambda b, t: b.slice(t["rep"], 1), ShapeError, "slice[dim=1]({rep})", "out of range"),
    (
        lambda b, t: b.reduce_scatter(t["loc"], 2),
        ShapeError,
        "reduce_scatter[sum,dim=2]({loc})",
        "out of range",
    ),
    (
        lambda b, t: b.all_reduce(t["loc"], op="avg"),
        ShapeError,
        "all_reduce[avg]({loc})",
        "reduction op",
    ),
    (
        lambda b, t: b.dropout(t["loc"], p=1.0, seed=0),
        ShapeError,
        "dropout[p=1.0,seed=0]({loc})",
        "[0, 1)",
    ),
    (
        lambda b, t: b.all_to_all(t["big"], 1, 1),
        ShapeError,
        "all_to_all[split_dim=1,concat_dim=1]({big})",
        "split_dim != concat_dim",
    ),
    (lambda b, t: b.broadcast(t["loc"], root=-1), ShapeError, "broadcast[root=-1]({loc})", "root"),
]


@pytest.mark.parametrize("expr,error,stmt,reason", REJECTED, ids=_id)
def test_rejected_mixes_raise_with_the_statement(expr, error, stmt, reason):
    b, t = builder()
    with pytest.raises(error) as e:
        expr(b, t)
    msg = str(e.value)
    stmt = stmt.format(**{name: str(x.value) for name, x in t.items()})
    assert stmt in msg and reason in msg and "\n" not in msg
    assert isinstance(e.value, dsl.DSLError)


STAGED = [
    (lambda b, t: b.send(t["st0"], dst=1), None, "f32[N]@local@stage1"),
    (lambda b, t: t["st0"] + t["loc"], None, "f32[N]@local@stage0"),
    (lambda b, t: b.all_reduce(t["st1"]), None, "f32[N]@replicated@stage1"),
    (lambda b, t: t["st0"] + t["st1"], LayoutError, "different pipeline stages"),
    (lambda b, t: b.send(t["st0"], dst=0), LayoutError, "must differ"),
    (lambda b, t: b.send(t["st0"], dst=2), LayoutError, "[0, 2)"),
]


@pytest.mark.parametrize("expr,error,want", STAGED, ids=_id)
def test_pipeline_stage_rules(expr, error, want):
    b, t = builder(stages=2)
    if error is None:
        assert str(expr(b, t).type) == want
    else:
        with pytest.raises(error, match=want.replace("[", r"\[").replace(")", r"\)")):
            expr(b, t)


def test_verify_rejects_a_recorded_type_that_the_rules_do_not_infer():
    b, t = builder()
    b.output("y", b.all_reduce(t["loc"]))
    p = b.build()
    s = p.body[0]
    bad = s.__class__(s.out.__class__(s.out.id, s.out.name, t["loc"].type), s.op, s.args, s.attrs)
    with pytest.raises(ShapeError, match="recorded type differs"):
        dsl.verify(p.with_(body=(bad,)))


@pytest.mark.parametrize(
    "name",
    [
        "DSLError",
        "ShapeError",
        "LayoutError",
        "DTypeError",
        "TransformError",
        "BindError",
        "EquivalenceError",
        "interpret",
        "check_equivalent",
        "random_inputs",
        "default_bindings",
        "Builder",
        "verify",
    ],
)
def test_import_dsl_exposes(name):
    assert hasattr(dsl, name) and name in dsl.__all__


def test_every_dsl_error_derives_from_dslerror():
    for err in (
        dsl.ShapeError,
        dsl.LayoutError,
        dsl.DTypeError,
        dsl.TransformError,
        dsl.BindError,
        dsl.EquivalenceError,
    ):
        assert issubclass(err, dsl.DSLError)
