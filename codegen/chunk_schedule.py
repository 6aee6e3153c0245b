"""The chunk schedule of a fused collective: which elements chunk c covers, in what order.

    chunk_bounds(n, C) -> ((lo_0, hi_0), .., (lo_{C-1}, hi_{C-1}))   # elements, in order

One definition for every target that runs a fused step chunk by chunk: the CPU's chunked and
shared-memory paths (`codegen.runtime.pipelined`: `r.compute(s, lo, hi)` per chunk) and the
in-kernel chunk loop of the symmetric-memory CUDA kernel (`codegen.render_symm`, which renders
this table into the kernel), so `comm=shm` and `comm=symm` process the same element ranges in
the same order. Chunk c of an n-element slice is [c*n//C, (c+1)*n//C) (`codegen.runtime.comm`'s
rule where C divides n; the first chunks are the shorter ones otherwise). Pure: no torch.
"""

from __future__ import annotations


def chunk_bounds(n: int, C: int) -> tuple[tuple[int, int], ...]:
    """The C chunks of n elements as (begin, end) pairs, in the order they are processed."""
    if C < 1 or n < 0:
        raise ValueError(f"chunk_bounds: need C >= 1 and n >= 0 (got n={n}, C={C})")
    return tuple((c * n // C, (c + 1) * n // C) for c in range(C))


__all__ = ["chunk_bounds"]
