"""The autotuner as a library call: the best schedule of a program at a point on a topology.

    tuned = autotune(program, topology, {"N": 1 << 24}, world_size=256)
    tuned.chosen.program        # the chosen schedule (a verified dsl.Program)
    tuned.chosen.label          # e.g. "fuse(RS-C-AG)+as_slice [... as_slice(m) . as_slice(v)] c=4"
    tuned.ranking               # [(Candidate, cost_model.rank.Ranked)], predicted best first
    tuned.found, tuned.search_s

1. The space: `dsl.space.schedule_space(program, budget)`: every schedule the five transforms reach
   (split, reorder, as_slice, fuse, overlap with its chunk counts), deduplicated by canonical IR.
   as_slice takes only the inputs named in `sliceable` (default none: as_slice changes an
   output's layout, so the caller names the state it keeps sliced, e.g. Adam's ("m", "v")).
2. Verification: each schedule against the program with `dsl.check_equivalent` at
   `verify_bindings` (cached per process by IR hash); a schedule that cannot run at a verification
   binding (an overlap's chunks do not divide it) is checked at the others; one that no binding
   admits is left out and counted in `unverifiable`.
3. Candidates: each schedule x each `fused_chunks` (the lowering's chunk count of a fused
   collective; one candidate for a schedule without one, or whose overlap sets the chunks), lowered at `bindings` on `world_size`
   ranks; one that does not lower there (chunks that do not divide the point) is left out.
4. Ranking: `cost_model.rank.rank`: the closed form over all candidates, the DES over the `top_k`.

Times are microseconds (cost model). Errors: a program that is not valid, or bindings it cannot
take, raise the DSL's own errors.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence

from codegen.lower import lower
from cost_model.rank import Ranked, rank
from cost_model.topology import Topology
from dsl import DSLError, Program
from dsl.equivalence import EquivalenceError
from dsl.space import Budget, Schedule, check, schedule_space


@dataclass(frozen=True)
class Candidate:
    schedule: Schedule
    fused_chunks: Optional[int]  # None: the schedule has no fused collective
    label: str  # unique within one autotune call

    @property
    def program(self) -> Program:
        return self.schedule.program

    @property
    def name(self) -> str:
        """The paper's name of the schedule (not unique)."""
        return self.schedule.name


@dataclass(frozen=True)
class Tuned:
    chosen: Candidate
    ranking: list  # [(Candidate, Ranked)], predicted best first
    found: int  # distinct schedules in the space
    candidates: int  # (schedule, parameters) pairs ranked
    unverifiable: int  # schedules no verification binding admits
    truncated: bool  # the budget stopped the search early
    search_s: float  # wall time of enumerate + verify + lower + rank

    def named(self, name: str) -> list:
        """Ranked entries whose schedule has the paper's name `name`."""
        return [(c, r) for c, r in self.ranking if c.name == name]


def _labels(schedules: Sequence[Schedule]) -> dict[str, str]:
    """Schedule key -> a unique label: the paper's name, with its path where names collide."""
    count = Counter(s.name for s in schedules)
    return {s.key: s.name if count[s.name] == 1 else f"{s.name} [{s.path}]" for s in schedules}


def _verify(space, world_sizes, bindings, trials: int) -> tuple[list[Schedule], int]:
    """The schedules verified at every world size and at least one binding; how many none admits."""
    reference = space.schedules[0].program
    ok, unverifiable = [space.schedules[0]], 0
    for s in space.schedules[1:]:
        admitted = 0
        for b in bindings or [None]:
            try:
                for ws in world_sizes:
                    check(reference, s, ws, b, trials=trials)
                admitted += 1
            except EquivalenceError:
                raise
            except DSLError:
                continue  # this binding does not admit the schedule (overlap chunks)
        if admitted:
            ok.append(s)
        else:
            unverifiable += 1
    return ok, unverifiable


def candidates(schedules: Sequence[Schedule], fused_chunks: Sequence[int]) -> list[Candidate]:
    labels = _labels(schedules)
    out = []
    for s in schedules:
        if s.program.fused and not s.program.overlaps:  # an overlap's chunks set the fused ones
            out += [Candidate(s, c, f"{labels[s.key]} c={c}") for c in fused_chunks]
        else:
            out.append(Candidate(s, None, labels[s.key]))
    return out


def autotune(program: Program, topology: Topology, bindings: Mapping[str, int],
             world_size: int, *, sliceable: Sequence[str] = (), budget: Budget = Budget(),
             top_k: int = 8,
             fused_chunks: Sequence[int] = (2, 4, 8), verify_world_sizes: Sequence[int] = (2,),
             verify_bindings: Optional[Sequence[Mapping[str, int]]] = None,
             trials: int = 1) -> Tuned:
    """See the module doc."""
    t0 = time.perf_counter()
    space = schedule_space(program, replace(budget, sliceable=tuple(sliceable)))
    schedules, unverifiable = _verify(space, verify_world_sizes, verify_bindings, trials)
    plans, kept = {}, {}
    for c in candidates(schedules, fused_chunks):
        try:
            plans[c.label] = lower(c.program, dict(bindings), world_size,
                                   fused_chunks=c.fused_chunks or 4)
        except DSLError:
            continue  # this point does not admit the candidate's chunks
        kept[c.label] = c
    ranking = [(kept[r.key], r) for r in rank(plans, topology, top_k=top_k)]
    return Tuned(ranking[0][0], ranking, space.found, len(plans), unverifiable, space.truncated,
                 time.perf_counter() - t0)


__all__ = ["Candidate", "Ranked", "Tuned", "autotune", "candidates"]
