"""Hostile and careless DSL input: every case ends in a one-line `DSLError` subclass at the call
that is wrong, never another exception, never accepted (issue 54's list, and neighbours)."""

from __future__ import annotations

import math

import pytest

from dsl import (
    ArgumentError,
    BindError,
    Builder,
    DSLError,
    Local,
    Replicated,
    ShapeError,
    check_equivalent,
    f32,
    sym,
)

N = sym("N")


def one():
    b = Builder("p")
    return b, b.input("x", f32, [N], Local())


def built(fn):
    b, x = one()
    b.output("y", fn(b, x))
    return b.build()


def double():
    return built(lambda b, x: x * 2.0)


def replicated(fn):
    b = Builder("p")
    x = b.input("x", f32, [N], Replicated())
    b.output("y", fn(b, x))
    return b.build()


CASES = {
    # names reach printed programs, reports and generated code's comments: identifiers only
    "a result name that breaks out of a comment": (
        lambda: built(lambda b, x: b.op("mul", x, 2.0, name="y\n#define v1 42.0f")),
        ArgumentError,
    ),
    "a result name that is not a string": (
        lambda: built(lambda b, x: b.op("mul", x, 2.0, name=5)),
        ArgumentError,
    ),
    "an input name with a space": (
        lambda: Builder("p").input("a b", f32, [N], Local()),
        ArgumentError,
    ),
    "a program name with a newline": (lambda: Builder("p\nq"), ArgumentError),
    "an output name that is not a string": (lambda: one()[0].output(3, one()[1]), ArgumentError),
    "a size symbol that is not a string": (lambda: sym(3), ShapeError),
    "two outputs with one name": (
        lambda: built(lambda b, x: (b.output("y", x * 3.0), x)[1]),
        ShapeError,
    ),
    "two inputs with one name": (lambda: one()[0].input("x", f32, [N], Local()), ShapeError),
    # numbers that are not numbers
    "a NaN hyper-parameter": (lambda: one()[0].param("lr", float("nan")), ArgumentError),
    "an infinite hyper-parameter": (lambda: one()[0].param("lr", math.inf), ArgumentError),
    "a NaN constant": (lambda: built(lambda b, x: x * float("nan")), ArgumentError),
    "an infinite constant": (lambda: built(lambda b, x: x + math.inf), ArgumentError),
    "a fractional size": (lambda: Builder("p").input("x", f32, [2.5], Local()), ShapeError),
    "a bool as a size": (lambda: Builder("p").input("x", f32, [True], Local()), ShapeError),
    "a bool as a root": (lambda: replicated(lambda b, x: b.broadcast(x, root=True)), ArgumentError),
    "a bool as a seed": (lambda: built(lambda b, x: b.dropout(x, 0.1, True)), ArgumentError),
    "a bool as a dim": (lambda: built(lambda b, x: b.all_to_all(x, True, 0)), ArgumentError),
    "a NaN dropout probability": (
        lambda: built(lambda b, x: b.dropout(x, math.nan, 1)),
        ShapeError,
    ),
    # checks that would compare nothing
    "zero trials": (
        lambda: check_equivalent(double(), double(), 2, trials=0, bindings={"N": 4}),
        ArgumentError,
    ),
    "True as trials": (
        lambda: check_equivalent(double(), double(), 2, trials=True, bindings={"N": 4}),
        ArgumentError,
    ),
    "an empty tensor": (
        lambda: check_equivalent(double(), double(), 2, bindings={"N": 0}),
        BindError,
    ),
    "a negative size": (
        lambda: check_equivalent(double(), double(), 2, bindings={"N": -4}),
        BindError,
    ),
    "a broadcast root beyond the ranks": (
        lambda: check_equivalent(
            *[replicated(lambda b, x: b.broadcast(x, root=5))] * 2, 2, bindings={"N": 4}
        ),
        BindError,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_refused_with_a_typed_one_line_error(case):
    fn, error = CASES[case]
    with pytest.raises(DSLError) as got:
        fn()
    assert isinstance(got.value, error), f"{case}: {type(got.value).__name__}: {got.value}"
    assert "\n" not in str(got.value).replace("\\n", "")
