"""The DSL's error hierarchy.

Every error the DSL raises derives from `DSLError`. Messages name the statement at fault in its
printed form (see `dsl.printer`) and the rule it breaks, on one line, so the entry point can show
them as they are.
"""


class DSLError(Exception):
    """Base class of every error raised by the DSL."""


class ShapeError(DSLError):
    """Shapes that do not agree, a size that does not divide, a bad rank or dimension."""


class LayoutError(DSLError):
    """A mix of layouts that no rule allows (e.g. Sliced with Local, Sliced(0) with Sliced(1))."""


class DTypeError(DSLError):
    """Element types that do not agree; cast first."""


class TransformError(DSLError):
    """A transformation whose preconditions do not hold on the program it was given."""


class BindError(DSLError):
    """Bindings or inputs that do not fit the program (missing symbol, bad world size, ...)."""


class ArgumentError(DSLError):
    """An argument of the wrong kind: a name that is not a string, an unknown option, a tensor
    expected and something else given (dtypes and layouts: `DTypeError`, `LayoutError`)."""
