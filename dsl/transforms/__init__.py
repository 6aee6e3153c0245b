"""Semantics-preserving transformations, one pure `Program -> Program` function per file.

Each checks its preconditions first and raises `TransformError` naming the statement at fault;
each result is re-verified and carries its schedule name (`Program.schedule`).
"""

from .as_slice import as_slice
from .fuse import fuse
from .naming import schedule_name
from .overlap import check_chunks, overlap
from .prefetch import prefetch
from .reorder import reorder
from .split import split

__all__ = [
    "as_slice",
    "fuse",
    "schedule_name",
    "check_chunks",
    "overlap",
    "prefetch",
    "reorder",
    "split",
]
