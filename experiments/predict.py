"""Predicted rows: every schedule of an experiment simulated by the cost model on a topology.

    rows = predictions(exp, settings)        # one run's predictions (experiments.PredictSettings)
    rows = predict(exp, topo, points, world_size, dtype, baseline_compute_ms=None)

`predict` lowers each schedule (and the baseline) at each point (size bindings) and simulates the
Plan (`cost_model.median.step_median`: `cost_model.workload.simulate`, and on a calibrated
topology the median over rounds that a run reports, between its links fitted at the means and
at the medians by the step's number of calls), returning rows of the results table with
`source=predicted`, `backend=sim`, `topology=<its name>`, `speedup` over the predicted baseline
at the same point, the time split of the slowest rank (`compute_ms`, `comm_ms`: communication
exposed, `overlapped_ms`: communication hidden behind compute) and the algorithm and protocol of
each collective (`algo`, `proto`: `;`-joined in step order, `cost_model.workload.choices`).
`predictions` also returns the paper's published results for the experiment
(`paper_result_rows`: source `paper`, from cost_model/data/paper_results.csv) and the authors'
own timings on the paper's cluster (`authors_rows`: source `published`, from
cost_model/data/coconet_raw_adam.csv). The baseline has no Plan of its own: it is predicted as the library runs it, on
the unscheduled program's Plan (AR-C, MM-AR-C, AR-C-P2P: the library's all-reduce with the
topology's algorithm, then the computation), its computation taking the time the baseline's own
library computation took when it was measured in this run (`compute_ms` of the measured baseline
row at that point and world size: the same callable timed, e.g. torch's fused Adam step), given to
the Plan's first Compute step (the others, and the collectives' staging copies, take 0: the
library reduces in place); a baseline that also calls a matmul (Megatron's) gives the time
beside it (`library_ms`), and the Plan's MatMul takes the cost model's time, as the schedules'
same torch.matmul does, so that both sides of a predicted speedup time the matmul alike. Where nothing was measured (backend=sim, a GPU topology), the
baseline's computation is the generated kernels' (it equals the unscheduled schedule).
A comm=shm run also measured the library baseline on gloo (GLOO_BASELINE): given the
gloo-calibrated topology (`PredictSettings.gloo_topology`), that baseline is predicted on it the
same way (its computation the measured `baseline(gloo)` row's), as a row of its own, and every
row gains `speedup_gloo` = predicted gloo baseline time / its predicted time.

`predictions(exp, settings)`: backend=cpu, every measured point on the local topology (or the
calibrated one the run was given), each point in the spell the machine was in while it was
measured: with `settings.memory_scale` (memory_scale=true) the calibrated memory rates scaled by
`memory_scale` (the baseline's library step, or the one timed beside it, against calibration's;
off by default: on the Intel VM it read x0.78-0.93 at every optimizer point of nine paper runs,
the generated kernels ran at the calibrated rate) and the links by `comm_scale` (the all-reduce
timed in the point's rounds against calibration's measured time for it), as the row's `note`
says ("memory x1.12 comm x0.95"); then the experiment's paper setting (`exp.paper`);
backend=sim, the chosen topology: the local topology at the experiment's own sweep and the
run's world size, a GPU topology in the paper's setting scaled to it (`PaperSetting.world_on`);
then the paper's setting itself, unless the chosen topology is one of the paper's (its nodes are
the user's then) or the run names its own sizes on the local topology.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Optional

from codegen.lower import lower
from codegen.plan import Collective, Compute
from cost_model.fabric import describe as describe_fabric
from cost_model.median import step_median
from cost_model.microbench import Measurement, predict_ms
from cost_model.topology import Topology, curve_us, load_topology
from cost_model.validation import authors_raw, paper_results
from cost_model.workload import choices
from dsl import ShapeError, f32

from .api import COMM_PROBE_BYTES, GLOO_BASELINE, PredictSettings

if TYPE_CHECKING:  # the kinds call this module
    from .kinds import Experiment

MEMORY_SCALE = (0.5, 2.0)  # the range a point's memory scale is clipped to
COMM_SCALE = (0.5, 2.0)  # and its communication scale


def memory_scale(
    exp: Experiment, topo: Topology, bindings: dict, measured_ms: Optional[float]
) -> Optional[float]:
    """How fast the machine's memory ran at a measured point against its calibration: the
    calibrated time of the baseline's library routine (`Device.library_step_us` of the
    baseline's `routine`, else of the `probe` timed beside it: calibration's
    `library_<routine>`, e.g. torch's fused Adam) over the time the run took for it at that
    point (`measured_ms`: `measured_memory_reference`), clipped to MEMORY_SCALE. None where the
    baseline names no routine the device has a curve of, nothing was measured, or the point's
    gradient (f32) is smaller than the curve's smallest size (calibration times the routine
    from 2^22 elements: below, its calls back to back run from the caches, where a run's step
    after its all-reduce does not, `experiments.calibration.measure.LIBRARY_SCALES`)."""
    routine = getattr(exp.baseline, "routine", "") or getattr(exp.baseline, "probe", "")
    curve = topo.device.library_steps_us.get(routine) if routine else None
    if not curve or not measured_ms or measured_ms <= 0:
        return None
    nbytes = 4 * exp.size_and_shape(bindings)[0]
    if nbytes < min(curve):
        return None
    scale = topo.device.library_step_us(routine, nbytes) / (measured_ms * 1e3)
    return min(MEMORY_SCALE[1], max(MEMORY_SCALE[0], scale))


def comm_scale(topo: Topology, world: int, measured_ms: Optional[float]) -> Optional[float]:
    """How fast the machine's links ran at a measured point against its calibration, as the
    factor on the calibrated links' bandwidth (`Topology.with_comm_scale`) that moves the
    model's time for the all-reduce the harness timed in the point's rounds (COMM_PROBE_BYTES
    over `world` ranks) by the ratio of its mean there (`measured_ms`: `comm_probe_ms`; the fit
    takes the means of calibration's collectives) to calibration's measured mean for it
    (`Topology.all_reduce_us` at those ranks, between its sizes as `curve_us` reads them); the
    model's time is linear in 1 / bandwidth, so two evaluations give its fixed part and its wire
    part. Latencies are left alone: an all-reduce of 8 MiB is mostly wire time and says little
    about them. Clipped to COMM_SCALE. None where nothing was measured (one rank, results from
    before the probe), or calibration did not measure the all-reduce at that many ranks (a
    4-rank pipeline on a 2-rank calibration: the model's 4-rank all-reduce is itself a
    prediction, and its error is no drift)."""
    reference = curve_us(topo.all_reduce_us.get(world), COMM_PROBE_BYTES)
    if not measured_ms or measured_ms <= 0 or reference is None:
        return None
    probe = Measurement("all_reduce", COMM_PROBE_BYTES, 0.0, world)
    now, twice = predict_ms(topo, probe), predict_ms(topo.with_comm_scale(2.0), probe)
    wire = 2.0 * (now - twice)
    target = now * measured_ms * 1e3 / reference  # the model's time moved as the probe moved
    if wire <= 0 or target <= now - wire:
        return COMM_SCALE[1]
    return min(COMM_SCALE[1], max(COMM_SCALE[0], wire / (target - (now - wire))))


def local_points(exp: Experiment, rows) -> list[tuple[int, dict]]:
    """(world size, bindings) of every measured point, in the order measured."""
    seen: dict = {}
    for r in rows:
        if r.get("source", "measured") == "measured":
            key = (int(r["world_size"]), str(r["shape"]))
            seen.setdefault(key, (int(r["world_size"]), exp.bindings_of(r["size"], r["shape"])))
    return list(seen.values())


def measured_baseline_compute(rows, schedule: str = "baseline") -> dict[tuple[int, str], float]:
    """(world size, shape) -> the measured baseline's library time: its `library_ms` where it
    has one (the computation beside its matmuls, which the cost model times itself), else its
    compute_ms, from measured rows (`schedule`: GLOO_BASELINE for the baseline on gloo)."""
    return _measured(rows, schedule, ("library_ms", "compute_ms"))


def measured_memory_reference(exp: Experiment, rows) -> dict[tuple[int, str], float]:
    """(world size, shape) -> the ms the measured baseline's memory reference took, which
    `memory_scale` reads: the `probe_ms` of its row where the baseline names a probe (a row
    without one, e.g. from an older version's results.csv resumed, has none: its own
    computation is not the probe's routine), else its compute_ms (its own routine)."""
    col = "probe_ms" if getattr(exp.baseline, "probe", "") else "compute_ms"
    return _measured(rows, "baseline", (col,))


def measured_comm_reference(rows) -> dict[tuple[int, str], float]:
    """(world size, shape) -> the measured baseline row's `comm_probe_ms`, which `comm_scale`
    reads."""
    return _measured(rows, "baseline", ("comm_probe_ms",))


def _measured(rows, schedule: str, cols) -> dict[tuple[int, str], float]:
    """(world size, shape) -> the first of `cols` present in the measured row of `schedule`."""
    out = {}
    for r in rows:
        if r.get("source") != "measured" or r.get("schedule") != schedule:
            continue
        for col in cols:
            if _present(r.get(col)):
                out[(int(r["world_size"]), str(r["shape"]))] = float(r[col])
                break
    return out


def _present(value) -> bool:
    return value not in (None, "") and value == value  # NaN from pandas is absent


def library_compute_us(plan, compute_ms: Optional[float]) -> dict:
    """{step id: us}: the measured library time on the Plan's first Compute step, 0 on the other
    Compute steps and the collectives' staging; {} without a measurement."""
    steps = [s.id for s in plan.steps if isinstance(s, Compute)]
    if compute_ms is None or not steps:
        return {}
    in_place = {s.id: 0.0 for s in plan.steps if isinstance(s, Collective)}
    return {
        **in_place,
        **{sid: (compute_ms * 1e3 if i == 0 else 0.0) for i, sid in enumerate(steps)},
    }


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap_us(xs, ys) -> float:
    """The time two sorted, disjoint interval lists have in common."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        total += max(0.0, min(xs[i][1], ys[j][1]) - max(xs[i][0], ys[j][0]))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _split(result) -> tuple[float, float, float]:
    """(compute ms, communication not hidden ms, communication hidden behind compute ms) of the
    slowest rank in a simulated trace."""
    df = result.trace
    if df.empty:
        return 0.0, result.time_ms, 0.0
    rank = max(result.finish_us, key=result.finish_us.get)
    mine = df[df["rank"] == rank]
    comp = mine[mine.stream == "compute"]
    compute = float((comp.end - comp.start).sum()) / 1e3
    comm = mine[mine.stream == "comm"]
    hidden = _overlap_us(_union(zip(comp.start, comp.end)), _union(zip(comm.start, comm.end)))
    return compute, max(0.0, result.time_ms - compute), hidden / 1e3


def paper_result_rows(name: str) -> list[dict]:
    """The paper's published results for this experiment (cost_model/data/paper_results.csv) as
    rows of the results table: source `paper`, `speedup` .. `speedup_max`, with where they come
    from and the caveat."""
    return [
        {
            "experiment": name,
            "schedule": r["schedule"],
            "source": "paper",
            "backend": "",
            "topology": "dgx2",
            "world_size": int(r["world_size"]),
            "size": 0,
            "shape": "",
            "dtype": "",
            "speedup": r["speedup_min"],
            "speedup_max": r["speedup_max"],
            "note": f"{r['result']} (over {r['baseline']}; {r['setup']})",
            "reference": f"{r['where']}: {r['source']}",
            "caveat": r["caveat"],
        }
        for r in paper_results()
        if r["experiment"] == name
    ]


def authors_rows(name: str) -> list[dict]:
    """The paper's authors' own timings of this experiment on the paper's cluster
    (`cost_model.validation.authors_raw`: NCCL's default algorithm) as rows of the results
    table: source `published`, topology dgx2, `speedup` = their baseline's time over the
    schedule's at the same size (computed here from their two logs)."""
    raw = [r for r in authors_raw() if r["experiment"] == name and r["nccl_algo"] == "default"]
    base = {(r["world_size"], r["size"]): r["time_ms"] for r in raw if r["schedule"] == "baseline"}
    return [
        {
            "experiment": name,
            "schedule": r["schedule"],
            "source": "published",
            "backend": "",
            "topology": "dgx2",
            "world_size": r["world_size"],
            "size": r["size"],
            "shape": f"[{r['size']}]",
            "dtype": "f32",
            "time_ms": r["time_ms"],
            "speedup": round(base[(r["world_size"], r["size"])] / r["time_ms"], 4),
            "algo": "default",
            "reference": r["reference"],
            "caveat": r["caveat"],
        }
        for r in raw
        if (r["world_size"], r["size"]) in base
    ]


def dtype_label(program, dtype) -> str:
    """The `dtype` column of a schedule's rows: `dtype`, or where the program's tensors hold
    several float dtypes (a mixed-precision step) all of them, e.g. "f16+f32"."""
    floats = sorted(
        {
            i.value.type.dtype.name
            for i in program.inputs
            if i.value.type.dtype.is_float and i.value.type.shape
        }
    )
    return "+".join(floats) if len(floats) > 1 else dtype.name


def predict(
    exp: Experiment,
    topo: Topology,
    points: list[dict],
    world_size: int,
    dtype=None,
    schedules: Optional[dict] = None,
    baseline_compute_ms: Optional[dict] = None,
    show=None,
    gloo: Optional[Topology] = None,
    gloo_compute_ms: Optional[dict] = None,
) -> list[dict]:
    """Rows for every point x (baseline, schedules) on `topo` at `world_size` ranks;
    `baseline_compute_ms`: shape -> the measured baseline's compute ms (see the module doc).
    `gloo` (comm=shm): the library baseline also on that topology (a GLOO_BASELINE row, its
    computation `gloo_compute_ms`: shape -> ms), and every row's `speedup_gloo` over it."""
    dtype = dtype or f32
    progs = schedules if schedules is not None else dict(exp.schedules(dtype))
    base = exp.program(dtype)
    forced = {
        name: dataclasses.replace(topo, algo=algo)
        for name, algo in exp.algos.items()
        if topo.nccl is not None
    }  # NCCL_ALGO for that schedule
    rows = []
    for b in points:
        size, shape = exp.size_and_shape(b)
        t0 = time.perf_counter()
        base_plan = lower(base, b, world_size)
        measured = (baseline_compute_ms or {}).get(shape)
        labels = {
            "baseline": dtype_label(base, dtype),
            GLOO_BASELINE: dtype_label(base, dtype),
            **{name: dtype_label(p, dtype) for name, p in progs.items()},
        }
        results = {
            "baseline": (
                base_plan,
                step_median(base_plan, topo, compute_us=library_compute_us(base_plan, measured)),
            )
        }
        on = {}  # schedule -> its topology, where not forced/topo
        if gloo is not None:
            on[GLOO_BASELINE] = gloo
            results[GLOO_BASELINE] = (
                base_plan,
                step_median(
                    base_plan,
                    gloo,
                    compute_us=(library_compute_us(base_plan, (gloo_compute_ms or {}).get(shape))),
                ),
            )
        for name, p in progs.items():
            plan = lower(p, b, world_size)
            results[name] = (plan, step_median(plan, forced.get(name, topo)))
        base_ms = results["baseline"][1].time_ms
        gloo_ms = results[GLOO_BASELINE][1].time_ms if gloo is not None else None
        fabric = describe_fabric(topo, -(-world_size // topo.devices_per_node))
        for name, (plan, r) in results.items():
            compute, comm, hidden = _split(r)
            picked = choices(plan, on.get(name) or forced.get(name, topo))
            over_gloo = {} if gloo_ms is None else {"speedup_gloo": round(gloo_ms / r.time_ms, 4)}
            rows.append(
                {
                    "experiment": exp.name,
                    "schedule": name,
                    "source": "predicted",
                    "backend": "sim",
                    "topology": topo.name,
                    "world_size": world_size,
                    "size": size,
                    "shape": shape,
                    "dtype": labels[name],
                    "time_ms": round(r.time_ms, 6),
                    "speedup": round(base_ms / r.time_ms, 4),
                    "compute_ms": round(compute, 6),
                    "comm_ms": round(comm, 6),
                    "overlapped_ms": round(hidden, 6),
                    "algo": ";".join(a for _, a, _ in picked),
                    "proto": ";".join(p for _, _, p in picked),
                    **over_gloo,
                    **({"note": fabric} if fabric else {}),
                }
            )
        if show:
            best = max(
                (n for n in results if n not in ("baseline", GLOO_BASELINE)),
                key=lambda n: base_ms / results[n][1].time_ms,
            )
            show(
                f"  predicted {topo.name} P={world_size} {shape:24s} baseline {base_ms:10.3f} ms"
                f"  best {best} x{base_ms / results[best][1].time_ms:.2f}"
                f"  ({time.perf_counter() - t0:.1f} s)"
            )
    return rows


def paper_rows(
    exp: Experiment, scale: str, schedules: Optional[dict] = None, show=None
) -> list[dict]:
    """The paper's setting of this experiment, predicted on each of its topologies at its world
    size there (`PaperSetting.world_on`), with the schedules in the precision the paper ran
    them (`PaperSetting.published`) beside the others; no rows for an experiment without."""
    setting = exp.paper
    if setting is None:
        return []
    progs = {
        n: p
        for n, p in paper_schedules(exp, setting.dtype).items()
        if schedules is None or n in schedules or n in published(exp)
    }
    rows = []
    for name, nodes in setting.topologies:
        topo = load_topology(name, nodes=nodes)
        rows += predict(
            exp,
            topo,
            setting.points[scale],
            setting.world_on(topo),
            setting.dtype,
            schedules=progs,
            show=show,
        )
    return rows


def published(exp: Experiment) -> dict:
    """The paper setting's schedules in the paper's own precision ({} where none)."""
    setting = exp.paper
    return dict(setting.published()[1]) if setting is not None and setting.published else {}


def paper_schedules(exp: Experiment, dtype) -> dict:
    """Every schedule of the experiment in `dtype`, then those of `published`."""
    return {**dict(exp.schedules(dtype)), **published(exp)}


def sim_setting(
    exp: Experiment, topo: Topology, scale: str, world_size: int, max_elements: int
) -> tuple[int, list[dict], object]:
    """(world size, points, dtype) to predict `exp` on `topo` alone (backend=sim): the local
    topology at the experiment's own sweep and `world_size`; a GPU topology in the paper's
    setting of the experiment, scaled to it (`PaperSetting.world_on`)."""
    if topo.name == "local" or exp.paper is None:
        return world_size, exp.points(scale, max_elements), f32
    world = exp.paper.world_on(topo)
    if world > topo.devices:
        raise ValueError(
            f"{exp.name} needs {world} devices; topology {topo.name} has "
            f"{topo.devices} (set topology.nodes)"
        )
    return world, exp.paper.points[scale], exp.paper.dtype


def dividing(programs: dict, points: list[dict], world: int, show=None) -> list[dict]:
    """The points every program lowers at on `world` ranks (a size that does not divide among
    them, e.g. 2^10 elements on 131,072 GPUs, has no step there: skipped, and said so)."""

    def lowers(b):
        try:
            for p in programs.values():
                lower(p, b, world)
        except ShapeError:  # a size that does not divide; any other error is the run's
            return False
        return True

    kept = [b for b in points if lowers(b)]
    if show and len(kept) < len(points):
        skipped = [", ".join(f"{k}={v}" for k, v in b.items()) for b in points if b not in kept]
        show(
            f"  skipped {len(skipped)} points that do not divide among {world} ranks: "
            f"{'; '.join(skipped)}"
        )
    return kept


def predictions(exp: Experiment, settings: PredictSettings, show=None) -> list[dict]:
    """The predicted rows of one run (see the module doc and experiments.PredictSettings)."""
    topo, chosen = settings.topology, settings.schedules
    if settings.backend == "sim":
        world, pts, dtype = sim_setting(
            exp, topo, settings.scale, settings.world_size, settings.max_elements
        )
        if settings.sizes:
            pts = [dict(b) for b in settings.sizes]
        every = paper_schedules(exp, dtype) if topo.nccl is not None else dict(exp.schedules(dtype))
        progs = {
            n: p for n, p in every.items() if chosen is None or n in chosen or n in published(exp)
        }
        pts = dividing(progs, pts, world, show)
        rows = predict(exp, topo, pts, world, dtype, schedules=progs, show=show)
        if not settings.paper:
            return rows
        own = {name for name, _ in exp.paper.topologies} if exp.paper else set()
        paper = (
            []
            if topo.name in own or topo.name == "local" and settings.sizes
            else paper_rows(exp, settings.scale, schedules=chosen, show=show)
        )
        return rows + paper + paper_result_rows(exp.name) + authors_rows(exp.name)
    local = topo if topo.name == "local" else load_topology("local")
    measured = measured_baseline_compute(settings.measured)
    reference = measured_memory_reference(exp, settings.measured)
    comm_reference = measured_comm_reference(settings.measured)
    on_gloo = measured_baseline_compute(settings.measured, GLOO_BASELINE)
    gloo = settings.gloo_topology if on_gloo else None  # comm=shm measured it: predict it too
    rows = []
    # the local topology models this machine's CPU ranks: GPU measurements (backend=cuda) are
    # not predicted on it (no calibrated topology of this GPU); the paper setting still is
    here = local_points(exp, settings.measured) if settings.backend == "cpu" else []
    for world, b in here:
        compute = {s: ms for (w, s), ms in measured.items() if w == world}
        shape = exp.size_and_shape(b)[1]
        scale = (
            memory_scale(exp, local, b, reference.get((world, shape)))
            if settings.memory_scale
            else None
        )
        talk = comm_scale(local, world, comm_reference.get((world, shape)))
        point = predict(
            exp,
            local.with_memory_scale(scale or 1.0).with_comm_scale(talk or 1.0),
            [b],
            world,
            schedules=chosen and dict(chosen),
            baseline_compute_ms=compute,
            show=show,
            gloo=gloo and gloo.with_memory_scale(scale or 1.0),
            gloo_compute_ms={s: ms for (w, s), ms in on_gloo.items() if w == world},
        )
        note = " ".join(f"{what} x{x:.3f}" for what, x in (("memory", scale), ("comm", talk)) if x)
        for r in point if note else ():
            r["note"] = note
        rows += point
    if not settings.paper:
        return rows
    return (
        rows
        + paper_rows(exp, settings.scale, schedules=chosen, show=show)
        + paper_result_rows(exp.name)
        + authors_rows(exp.name)
    )
