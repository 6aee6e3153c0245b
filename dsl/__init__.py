"""coconet-suite's DSL: computation and communication as first-class statements of one program.

Public surface: the IR (`Program`, `Stmt`, `Value`, ...), types and layouts, symbolic sizes, the
`Builder`, `verify`, the reference semantics `interpret`, `check_equivalent`, `error_bounds` and
`runs_agree` (per-element error bounds, the rule of every numerical check), the transforms in
`dsl.transforms`, and the error classes (all derive from `DSLError`).
"""

from .bound_rules import Bound
from .bounds import error_bounds, runs_agree, within
from .builder import Builder, Tensor
from .equivalence import EquivalenceError, check_equivalent, default_bindings, random_inputs
from .errors import (
    ArgumentError,
    BindError,
    DSLError,
    DTypeError,
    LayoutError,
    ShapeError,
    TransformError,
)
from .interpret import interpret
from .ir import Const, Fuse, Input, Overlap, Program, Stmt, Value
from .printer import format_program, format_stmt
from .sizes import P, Size, sym
from .types import DType, Local, Replicated, Sliced, TensorType, bf16, f16, f32, f64, i32, i64
from .verify import verify

__all__ = [
    "Builder",
    "Tensor",
    "ArgumentError",
    "BindError",
    "DSLError",
    "DTypeError",
    "LayoutError",
    "ShapeError",
    "TransformError",
    "Const",
    "Fuse",
    "Input",
    "Overlap",
    "Program",
    "Stmt",
    "Value",
    "format_program",
    "format_stmt",
    "P",
    "Size",
    "sym",
    "DType",
    "Local",
    "Replicated",
    "Sliced",
    "TensorType",
    "bf16",
    "f16",
    "f32",
    "f64",
    "i32",
    "i64",
    "verify",
    "interpret",
    "check_equivalent",
    "random_inputs",
    "EquivalenceError",
    "default_bindings",
    "Bound",
    "error_bounds",
    "runs_agree",
    "within",
]
