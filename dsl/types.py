"""Element types, layouts and tensor types.

Layouts say how a tensor is spread over the P ranks of a tensor-parallel group:
- `Local`: every rank holds a full tensor with its own contents (e.g. a gradient, partial sums);
- `Replicated`: every rank holds the same full tensor;
- `Sliced(dim)`: rank i holds slice i of the tensor along `dim` (contiguous, equal slices).

A `TensorType`'s shape is the shape each rank holds (so a Sliced(0) tensor of N elements has shape
[N/P]). `stage` is the pipeline stage whose ranks hold the tensor, or None when every stage does
(programs with one stage use None throughout).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

import numpy as np

from .errors import DTypeError, LayoutError, ShapeError
from .sizes import Size


class DType(Enum):
    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"
    f64 = "f64"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"  # the result of comparisons, the condition of `where`

    @property
    def is_float(self) -> bool:
        return self in (DType.f16, DType.bf16, DType.f32, DType.f64)

    @property
    def numpy(self) -> np.dtype:
        """The numpy type that stores this dtype (bf16 is stored as float32, rounded)."""
        return np.dtype(_NUMPY[self])

    @property
    def eps(self) -> float:
        """Machine epsilon (0 for integers)."""
        return _EPS[self]

    def __str__(self) -> str:
        return self.value


_NUMPY = {
    DType.f16: "float16",
    DType.bf16: "float32",
    DType.f32: "float32",
    DType.f64: "float64",
    DType.i32: "int32",
    DType.i64: "int64",
    DType.bool: "bool",
}
_EPS = {
    DType.f16: 2.0**-10,
    DType.bf16: 2.0**-7,
    DType.f32: 2.0**-23,
    DType.f64: 2.0**-52,
    DType.i32: 0.0,
    DType.i64: 0.0,
    DType.bool: 0.0,
}

f16, bf16, f32, f64, i32, i64 = DType.f16, DType.bf16, DType.f32, DType.f64, DType.i32, DType.i64


@dataclass(frozen=True)
class Local:
    def __str__(self) -> str:
        return "local"


@dataclass(frozen=True)
class Replicated:
    def __str__(self) -> str:
        return "replicated"


@dataclass(frozen=True)
class Sliced:
    dim: int = 0

    def __post_init__(self):
        if not _is_int(self.dim) or self.dim < 0:
            raise LayoutError(f"Sliced needs a dimension index >= 0, got {self.dim!r}")

    def __str__(self) -> str:
        return f"sliced({self.dim})"


Layout = Local | Replicated | Sliced


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class TensorType:
    """Checked on construction: a DType, a tuple of positive Sizes, a layout instance whose
    sliced dimension exists, a stage index >= 0 or None (one-line DSLErrors)."""

    dtype: DType
    shape: tuple[Size, ...]
    layout: Layout
    stage: Optional[int] = None

    def __post_init__(self):
        if not isinstance(self.dtype, DType):
            raise DTypeError(
                f"dtype must be one of {', '.join(d.value for d in DType)} (dsl.f32, "
                f"...), got {self.dtype!r}"
            )
        if not isinstance(self.layout, (Local, Replicated, Sliced)):
            raise LayoutError(
                f"layout must be Local(), Replicated() or Sliced(dim), got {self.layout!r}"
            )
        if not isinstance(self.shape, tuple) or not all(isinstance(s, Size) for s in self.shape):
            raise ShapeError(f"shape must be a tuple of Sizes, got {self.shape!r}")
        for k, s in enumerate(self.shape):
            if s.coeff <= 0:
                raise ShapeError(f"dimension {k} has size {s}; sizes must be positive")
        if isinstance(self.layout, Sliced) and self.layout.dim >= len(self.shape):
            raise LayoutError(
                f"{self.layout} needs a dimension {self.layout.dim}, but the tensor "
                f"has rank {len(self.shape)}"
            )
        if self.stage is not None and (not _is_int(self.stage) or self.stage < 0):
            raise ShapeError(
                f"stage must be a pipeline stage index >= 0 or None, got {self.stage!r}"
            )

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        dims = ",".join(str(s) for s in self.shape)
        where = "" if self.stage is None else f"@stage{self.stage}"
        return f"{self.dtype}[{dims}]@{self.layout}{where}"
