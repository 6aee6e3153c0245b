"""The autotuner as a library call: the best schedule of a program at a point on a topology.

    tuned = autotune(program, topology, {"N": 1 << 24}, world_size=256)
    tuned.chosen.program        # the chosen schedule (a verified dsl.Program)
    tuned.chosen.label          # e.g. "fuse(RS-C-AG)+as_slice#2 c=4" (unique; .schedule.path)
    tuned.ranking               # [(Candidate, cost_model.rank.Ranked)], predicted best first
    tuned.found, tuned.candidates, tuned.search_s   # the space, (schedule, chunks) pairs ranked
    tuned.closed_s, tuned.des_count, tuned.des_s     # the closed form over all, the DES's top k

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
4. The collective algorithm, where the backend offers a choice: for each of `algorithms` (e.g.
   `nccl_algorithms(topology)`: NCCL's, which NCCL_ALGO forces on a GPU topology) a candidate
   with it forced (`Candidate.algo`, label `... algo=tree`), ranked on the topology with
   `algo` set, where it changes what some collective of the plan runs; default none (NCCL's tuner).
5. Ranking: `cost_model.rank.rank`: the closed form over all candidates, the DES over the `top_k`
   (`closed_s`, `des_s`: their wall seconds; `search_s`: all five steps).

Times are microseconds (cost model). Errors: a program that is not valid, or bindings it cannot
take, raise the DSL's own errors.

The experiment (`python -m suite experiment=autotune target=NAME [backend=sim|cpu|cuda]
[topology=...]`): `tune(target, settings)` ranks the target's whole space at every point of the run
(the target's sweep on the run's ranks; with backend=sim, its paper setting scaled to the topology,
as `experiments.predict` predicts it) and returns the target with a new set of schedules: the
paper's named ones and the `TOP_M` predicted best at each point. The run then verifies, measures
(on a backend that can: side by side, in one run), predicts and reports them as it would the
target's own; `autotune.csv` in the run directory keeps every point's ranking (the printed program of each
point's top m and of every schedule predicted to beat all the named ones), and the report's
autotune section (`section`) gives per point the chosen schedule (the measured best of that
point's top m, else the predicted best), its predicted and measured times, the runner-up, the best
named schedule, the predicted rank against the measured rank, and the best-of-schedules line
(the paper's "CoCoNeT" line of Fig. 10). Only the fused-collective chunk count the harness
measures (`harness.FUSED_CHUNKS`) is searched there; with backend=sim on a GPU topology that forces
no algorithm, NCCL's algorithm too (`nccl_algorithms`; autotune.csv's `algo`, a pick predicted
with it forced: `Experiment.algos`, results.csv's `algo` column names what each collective ran).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence

import pandas as pd

from codegen.lower import lower
from cost_model.rank import Ranked, rank
from cost_model.topology import NCCL_ALGOS, Topology
from cost_model.workload import choices
from dsl import DSLError, Program, f32
from dsl.equivalence import EquivalenceError
from dsl.space import Budget, Schedule, check, ir_key, schedule_space
from dsl.types import Replicated, Sliced
from reports.autotune import autotune_section

from .api import DeriveSettings
from .harness import FUSED_CHUNKS
from .kinds import DerivedExperiment, Experiment
from .predict import sim_setting
from .registry import register

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    schedule: Schedule
    fused_chunks: Optional[int]  # None: the schedule has no fused collective
    label: str  # unique within one autotune call
    algo: Optional[str] = None  # NCCL's algorithm forced (NCCL_ALGO); None: NCCL's tuner picks

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
    closed_s: float = 0.0  # wall time of the closed form over every candidate
    des_s: float = 0.0  # wall time of the DES over the des_count best
    des_count: int = 0

    def named(self, name: str) -> list:
        """Ranked entries whose schedule has the paper's name `name`."""
        return [(c, r) for c, r in self.ranking if c.name == name]


def _labels(schedules: Sequence[Schedule]) -> dict[str, str]:
    """Schedule key -> a unique label: the paper's name, numbered (#1, #2, ... in the space's
    order) where several schedules share it; `Schedule.path` tells them apart."""
    count, seen = Counter(s.name for s in schedules), Counter()
    out = {}
    for s in schedules:
        seen[s.name] += 1
        out[s.key] = s.name if count[s.name] == 1 else f"{s.name}#{seen[s.name]}"
    return out


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
            out += [
                Candidate(s, c, labels[s.key] + (f" c={c}" if len(fused_chunks) > 1 else ""))
                for c in fused_chunks
            ]
        else:
            out.append(Candidate(s, None, labels[s.key]))
    return out


def autotune(
    program: Program,
    topology: Topology,
    bindings: Mapping[str, int],
    world_size: int,
    *,
    sliceable: Sequence[str] = (),
    budget: Budget = Budget(),
    top_k: int = 8,
    fused_chunks: Sequence[int] = (2, 4, 8),
    verify_world_sizes: Sequence[int] = (2,),
    verify_bindings: Optional[Sequence[Mapping[str, int]]] = None,
    trials: int = 1,
    algorithms: Sequence[str] = (),
) -> Tuned:
    """See the module doc."""
    t0 = time.perf_counter()
    space = schedule_space(program, replace(budget, sliceable=tuple(sliceable)))
    schedules, unverifiable = _verify(space, verify_world_sizes, verify_bindings, trials)
    plans, kept = {}, {}
    for c in candidates(schedules, fused_chunks):
        try:
            plans[c.label] = lower(
                c.program, dict(bindings), world_size, fused_chunks=c.fused_chunks or 4
            )
        except DSLError:
            continue  # this point does not admit the candidate's chunks
        kept[c.label] = c
    topologies, forcing = {}, {algo: replace(topology, algo=algo) for algo in algorithms}
    for label, plan in list(plans.items()):
        for algo, forced in _forced(plan, topology, forcing):
            c = replace(kept[label], label=f"{label} algo={algo}", algo=algo)
            plans[c.label], kept[c.label], topologies[c.label] = plan, c, forced
    ranked = rank(plans, topology, top_k=top_k, topologies=topologies)
    ranking = [(kept[r.key], r) for r in ranked]
    return Tuned(
        ranking[0][0],
        ranking,
        space.found,
        len(plans),
        unverifiable,
        space.truncated,
        time.perf_counter() - t0,
        ranked.closed_s,
        ranked.des_s,
        ranked.des_count,
    )


def nccl_algorithms(topology: Topology) -> tuple[str, ...]:
    """The algorithms a user can force on `topology` (NCCL_ALGO): NCCL's, on a GPU topology that
    does not force one already; none elsewhere."""
    return NCCL_ALGOS if topology.nccl is not None and topology.algo is None else ()


def _forced(plan, topology: Topology, forcing: Mapping[str, Topology]):
    """(algo, topology with it forced) for each of `forcing` that changes what some collective
    of the plan runs (NCCL falls back to its own pick where a forced one does not apply)."""
    tuner = choices(plan, topology)
    for algo, forced in forcing.items():
        if choices(plan, forced) != tuner:
            yield algo, forced


# -- the experiment ------------------------------------------------------------------------------
TOP_M = 3  # candidates measured per point besides the named schedules
TABLE = "autotune.csv"


def _sliceable(target: Experiment, dtype) -> tuple[str, ...]:
    """The inputs the target's own schedules keep as slices (the paper's as_slice choice)."""
    program = target.program(dtype)
    replicated = {
        i.value.name for i in program.inputs if isinstance(i.value.type.layout, Replicated)
    }
    return tuple(
        sorted(
            {
                i.value.name
                for p in target.schedules(dtype).values()
                for i in p.inputs
                if i.value.name in replicated and isinstance(i.value.type.layout, Sliced)
            }
        )
    )


def _setting(target: Experiment, s: DeriveSettings):
    """(world size, points, dtype) the run measures or predicts the target at."""
    if s.backend == "sim":
        world, points, dtype = sim_setting(
            target, s.topology, s.scale, s.world_size, s.max_elements
        )
    else:
        world, points, dtype = s.world_size, target.points(s.scale, s.max_elements), f32
    return world, [dict(b) for b in (s.sizes or points)], dtype


def tune(target: Experiment, s: DeriveSettings) -> Experiment:
    """The target with the named schedules and each point's TOP_M predicted best (module doc):
    the best of those that lower at every point of the run (the run measures each schedule at
    every point) and pass the suite's checks (verification at every verify binding and world
    size; with backend=sim, the target's own sweep on the run's ranks), `measurable` in
    autotune.csv."""
    if not target.has_program:
        raise ValueError(f"autotune: experiment {target.name} has no DSL program to tune")
    world, points, dtype = _setting(target, s)
    program, named = target.program(dtype), dict(target.schedules(dtype))
    names = {ir_key(p): n for n, p in named.items()}
    tunings = []
    for b in points:
        tuned = autotune(
            program,
            s.topology,
            b,
            world,
            sliceable=_sliceable(target, dtype),
            fused_chunks=(FUSED_CHUNKS,),
            top_k=2 * TOP_M,
            verify_bindings=target.verify_bindings("smoke"),
            algorithms=nccl_algorithms(s.topology) if s.backend == "sim" else (),
        )
        log.info(
            f"autotune {target.name} {target.size_and_shape(b)[1]} on {s.topology.name} "
            f"({world} ranks): {tuned.found} schedules; {tuned.candidates} candidates ranked "
            f"by the closed form in {tuned.closed_s:.2f} s, the best {tuned.des_count} by the "
            f"DES in {tuned.des_s:.2f} s (search {tuned.search_s:.1f} s); predicted best "
            f"{_label(names, tuned.chosen)}"
        )
        tunings.append((b, tuned, [(_label(names, c), c, r) for c, r in tuned.ranking]))
    schedules = {label: c.schedule for _, _, ranked in tunings for label, c, _ in ranked}
    algos = {label: c.algo for _, _, ranked in tunings for label, c, _ in ranked if c.algo}
    everywhere = (
        set.intersection(
            *(_present({label for label, _, _ in ranked}, algos) for _, _, ranked in tunings)
        )
        if tunings
        else set()
    )
    own = s.sizes or target.points(s.scale, s.max_elements)
    everywhere = {
        label
        for label in everywhere  # and pass the suite's checks: verification
        if _verifies(
            program, schedules[label], s.verify_world_sizes, target.verify_bindings(s.scale)
        )
        and (s.backend != "sim" or _lowers(schedules[label].program, own, s.world_size))
    }
    table, picked = [], {}
    for b, tuned, ranked in tunings:
        size, shape = target.size_and_shape(b)
        best_named = min(
            (k for k, (label, _, _) in enumerate(ranked) if label in named), default=len(ranked)
        )  # the rank of the best named schedule
        top = [label for label, _, _ in ranked if label in everywhere][:TOP_M]
        for rank_, (label, c, r) in enumerate(ranked):
            if label in top:
                picked.setdefault(label, c.schedule.steps)
            shown = label in top or (label not in named and rank_ < best_named)
            table.append(
                {
                    "experiment": target.name,
                    "topology": s.topology.name,
                    "world_size": world,
                    "size": size,
                    "shape": shape,
                    "schedule": label,
                    "named": label in named,
                    "measurable": label in everywhere,
                    "predicted_rank": rank_,
                    "predicted_us": round(r.time_us, 3),
                    "closed_us": round(r.closed_us, 3),
                    "found": tuned.found,
                    "candidates": tuned.candidates,
                    "search_s": round(tuned.search_s, 3),
                    "closed_s": round(tuned.closed_s, 4),
                    "des_count": tuned.des_count,
                    "des_s": round(tuned.des_s, 4),
                    "path": c.schedule.path,
                    "algo": c.algo or "",
                    "program": str(c.program) if shown else "",
                }
            )
    _write_table(s.out_dir / TABLE, table)
    paths = {label: steps for label, steps in picked.items() if label not in named}
    return _made(
        target,
        named,
        paths,
        table[0]["found"] if table else 0,
        {label: a for label, a in algos.items() if label in paths},
    )


def _made(target: Experiment, named: dict, paths: dict, found: int, algos: dict) -> Experiment:
    """The target with the picked schedules (`paths`), each predicted with its forced NCCL
    algorithm (`algos`, `Experiment.algos`)."""
    return replace(
        target,
        schedules=_schedules_of(target, named, paths),
        algos=algos,
        figure=f"autotune of {target.name} ({target.figure}): the best of {found} schedules",
        report_section=section,
    )


def recorded(target: Experiment, run_dir) -> Experiment:
    """What `tune` made in the finished run in `run_dir`, from its autotune.csv alone (nothing
    ranked again): per point the TOP_M best measurable schedules, found again by their path."""
    path = run_dir / TABLE
    if not path.exists():
        raise ValueError(f"{path} is missing: the run's ranking is needed to rebuild its report")
    table = pd.read_csv(path).sort_values("predicted_rank", kind="stable")
    named = dict(target.schedules(f32))
    paths, algos = {}, {}
    for _, part in table.groupby(["size", "shape"], sort=False):
        for _, r in part[part.measurable.astype(bool)].head(TOP_M).iterrows():
            if r.schedule not in named:
                paths[r.schedule] = _steps(r.path)
                if isinstance(r.get("algo"), str) and r.algo:
                    algos[r.schedule] = r.algo
    return _made(target, named, paths, int(table.found.iloc[0]) if len(table) else 0, algos)


def _steps(path: str) -> tuple[str, ...]:
    """The moves of a `Schedule.path` (its printed form)."""
    return () if path == "(unscheduled)" else tuple(path.split(" . "))


def _present(labels: set, algos: dict) -> set:
    """The labels a point can run: its own, and each forced-algorithm label whose schedule is
    there without it (forcing changed nothing there: the same plan, the same time)."""
    return labels | {
        label for label, algo in algos.items() if label[: -len(f" algo={algo}")] in labels
    }


def _label(names: dict, c: Candidate) -> str:
    """The paper's name of a named schedule, else the candidate's label; with its forced
    algorithm (`algo=tree`: not the named schedule, which NCCL's tuner runs)."""
    name = names.get(c.schedule.key)
    if name is None:
        return c.label
    return name if c.algo is None else f"{name} algo={c.algo}"


def _verifies(reference: Program, schedule: Schedule, world_sizes, bindings) -> bool:
    """The suite's verify step will pass: every binding at every world size (cached checks)."""
    try:
        for ws in world_sizes:
            for b in bindings or [None]:
                check(reference, schedule, ws, b, trials=1)
    except EquivalenceError:
        raise
    except DSLError:
        return False
    return True


def _lowers(program: Program, points, world: int) -> bool:
    try:
        for b in points:
            lower(program, dict(b), world)
    except (DSLError, ValueError, KeyError, ZeroDivisionError):
        return False
    return True


def _schedules_of(target: Experiment, named: dict, paths: dict):
    """schedules(dtype): the named schedules and the picked ones, found again by their path in the
    space of the program at that dtype (the enumeration is deterministic)."""

    def schedules(dtype=f32) -> dict:
        own = dict(target.schedules(dtype))
        space = {
            s.steps: s.program
            for s in schedule_space(
                target.program(dtype), Budget(sliceable=_sliceable(target, dtype))
            ).schedules
        }
        return {**own, **{label: space[steps] for label, steps in paths.items()}}

    return schedules


def _write_table(path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def section(df, out_dir) -> str:
    """The report's autotune section (reports.autotune), from results.csv and autotune.csv."""
    path = out_dir / TABLE
    if not path.exists():
        return ""
    return autotune_section(df, pd.read_csv(path), out_dir, TOP_M)


EXPERIMENT = register(
    DerivedExperiment(
        name="autotune",
        figure="the best schedule of a program per size (Fig. 10, 'CoCoNeT')",
        derive=tune,
        recorded=recorded,
        doc="python -m suite experiment=autotune target=NAME",
    )
)

__all__ = [
    "Candidate",
    "EXPERIMENT",
    "Ranked",
    "Tuned",
    "autotune",
    "candidates",
    "nccl_algorithms",
    "recorded",
    "section",
    "tune",
]
