"""Transforms: the paper's schedules, their names, equivalence, and every precondition error."""

import pytest

import dsl
import experiments
from dsl import Builder, Local, Replicated, Sliced, TransformError, f32, sym
from dsl.transforms import as_slice, check_chunks, fuse, overlap, reorder, split

PROGRAMS = [e.name for e in experiments.registry.program_experiments()]

N = sym("N")

NAMES = {
    "adam_fusion": [
        "AR-C",
        "RS-C-AG",
        "RS-C-AG+as_slice",
        "fuse(RS-C-AG)",
        "fuse(RS-C-AG)+as_slice",
    ],
    "lamb_fusion": [
        "AR-C",
        "RS-C-AG",
        "RS-C-AG+as_slice",
        "fuse(RS-C-AG)",
        "fuse(RS-C-AG)+as_slice",
    ],
    "model_parallel": ["MM-AR-C", "MM-RS-C-AG", "ol(MM,fuse(RS-C-AG))"],
    "pipeline_parallel": ["AR-C-P2P", "AR-P2P-C", "RS-P2P-C-AG", "ol(RS,fuse(P2P-C-AG))"],
    "fsdp_prefetch": ["AG-MM-C-AG-MM", "AG-pf(AG,MM)-C-MM"],
    "tensor_parallel": [
        "AG-MM-C-MM-RS",
        "ol(AG,MM)-C-MM-RS",
        "AG-MM-C-ol(MM,RS)",
        "ol(AG,MM)-C-ol(MM,RS)",
    ],
    "tp_attention": [
        "AG-MM-ATT-MM-RS",
        "ol(AG,MM)-ATT-MM-RS",
        "AG-MM-ATT-ol(MM,RS)",
        "ol(AG,MM)-ATT-ol(MM,RS)",
    ],
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_schedule_names(name):
    assert list(experiments.get(name).schedules()) == NAMES[name]


def test_as_slice_names_say_which_state_is_sliced():
    """The paper's default (all updated state but the weights, updated last) is `+as_slice`;
    any other set is spelled out, so no two slicings share a name."""
    rs = reorder(split(experiments.get("adam_fusion").program()))
    names = {}
    for sliced in (["m"], ["v"], ["m", "v"], ["w"], ["m", "v", "w"]):
        q = rs
        for x in sliced:
            q = as_slice(q, x)
        names[tuple(sliced)] = (q.schedule, fuse(q).schedule)
    assert names[("m",)] == ("RS-C-AG+as_slice(m)", "fuse(RS-C-AG)+as_slice(m)")
    assert names[("m", "v")] == ("RS-C-AG+as_slice", "fuse(RS-C-AG)+as_slice")
    assert names[("w",)][0] == "RS-C-AG+as_slice(w)"
    assert len({n for pair in names.values() for n in pair}) == 2 * len(names)


# world sizes that split into the program's pipeline stages (the pipeline has 2)
CASES = [
    (name, world)
    for name in PROGRAMS
    for world in (1, 2, 3, 4)
    if world % experiments.get(name).program().stages == 0
]


@pytest.mark.parametrize("name, world", CASES)
def test_schedules_equivalent(name, world):
    mod = experiments.get(name)
    base = mod.program()
    P = world // base.stages
    for sched in mod.schedules().values():
        dsl.verify(sched)
        for b in mod.verify_bindings("smoke"):
            if all(v % P == 0 for v in b.values()):
                dsl.check_equivalent(base, sched, world, trials=2, bindings=b)


def _adam_like():
    b = Builder("t")
    g = b.input("g", f32, [N], Local())
    w = b.input("w", f32, [N], Replicated())
    m = b.input("m", f32, [N], Replicated())
    lr = b.param("lr", 0.1)
    s = b.all_reduce(g, name="s")
    m2 = 0.9 * m + s
    b.update(m, m2)
    b.update(w, w - lr * m2)
    return b.build()


def test_transforms_are_pure_and_keep_names():
    p = _adam_like()
    text = str(p)
    q = fuse(reorder(split(p)))
    assert str(p) == text
    assert q.schedule == "fuse(RS-C-AG)"
    assert "reduce_scatter[sum,dim=0]" in str(q) and "all_gather" in str(q)


def test_as_slice_drops_gather():
    q = as_slice(reorder(split(_adam_like())), "m")
    assert isinstance(q.input("m").value.type.layout, Sliced)
    gathers = [s for s in q.body if s.op == "all_gather"]
    assert len(gathers) == 1  # only w is re-replicated
    dsl.check_equivalent(_adam_like(), q, 4)


def _errors():
    p = _adam_like()
    b = Builder("mm")
    x = b.input("x", f32, [N, N / dsl.P], Sliced(1))
    w = b.input("w", f32, [N / dsl.P, N], Sliced(0))
    r = b.input("r", f32, [N, N], Replicated())
    y = b.matmul(x, w, name="y")
    z = b.all_reduce(y, name="z")
    b.output("o", b.matmul(z, r, name="o"))
    b.output("r2", r * 2.0)
    mm = b.build()
    b2 = Builder("two")
    g = b2.input("g", f32, [N], Local())
    h = b2.input("h", f32, [N], Local())
    a1, a2 = b2.all_reduce(g, name="a1"), b2.all_reduce(h, name="a2")
    b2.output("o", a1 + a2)
    two = b2.build()
    b3 = Builder("scalar")
    g3 = b3.input("g", f32, [N], Local())
    b3.output("o", b3.all_reduce(b3.sum(g3), name="a"))
    scalar = b3.build()
    split_p = split(p)
    return [
        ("split none", lambda: split(mm.with_(body=mm.body[:1], outputs=())), "0 statements"),
        ("split 0-d", lambda: split(scalar, "a"), "0-d all_reduce"),
        ("split dim", lambda: split(p, dim=3), "dim 3"),
        ("split not AR", lambda: split(p, "lr"), "expected a statement"),
        ("reorder none", lambda: reorder(p), "0 statements"),
        ("reorder matmul only", lambda: reorder(split(mm)), "no pointwise computation"),
        ("reorder send nothing", lambda: reorder(_send_only()), "nothing to move"),
        ("as_slice local", lambda: as_slice(split_p, "g"), "not a replicated tensor"),
        ("as_slice param", lambda: as_slice(split_p, "lr"), "not a replicated tensor"),
        ("as_slice unknown", lambda: as_slice(split_p, "zz"), "no input 'zz'"),
        ("as_slice full use", lambda: as_slice(split(mm), "r"), "needs the full tensor"),
        ("fuse two", lambda: fuse(two), "more than one collective"),
        ("fuse matmul", lambda: fuse(mm, first="y", last="z"), "overlap it instead"),
        ("fuse one", lambda: fuse(p, first="s", last="s"), "nothing to fuse"),
        ("fuse twice", lambda: fuse(fuse(reorder(split_p))), "already fused"),
        ("after fuse", lambda: split(fuse(p)), "apply fuse, overlap and prefetch last"),
        ("overlap kind", lambda: overlap(p, p.body[1].out.name), "must be a statement of kind"),
        ("overlap chunks", lambda: overlap(mm, "y", chunks=0), "chunks must be"),
        ("overlap twice", lambda: overlap(overlap(mm, "y"), "y"), "already overlapped"),
    ]


def _send_only():
    b = Builder("send", stages=2)
    x = b.input("x", f32, [N], Replicated(), stage=0)
    b.output("o", b.send(x, dst=1))
    return b.build()


@pytest.mark.parametrize("case", _errors(), ids=lambda c: c[0])
def test_precondition_errors(case):
    _, fn, text = case
    with pytest.raises(TransformError, match=None) as e:
        fn()
    assert text in str(e.value)
    assert "\n" not in str(e.value)


def test_fuse_cycle_names_statement():
    b = Builder("cyc")
    g = b.input("g", f32, [N], Local())
    a = b.all_reduce(g, name="a")
    c = b.op("mul", a, 2.0, name="c")
    d = b.op("add", c, a, name="d")
    b.output("o", d)
    p = b.build()
    with pytest.raises(TransformError, match="cycle") as e:
        fuse(p, stmts=["a", "d"])
    assert "%" in str(e.value)


def test_check_chunks():
    mod = experiments.get("model_parallel")
    ol = mod.schedules(chunks=3)["ol(MM,fuse(RS-C-AG))"]
    check_chunks(ol, {"B": 3, "S": 4, "H": 8, "K": 8, "P": 2})  # 6 rows per rank
    with pytest.raises(dsl.ShapeError, match="3 chunks do not divide the 8 rows"):
        check_chunks(ol, {"B": 2, "S": 8, "H": 8, "K": 8, "P": 2})


def test_reorder_send_rejects_shared_value():
    b = Builder("shared", stages=2)
    y = b.input("y", f32, [N], Local(), stage=0)
    s = b.all_reduce(y, name="s")
    c = b.op("mul", s, 2.0, name="c")
    b.output("keep", c)
    b.output("o", b.send(c, dst=1, name="sent"))
    with pytest.raises(TransformError, match="also used by"):
        reorder(b.build(), "sent")
