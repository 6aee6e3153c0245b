"""The runtime's process groups and the checks its transfers share (`codegen.runtime.comm`'s
contract: tensors, dtypes, ops, chunks and tags are specified there).

`Group`: a process group (None: the default one), its members' global ranks in group order, its
timeout (s), which every wait passes so that a lost peer raises, never hangs. `chunk_size(n,
chunks)`: elements per chunk of an n-element slice. `check`, `op_of`, `make_tag`, `overlaps`,
`wait_work`: the validation, reduction ops, message tags and timed waits of `comm` and `rings`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

OPS = {
    "sum": (dist.ReduceOp.SUM, torch.add),
    "max": (dist.ReduceOp.MAX, torch.maximum),
    "min": (dist.ReduceOp.MIN, torch.minimum),
    "prod": (dist.ReduceOp.PRODUCT, torch.mul),
}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
KIND_RS, KIND_AG, KIND_P2P = 1, 2, 3
SEQ_BITS, USER_TAGS = 20, 64


@dataclass(frozen=True)
class Group:
    """A process group (`pg`, None = default), its members' global ranks, and its timeout."""

    pg: object
    ranks: tuple[int, ...]
    timeout_s: float

    @classmethod
    def world(cls) -> Group:
        return cls(None, tuple(range(dist.get_world_size())), pg_timeout_s(None))

    @classmethod
    def of(cls, pg, ranks=None) -> Group:
        """Wrap an existing process group; `ranks` default to its members in group order."""
        ranks = tuple(ranks if ranks is not None else dist.get_process_group_ranks(pg))
        return cls(pg, ranks, pg_timeout_s(pg))

    @classmethod
    def new(cls, ranks, timeout_s: float | None = None) -> Group:
        """Create a subgroup; collective: every rank must call it, with the same ranks."""
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        pg = dist.new_group(list(ranks), timeout=timeout, backend="gloo")
        return cls(pg, tuple(ranks), timeout_s or pg_timeout_s(None))

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def me(self) -> int:
        rank = dist.get_rank()
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} is not a member of group {list(self.ranks)}")
        return self.ranks.index(rank)

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    def right(self, me: int) -> int:
        return self.ranks[(me + 1) % self.size]

    def left(self, me: int) -> int:
        return self.ranks[(me - 1) % self.size]


def pg_timeout_s(pg) -> float:
    """The timeout a process group was created with (torch's default if it cannot be read)."""
    try:
        group = pg if pg is not None else dist.group.WORLD
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return dist.default_pg_timeout.total_seconds()


def chunk_size(n: int, chunks: int) -> int:
    """Elements per chunk of an n-element slice; ValueError unless `chunks` divides n."""
    if chunks < 1 or n % chunks:
        raise ValueError(f"chunks={chunks} must be >= 1 and divide the slice of n={n} elements")
    return n // chunks


def check(t: torch.Tensor, name: str, numel: int | None = None, dtype=None) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor (flatten it first)")
    if t.dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (one of {DTYPES})")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements, expected {numel}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}")


def op_of(op: str):
    if op not in OPS:
        raise ValueError(f"op={op!r} is not one of {sorted(OPS)}")
    return OPS[op]


def make_tag(kind: int, user_tag: int, seq: int) -> int:
    if not 0 <= user_tag < USER_TAGS or seq >= 1 << SEQ_BITS:
        raise ValueError(f"tag={user_tag} must be in 0..{USER_TAGS - 1} (and chunks*steps < 2^20)")
    return (kind << 26) | (user_tag << SEQ_BITS) | seq


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def wait_work(work, group: Group) -> None:
    if work is not None:
        work.wait(group.timeout)
