"""The measurement harness: an experiment's baseline and schedules timed side by side on ranks.

    rows = measure(exp, settings)      # every point x (baseline, schedules), on local ranks
                                       # (or on the ranks torchrun started)

For each world size (`exp.measure_worlds`, else `settings.world_size`) the parent lowers every
schedule at every point (`exp.points(scale, max_elements)` or `settings.points`), compiles the
kernels with the run's backend (`codegen.runtime.backend.get(settings.backend)`: cpu, cuda; written
to `settings.kernels_dir`), and starts the ranks, each on that backend (device, process groups,
communicator, clock). On every rank, before
any point, the baseline is checked against `dsl.interpret` of the unscheduled program at
`exp.check_bindings` (default: the first verification binding): `verified` is false on every row
when it differs. Then per point:

- inputs: one random global array per program input (`dsl.equivalence.global_inputs`, seeded by
  `settings.seed`), the same on every rank, cut to each rank by each program's layouts
  (`distribute`); the baseline gets the unscheduled program's cut, with the hyper-parameters'
  defaults (`BaselineContext.inputs`);
- reference: one `step()` of the baseline built with `exact=True`; a schedule is `verified` when
  one `run()` of its Plan gives every output, on every rank, within twice the element's error
  bound from `dsl.error_bounds` of the unscheduled program on the same inputs of it (`dsl.bounds`:
  matmul and reduction orders differ; an as_slice'd output compared on this rank's slice). An
  elementwise program (the optimizers) is bounded chunk by chunk, this rank's outputs only, in
  float32 rounded up (`dsl.bounds_chunked`: memory of the outputs, not of every intermediate),
  and compared chunk by chunk;
- graph: each schedule's step is captured as one CUDA graph before its reference check
  (`codegen.runtime.graph.StepGraph`, ranks agreeing), so the step checked is the step timed;
  rows add `graphed`, `graph_reason` (why it ran eagerly; baselines: `BASELINE_EAGER`) and
  `host_us`, the time to issue one step (perf_counter around the call, the median of its calls,
  the slowest rank's; on the CPU, where a call blocks, the step's own time);
- time: `time_point` (warm-up, repeats, a barrier before each, the slowest rank's time; a short
  step repeated until its repeats take 300 ms), baseline first, then each schedule; median, min,
  max; `compute_ms` is the time in the baseline's library computation or the Plan's kernels and
  matmuls (the median call's, averaged over the ranks that compute: a pipeline's one stage;
  the baseline's row also has `library_ms` where the baseline keeps it: the part of its
  computation the cost model takes from the measurement; and `probe_ms` where the baseline
  names a memory probe, `memory_probe`: that library routine's median time, timed in the same
  rounds on a copy of the inputs, not held to the rounds' target; on 2 ranks and more,
  `comm_probe_ms`: the mean time of an all-reduce of COMM_PROBE_BYTES on the run's transport,
  `comm_probe`, timed in the same rounds and not held to their target either: the
  communication rate's reference, `experiments.predict.comm_scale`), `comm_ms` = time_ms -
  compute_ms, and an `ol(...)` schedule's
  `overlapped_ms` = the split schedule's comm_ms at the point minus its own, floored at 0.

With comm=shm the library baseline also runs on gloo (`GLOO_BASELINE`, its own row), timed in
the same rounds, and every row adds `speedup_gloo` (`_lo`, `_hi`): its paired speedup over it.

Rank 0 appends each row to `settings.csv_path` as soon as it is measured and prints it with a
progress bar (`publish`). The rows are the results table's (docs/ref/results-csv.md); `speedup` is over the
baseline at the same point. The experiment reaches the ranks by name (and, for a user's module,
by its module spec: `registry.source_of`), so its fields need not be picklable.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

import dsl
from codegen.lower import lower
from codegen.runtime import backend as backends
from codegen.runtime.backend import NO_STREAMS
from codegen.runtime.execute import PlanRunner
from codegen.runtime.graph import StepGraph
from codegen.runtime.launch import placement, run_ranks
from codegen.runtime.measure import Timing, time_ranks
from dsl.bounds import within
from dsl.bounds_chunked import chunk_symbol, chunked_errors
from dsl.equivalence import distribute, global_inputs
from dsl.types import Sliced
from reports.progress import Progress
from reports.results import append_row

from . import registry
from .api import (
    COMM_PROBE_BYTES,
    GLOO_BASELINE,
    BaselineContext,
    MeasureSettings,
    with_defaults,
)
from .rounds import Budget, interleave

if TYPE_CHECKING:  # the kinds call this module
    from .kinds import Experiment

log = logging.getLogger(__name__)

PROBE = "probe"  # the baseline's memory probe among a point's timed functions (`probe_ms`)
COMM_PROBE = "comm_probe"  # the all-reduce timed among them, on 2 ranks and more (`comm_probe_ms`)
BASELINE_EAGER = "a library baseline runs as written"  # its rows' graph_reason

MIN_TIMED_MS, MORE_REPEATS = 300.0, 4  # a point's repeats add up to 300 ms, up to 4x repeats
FUSED_CHUNKS = 4  # chunks of a fused collective


# -- timing and publishing (shared with calibrate and collectives) --------------------------------
def time_point(fn: Callable[[], None], warmup: int, repeats: int, clock=None) -> Timing:
    """A measured point's timing: `time_ranks` with the backend's `clock`, a short step repeated
    until its repeats take MIN_TIMED_MS (at most MORE_REPEATS x repeats), so that its median rests
    on more samples."""
    return time_ranks(
        fn,
        warmup,
        repeats,
        min_total_ms=MIN_TIMED_MS,
        max_repeats=MORE_REPEATS * repeats,
        clock=clock,
    )


def agree(ok: bool) -> bool:
    """True on every rank when it is true on every rank."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t[0])


def publish(row: dict, csv_path, rank: int, bar: Progress, label: str) -> dict:
    """Rank 0: append the row to results.csv and print it with the progress line."""
    line = bar.step(f"{label.strip()} {row['schedule']}")
    if rank == 0:
        append_row(csv_path, row)
        verdict = "verified" if row["verified"] else "NOT VERIFIED"
        spread = (
            f"x{row['speedup']:.3f} [{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}] "
            f"{row['rounds']} rounds{' (budget)' if row['stopped'] == 'budget' else ''}"
            if "rounds" in row
            else f"x{row['speedup']:.2f}"
        )
        log.info(
            f"  {label} {row['schedule']:24s} {row['time_ms']:9.2f} ms "
            f"[{row['time_ms_min']:.2f}, {row['time_ms_max']:.2f}]  {spread} "
            f"{verdict}\n  {line}"
        )
    return row


# -- the parent -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What the ranks need: the experiment by name (and module), the plans, the settings."""

    experiment: str
    source: Optional[str]  # the user's module spec that registers it; None: shipped
    world_size: int
    points: tuple[tuple[tuple[str, int], ...], ...]  # each point's bindings as (symbol, value)
    plans: tuple[tuple[tuple[str, object, object], ...], ...]  # per point: (name, Program, Plan)
    budget: Budget  # the interleaved rounds' warm-up, rounds, time per point, target interval
    csv_path: str
    seed: int
    backend: str
    comm: Optional[str] = None  # the backend's transport; None: its default


def measure(exp: Experiment, settings: MeasureSettings) -> list[dict]:
    """Measured rows of a program experiment at every point and world size (see the module)."""
    if not exp.has_program:
        raise ValueError(f"experiment {exp.name} has no DSL program to measure")
    schedules = dict(settings.schedules if settings.schedules is not None else exp.schedules())
    every = [
        dict(b) for b in (settings.points or exp.points(settings.scale, settings.max_elements))
    ]
    rows: list[dict] = []
    for world in exp.measure_worlds or (settings.world_size,):
        todo = [b for b in every if (world, tuple(sorted(b.items()))) not in settings.skip]
        if not todo:
            continue
        plans = tuple(
            tuple(
                (name, p, lower(p, b, world, fused_chunks=FUSED_CHUNKS))
                for name, p in schedules.items()
            )
            for b in todo
        )
        kernels = list(
            {k.name: k for pl in plans for _, _, plan in pl for k in plan.kernels()}.values()
        )
        log.info(f"building {len(kernels)} kernels ...")
        target = backends.get(settings.backend, **_comm(settings.comm))
        target.precompile(kernels)
        target.write_sources(kernels, settings.kernels_dir, exp.name)
        spec = Spec(
            exp.name,
            registry.source_of(exp.name),
            world,
            tuple(tuple(b.items()) for b in todo),
            plans,
            budget_of(settings),
            str(settings.csv_path),
            settings.seed,
            settings.backend,
            settings.comm,
        )
        rows += run_ranks(
            rank_main,
            world,
            args=(spec, kernels),
            timeout_s=settings.timeout_s,
            collective_timeout_s=settings.collective_timeout_s,
        )[0]
    return rows


def _comm(comm: Optional[str]) -> dict:
    """The backend's options for the run's transport (none: the backend's default)."""
    return {"comm": comm} if comm else {}


def budget_of(settings: MeasureSettings) -> Budget:
    """The interleaved rounds' budget from the run's settings."""
    return Budget(
        warmup=settings.warmup,
        min_rounds=settings.min_rounds,
        max_rounds=max(settings.min_rounds, settings.max_rounds),
        budget_s=settings.point_budget_s,
        ci_pct=settings.ci_pct,
        long_rounds=settings.long_rounds,
        long_budget_s=settings.long_budget_s,
    )


# -- one rank -------------------------------------------------------------------------------------
def rank_main(rank: int, world: int, spec: Spec, kernel_list: list) -> list[dict]:
    exp = registry.resolve(spec.experiment, spec.source)
    program = exp.program()
    backend = backends.get(spec.backend, **_comm(spec.comm))
    kernels = backend.build(kernel_list)  # compiled by the parent: loads from the cache
    groups = backend.groups(program.stages)
    clock = backend.clock()
    baseline_ok = agree(_baseline_matches_program(exp, program, rank, world, backend, groups))
    weights = [
        math.prod(dict(b).values())
        for b, pl in zip(spec.points, spec.plans)
        for _ in range(1 + len(pl))
    ]
    bar = Progress(weights, label=exp.name)
    rows: list[dict] = []
    for items, plans in zip(spec.points, spec.plans):
        b = dict(items)
        rows += _point(
            exp,
            program,
            spec,
            b,
            plans,
            rank,
            world,
            (backend, kernels, groups, clock),
            baseline_ok,
            bar,
        )
    return rows


def _point(exp, program, spec, b, plans, rank, world, target, baseline_ok, bar) -> list[dict]:
    backend, kernels, groups, clock = target
    P = world // program.stages
    globals_ = global_inputs(program, P, b, np.random.default_rng([spec.seed, *b.values()]))
    every = distribute(program, globals_, world, b)
    mine = with_defaults(program, every[rank])
    error = _allowed_error(program, every, world, b, rank)
    ctx = dict(rank=rank, world_size=world, P=P, backend=backend, groups=groups, inputs=mine)
    ref = exp.baseline(BaselineContext(**ctx, exact=True))
    ref.step()
    reference = ref.outputs()
    del ref
    timed = {"baseline": exp.baseline(BaselineContext(**ctx, exact=False))}
    verified = {"baseline": baseline_ok}
    if spec.comm == "shm":  # the library baseline on gloo as well, timed in the same rounds
        gloo = backends.get(spec.backend, comm="ring")
        timed[GLOO_BASELINE] = exp.baseline(
            BaselineContext(**{**ctx, "backend": gloo}, exact=False)
        )
        verified[GLOO_BASELINE] = baseline_ok
    graphs = {name: {"graphed": False, "graph_reason": BASELINE_EAGER} for name in timed}
    for name, scheduled, plan in plans:
        runner = PlanRunner(plan, rank, kernels, groups, backend)
        inputs = distribute(scheduled, globals_, world, b)[rank]
        runner.load(inputs)  # the warm-up before a capture runs on real inputs
        step = StepGraph.capture(runner, agree=agree)
        if step.graphed:
            runner.load(inputs)  # as they were before the warm-up steps
        step.run()
        verified[name] = agree(
            _close(
                runner.outputs(),
                _local(plan, reference, runner.tp),
                _local(plan, error(reference), runner.tp),
            )
        )
        timed[name], graphs[name] = step, step.columns()
    library = hasattr(timed["baseline"], "library_ms")
    counted = {
        name: _per_call(
            obj,
            obj.step if name in ("baseline", GLOO_BASELINE) else obj.run,
            library and name == "baseline",
        )
        for name, obj in timed.items()
    }
    make_probe = getattr(exp.baseline, "memory_probe", None)
    probe = make_probe(BaselineContext(**ctx, exact=False)) if make_probe else None
    if probe is not None:  # the memory rate's reference, in the same rounds (`probe_ms`)
        counted[PROBE] = _per_call(probe, probe.alone_step, False)
    fns = {name: fn for name, (fn, _) in counted.items()}
    if world > 1:  # the communication rate's reference, in the same rounds (`comm_probe_ms`)
        fns[COMM_PROBE] = comm_probe(backend, groups)
    rounds = interleave(
        fns, spec.budget, key=(spec.seed, *b.values()), clock=clock, aside=(PROBE, COMM_PROBE)
    )
    compute = dict(
        zip(
            counted,
            _rank_average([statistics.median(s["compute_ms"]) for _, s in counted.values()]),
        )
    )
    extra = {
        "library_ms": (
            _rank_average([statistics.median(counted["baseline"][1]["library_ms"])])[0]
            if library
            else None
        ),
        "probe_ms": compute.pop(PROBE, None),
        "comm_probe_ms": (
            statistics.fmean(rounds.times_ms[COMM_PROBE]) if COMM_PROBE in fns else None
        ),
    }
    host_us = dict(
        zip(graphs, _rank_max([1e3 * statistics.median(counted[n][1]["host_ms"]) for n in graphs]))
    )
    del timed, fns, counted, probe
    row = _rows(exp, spec, b, world, program.inputs[0].value.type.dtype.name, rank, bar, rounds)
    comm_split = None
    if exp.split_schedule in compute:
        comm_split = max(0.0, rounds.time(exp.split_schedule).median - compute[exp.split_schedule])
    rows = []
    for name in compute:
        comm_ms = max(0.0, rounds.time(name).median - compute[name])
        hidden = (
            max(0.0, comm_split - comm_ms)
            if name.startswith("ol(") and comm_split is not None
            else None
        )
        rows.append(
            row(
                name,
                verified[name],
                compute[name],
                hidden,
                {**graphs[name], "host_us": round(host_us[name], 2)},
                **(extra if name == "baseline" else {}),
            )
        )
    return rows


def comm_probe(backend, groups) -> Callable[[], None]:
    """An all-reduce (sum) of COMM_PROBE_BYTES of float32 zeros over every rank, on the run's
    transport as the baselines use it: the reference `experiments.predict.comm_scale` reads the
    machine's communication rate from (its mean over the rounds, as calibration's fit takes its
    collectives' means)."""
    comm = backend.communicator(groups.world, NO_STREAMS)
    buf = torch.zeros(COMM_PROBE_BYTES // 4, dtype=torch.float32, device=backend.device)
    return lambda: comm.all_reduce(buf, "sum")


def _per_call(obj, fn: Callable[[], None], library: bool):
    """(fn counting, samples): each call's compute_ms (and library_ms) in `samples`, so that a
    row's compute is the median call's, as its time is the median round's (a mean would take
    in the calls a busy machine preempted, which the time's median leaves out); and `host_ms`:
    each call's host time (`time.perf_counter` around it: the time to issue a step)."""
    samples = {"compute_ms": [], "library_ms": [], "host_ms": []}

    def call():
        before = (obj.compute_ms, getattr(obj, "library_ms", 0.0))
        t0 = time.perf_counter()
        fn()
        samples["host_ms"].append((time.perf_counter() - t0) * 1e3)
        samples["compute_ms"].append(obj.compute_ms - before[0])
        if library:
            samples["library_ms"].append(obj.library_ms - before[1])

    return call, samples


def _rank_average(values: list) -> list:
    """Each value averaged over the ranks that spent time in it (> 0), 0 where none did: a
    pipeline's computation runs on one stage's ranks, and the other stage's (which only send or
    receive) do not halve it."""
    t = torch.tensor(values, dtype=torch.float64)
    both = torch.stack([t, (t > 0).to(torch.float64)])
    dist.all_reduce(both)
    return [float(total) / float(n) if n > 0 else 0.0 for total, n in zip(*both)]


def _rank_max(values: list) -> list:
    """Each value's maximum over the ranks (what the slowest rank paid)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(x) for x in t]


def _baseline_matches_program(
    exp: Experiment, program, rank: int, world: int, backend, groups
) -> bool:
    """The exact baseline computes what the program says (`dsl.interpret`), at small bindings,
    on these ranks."""
    b = dict(exp.check_bindings or (exp.verify_bindings("smoke") or [None])[0] or {})
    inputs = dsl.random_inputs(program, world, b or None, np.random.default_rng(0))
    expect = dsl.interpret(program, inputs, world, b or None)[rank]
    base = exp.baseline(
        BaselineContext(
            rank=rank,
            world_size=world,
            P=world // program.stages,
            backend=backend,
            groups=groups,
            inputs=with_defaults(program, inputs[rank]),
            exact=True,
        )
    )
    base.step()
    error = _allowed_error(program, inputs, world, b or None, rank)
    return _close(base.outputs(), expect, error(expect))


def _allowed_error(program, every: list, world: int, b, rank: int):
    """reference outputs -> {name: allowed |x - ref| per element}: twice the error bound of
    `dsl.error_bounds` on these inputs (chunk by chunk where the program is elementwise)."""
    if chunk_symbol(program)[0] is not None:
        errors = chunked_errors(program, every, world, b, rank)
        for e in errors.values():
            e *= 2  # exact in float32 (an overflow to inf only loosens it)
    else:
        bounds = dsl.error_bounds(program, every, world, b)[rank]
        errors = {k: 2 * x.error for k, x in bounds.items()}
    return lambda ref: {k: errors[k] for k in ref if k in errors}


def _local(plan, reference: dict, tp: int) -> dict:
    """Arrays of the baseline's (global) outputs as this rank's buffers of the plan hold them."""
    out = {}
    for name, bid in plan.outputs:
        if name not in reference:
            continue
        buf, full = plan.buffer(bid), reference[name]
        out[name] = (
            full
            if tuple(full.shape) == tuple(buf.shape) or not isinstance(buf.layout, Sliced)
            else np.split(full, plan.P, axis=buf.layout.dim)[tp]
        )
    return out


CHECK_CHUNK = 1 << 20  # elements compared at a time (`within` makes float64 copies)


def _close(got: dict, ref: dict, error: dict) -> bool:
    """The same outputs, every element within its allowed error."""
    return set(got) == set(ref) <= set(error) and all(
        _within_chunks(got[k], ref[k], error[k]) for k in ref
    )


def _within_chunks(got, ref, error) -> bool:
    g, r = np.asarray(got), np.asarray(ref)
    e = np.broadcast_to(np.asarray(error), np.shape(r))
    if g.shape != r.shape or g.ndim == 0:
        return within(g, r, e)[1] == 0
    g, r, e = g.reshape(-1), r.reshape(-1), e.reshape(-1)
    return all(
        within(g[i : i + CHECK_CHUNK], r[i : i + CHECK_CHUNK], e[i : i + CHECK_CHUNK])[1] == 0
        for i in range(0, g.size, CHECK_CHUNK)
    )


def _rows(exp, spec, b, world, dtype, rank, bar, rounds) -> Callable[..., dict]:
    """A function making (and publishing) the rows of one point from its rounds."""
    size, shape = exp.size_and_shape(b)
    label = f"N=2^{math.log2(size):.0f}" if shape.startswith("[") else f"ranks={world} {shape:24s}"

    def row(schedule, ok, compute, hidden, status, **extra) -> dict:
        got = _row(
            exp.name, spec.backend, schedule, world, size, shape, dtype, rounds, ok, compute, hidden
        )
        got.update({k: round(v, 4) for k, v in extra.items() if v is not None})
        got.update(status)  # graphed, graph_reason, host_us
        return publish(got, spec.csv_path, rank, bar, label)

    return row


def _row(
    experiment, backend, schedule, world, size, shape, dtype, rounds, ok, compute, hidden
) -> dict:
    t, x = rounds.time(schedule), rounds.speedup(schedule)
    samples = rounds.times_ms[schedule]
    gloo = {}
    if GLOO_BASELINE in rounds.times_ms:  # comm=shm: the speedup over gloo's baseline too
        xg = rounds.speedup(schedule, GLOO_BASELINE)
        gloo = {
            "speedup_gloo": round(xg.median, 4),
            "speedup_gloo_lo": round(xg.lo, 4),
            "speedup_gloo_hi": round(xg.hi, 4),
        }
    return {
        "experiment": experiment,
        "schedule": schedule,
        "source": "measured",
        "backend": backend,
        "topology": "local",
        "world_size": world,
        "size": size,
        "shape": shape,
        "dtype": dtype,
        "time_ms": round(t.median, 4),
        "time_ms_min": round(min(samples), 4),
        "time_ms_max": round(max(samples), 4),
        "time_ms_lo": round(t.lo, 4),
        "time_ms_hi": round(t.hi, 4),
        "speedup": round(x.median, 4),
        "speedup_lo": round(x.lo, 4),
        "speedup_hi": round(x.hi, 4),
        "rounds": rounds.rounds,
        "stopped": rounds.stopped,
        "verified": ok,
        "compute_ms": round(compute, 4),
        "comm_ms": round(max(0.0, t.median - compute), 4),
        "overlapped_ms": "" if hidden is None else round(hidden, 4),
        **gloo,
        **dict(zip(("nodes", "ranks_per_node"), placement())),
    }
