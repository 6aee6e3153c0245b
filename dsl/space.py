"""The schedule space of a program: every schedule the transformations reach, bounded.

    space = schedule_space(program, budget=Budget())
    space.schedules          # tuple[Schedule, ...], the unscheduled program first, in BFS order
    space.found, space.truncated, space.explored

A breadth-first search from `program`. From each schedule it applies every move that the
transformations' own preconditions accept (a move whose transform raises `TransformError` is not a
move): `split` of each all_reduce along each dimension, `reorder` of each all_gather and each send,
`as_slice` of each updated input, `fuse` of every suffix that starts at a communication statement,
`overlap` of each producer/consumer pair at each chunk count of the budget, and `prefetch` of each
all-gather behind the statement before it. `fuse`, `overlap` and `prefetch` come last in a schedule (the transforms refuse split/reorder/as_slice after them), so the
space is finite; the budget bounds it anyway (`max_schedules`, `max_depth`); `sliceable` limits as_slice to the tensors a caller may keep sliced.

Schedules are deduplicated by their printed IR (`str(program)`): two paths to the same program are
one schedule, kept with the first (shortest) path. A `Schedule` records the path (`steps`, each a
printed move such as `split(g.sum, dim=0)`) and the name the paper's convention gives it
(`program.schedule`); that name is not unique across the space (as_slice of m alone and of m and v
both print `+as_slice`), so `key` (a hash of the printed IR) identifies a schedule.

`check(reference, schedule, world_size, bindings)` is `dsl.check_equivalent` cached by IR key for
the life of the process.

Pure: no I/O, no ranks, no cost model.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional

from .equivalence import check_equivalent
from .errors import TransformError
from .ir import Input, Program
from .ops import COMM
from .transforms import as_slice, fuse, overlap, prefetch, reorder, split
from .transforms.overlap import PAIRS
from .types import Replicated


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Bounds of the search: at most `max_schedules` distinct schedules, paths of at most
    `max_depth` moves; `overlap_chunks` are the chunk counts tried for each overlap."""

    max_schedules: int = 512
    max_depth: int = 8
    overlap_chunks: tuple[int, ...] = (2, 4, 8)
    sliceable: Optional[tuple[str, ...]] = None  # inputs as_slice may take (None: every updated
    # replicated input). as_slice changes that output's layout to sliced: name the optimizer
    # state (m, v), not the parameters the next forward pass reads whole.


@dataclass(frozen=True)
class Schedule:
    program: Program
    steps: tuple[str, ...]  # the moves from the unscheduled program, in order

    @property
    def name(self) -> str:
        """The paper's name of the schedule (not unique across a space)."""
        return self.program.schedule

    @property
    def key(self) -> str:
        return ir_key(self.program)

    @property
    def path(self) -> str:
        return " . ".join(self.steps) if self.steps else "(unscheduled)"


@dataclass(frozen=True)
class Space:
    schedules: tuple[Schedule, ...]
    explored: int  # moves tried (applied or refused by a precondition)
    truncated: bool  # the budget stopped the search before the space was exhausted
    budget: Budget = field(default_factory=Budget)

    @property
    def found(self) -> int:
        return len(self.schedules)

    def named(self, name: str) -> list[Schedule]:
        return [s for s in self.schedules if s.name == name]


def canonical_ir(program: Program) -> str:
    """The printed IR with value ids renumbered by first appearance and names dropped: two paths
    that build the same statements in the same order print the same."""
    ids: dict[str, str] = {}
    text = re.sub(r"  #[^\n]*", "", str(program))
    text = re.sub(r"^program .*$", "", text, count=1, flags=re.M)
    return re.sub(r"%\d+", lambda m: ids.setdefault(m.group(0), f"%{len(ids)}"), text)


def ir_key(program: Program) -> str:
    """A stable identity of a schedule: the hash of its canonical printed IR."""
    return hashlib.sha256(canonical_ir(program).encode()).hexdigest()[:16]


Move = tuple[str, Callable[[], Program]]


def _stmt_name(p: Program, s) -> str:
    return s.out.name or f"%{s.out.id}"


def moves(cur: "Schedule", budget: Budget) -> Iterator[Move]:
    """Every move from `cur` that the transforms may accept, as (printed move, thunk). as_slice
    moves commute, so they are taken in name order only (one path per set of sliced tensors)."""
    p = cur.program
    scheduled = bool(p.fused or p.overlaps or p.prefetches)
    for s in p.body:
        n = _stmt_name(p, s)
        if not scheduled and s.op == "all_reduce" and s.out.type.rank > 0:
            for d in range(s.out.type.rank):
                yield f"split({n}, dim={d})", lambda s=s, d=d: split(p, s.out, dim=d)
        if not scheduled and s.op in ("all_gather", "p2p"):
            yield f"reorder({n})", lambda s=s: reorder(p, s.out)
        if s.op in COMM and not (s.op == "all_reduce" and s.out.type.rank == 0):
            yield f"fuse(from {n})", lambda s=s: fuse(p, first=s.out)
        if s.op in PAIRS:
            for c in budget.overlap_chunks:
                yield f"overlap({n}, chunks={c})", lambda s=s, c=c: overlap(p, s.out, chunks=c)
        if s.op == "all_gather":
            yield f"prefetch({n})", lambda s=s: prefetch(p, s.out)
    if not scheduled:
        done = [st[len("as_slice(") : -1] for st in cur.steps if st.startswith("as_slice(")]
        for name in _updated_replicated(p):
            if budget.sliceable is not None and name not in budget.sliceable:
                continue
            if done and name <= max(done):
                continue
            yield f"as_slice({name})", lambda name=name: as_slice(p, name)


def _updated_replicated(p: Program) -> list[str]:
    targets = {s.args[0].id for s in p.body if s.op == "update"}
    return [
        i.value.name
        for i in p.inputs
        if isinstance(i, Input)
        and i.value.id in targets
        and isinstance(i.value.type.layout, Replicated)
    ]


def schedule_space(program: Program, budget: Budget = Budget()) -> Space:
    """Breadth-first enumeration of the schedules reachable from `program` (see the module doc)."""
    seen = {ir_key(program)}
    out = [Schedule(program, ())]
    queue = deque(out)
    explored, truncated = 0, False
    while queue:
        cur = queue.popleft()
        if len(cur.steps) >= budget.max_depth:
            truncated = truncated or any(True for _ in moves(cur, budget))
            continue
        for label, thunk in moves(cur, budget):
            explored += 1
            try:
                nxt = thunk()
            except TransformError:
                continue
            key = ir_key(nxt)
            if key in seen:
                continue
            if len(out) >= budget.max_schedules:
                truncated = True
                queue.clear()
                break
            seen.add(key)
            s = Schedule(nxt, cur.steps + (label,))
            out.append(s)
            queue.append(s)
    return Space(tuple(out), explored, truncated, budget)


_VERIFIED: dict[tuple, dict[str, float]] = {}


def check(
    reference: Program,
    schedule: Schedule,
    world_size: int = 2,
    bindings: Optional[Mapping[str, int]] = None,
    trials: int = 2,
    seed: int = 0,
) -> dict[str, float]:
    """`check_equivalent(reference, schedule.program, ...)`, cached by (IR keys, settings) for the
    life of the process. Raises `dsl.EquivalenceError` for a schedule that does not compute what
    the reference does (a transform bug: the space is made only of semantics-preserving moves),
    and the DSL's errors for bindings the schedule cannot take (e.g. overlap chunks that do not
    divide them)."""
    key = (
        ir_key(reference),
        schedule.key,
        world_size,
        tuple(sorted((bindings or {}).items())),
        trials,
        seed,
    )
    if key not in _VERIFIED:
        _VERIFIED[key] = check_equivalent(
            reference, schedule.program, world_size, trials=trials, bindings=bindings, seed=seed
        )
    return _VERIFIED[key]


__all__ = [
    "Budget",
    "Schedule",
    "Space",
    "canonical_ir",
    "check",
    "ir_key",
    "moves",
    "schedule_space",
]
