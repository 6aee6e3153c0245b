"""Property test: random data-parallel programs through split, reorder, as_slice and fuse stay
equivalent to the original on world sizes 1 to 8 (hypothesis draws the programs)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsl
from dsl import Builder, Local, Replicated, f32, sym
from dsl.transforms import as_slice, fuse, reorder, split

N = sym("N")
BINARY = ("add", "sub", "mul", "maximum", "minimum")


@st.composite
def programs(draw):
    """all_reduce of a Local gradient, then random pointwise computation mixing it with replicated
    state and scalars, an optional norm, and updates of the state."""
    b = Builder("random")
    g = b.input("g", f32, [N], Local())
    n_state = draw(st.integers(1, 3))
    state = [b.input(f"s{k}", f32, [N], Replicated()) for k in range(n_state)]
    alpha = b.param("alpha", draw(st.floats(-2, 2, allow_nan=False, allow_infinity=False)))
    live = [b.all_reduce(g, name="gsum")]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(BINARY + ("neg", "scale", "dropout", "where", "sqrt1")))
        a = draw(st.sampled_from(live))
        other = draw(st.sampled_from(live + state))
        if kind in BINARY:
            out = b.op(kind, a, other)
        elif kind == "neg":
            out = -a
        elif kind == "scale":
            out = alpha * a
        elif kind == "dropout":
            out = b.dropout(a, p=0.25, seed=draw(st.integers(0, 1000)))
        elif kind == "where":
            out = b.where(a > other, a, other * 0.5)
        else:
            out = b.sqrt(a * a + 1.0)
        live.append(out)
    if draw(st.booleans()):
        scale = b.norm(live[-1]) + 1.0
        live.append(live[-1] / scale)
    for k, s in enumerate(state):
        if draw(st.booleans()) or k == 0:
            b.update(s, b.op("add", s, draw(st.sampled_from(live[1:] or live))))
    return b.build(), [s.value.name for s in state]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(1, 8), st.data())
def test_random_programs_stay_equivalent(case, world, data):
    p, state = case
    rs = reorder(split(p))
    schedules = [split(p), rs, fuse(rs)]
    sliced = rs
    for name in state:
        used = p.users(p.input(name).value.id)
        if used and data.draw(st.booleans(), label=f"as_slice {name}"):
            sliced = as_slice(sliced, name)
    schedules += [sliced, fuse(sliced)]
    for q in schedules:
        dsl.verify(q)
        dsl.check_equivalent(p, q, world, trials=1, seed=world)
