"""Symbolic sizes: monomials over size symbols (N, B, S, H, P, ...) with a rational coefficient.

A `Size` is `coeff * prod(sym ** exp)`, e.g. `N/P` or `4*H/P`. Products and quotients stay exact, so
`(N/P) * P == N` holds symbolically, which is what layout rules need to match a slice against its
full tensor. Sums are not needed by any rule and are not supported. `evaluate(bindings)` gives an
int for shapes (raising `ShapeError` when the result is not a whole number, e.g. N not divisible by
P) and `value(bindings)` a float for constants such as `1/P`.

`P` is reserved: it is the size of the tensor-parallel group (the world size of a program with one
pipeline stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Union

from .errors import BindError, ShapeError

SizeLike = Union["Size", int]


@dataclass(frozen=True)
class Size:
    coeff: Fraction = Fraction(1)
    powers: tuple[tuple[str, int], ...] = ()  # sorted (symbol, exponent), exponents never 0

    # -- construction -----------------------------------------------------------------------
    @staticmethod
    def of(x: SizeLike | "Size") -> "Size":
        if isinstance(x, Size):
            return x
        if isinstance(x, (int, Fraction)) and not isinstance(x, bool):
            return Size(Fraction(x))
        raise ShapeError(f"a size must be an int or a symbolic Size, not {x!r}")

    @staticmethod
    def _make(coeff: Fraction, powers: dict[str, int]) -> "Size":
        return Size(coeff, tuple(sorted((s, e) for s, e in powers.items() if e != 0)))

    # -- arithmetic -------------------------------------------------------------------------
    def __mul__(self, other: SizeLike) -> "Size":
        o = Size.of(other)
        powers = dict(self.powers)
        for s, e in o.powers:
            powers[s] = powers.get(s, 0) + e
        return Size._make(self.coeff * o.coeff, powers)

    __rmul__ = __mul__

    def __truediv__(self, other: SizeLike) -> "Size":
        o = Size.of(other)
        if o.coeff == 0:
            raise ShapeError("size divided by zero")
        return self * Size._make(1 / o.coeff, {s: -e for s, e in o.powers})

    def __rtruediv__(self, other: SizeLike) -> "Size":
        return Size.of(other) / self

    def __pow__(self, k: int) -> "Size":
        return Size._make(self.coeff**k, {s: e * k for s, e in self.powers})

    # -- queries ----------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.powers

    def symbols(self) -> set[str]:
        return {s for s, _ in self.powers}

    def value(self, bindings: Mapping[str, int]) -> Fraction:
        out = self.coeff
        for s, e in self.powers:
            if s not in bindings:
                raise BindError(f"size symbol {s} is not bound (bindings: {dict(bindings)})")
            out *= Fraction(bindings[s]) ** e
        return out

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        v = self.value(bindings)
        if v.denominator != 1:
            raise ShapeError(
                f"size {self} = {v} with {_fmt_bind(self, bindings)}: not a whole number"
                " (a size does not divide by the world size)"
            )
        return int(v)

    def __str__(self) -> str:
        num = [s if e == 1 else f"{s}^{e}" for s, e in self.powers if e > 0]
        den = [s if e == -1 else f"{s}^{-e}" for s, e in self.powers if e < 0]
        c = self.coeff
        if c.numerator != 1 or not num:
            num.insert(0, str(c.numerator))
        if c.denominator != 1:
            den.insert(0, str(c.denominator))
        text = "*".join(num)
        if den:
            text += "/" + ("/".join(den))
        return text

    __repr__ = __str__


def _fmt_bind(size: Size, bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={bindings[s]}" for s in sorted(size.symbols()) if s in bindings)


def sym(name: str) -> Size:
    """A size symbol, e.g. `N = sym("N")`."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"size symbol {name!r} is not an identifier")
    return Size(Fraction(1), ((name, 1),))


P = sym("P")
