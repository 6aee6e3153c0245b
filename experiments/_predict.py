"""Predicted rows: every schedule of an experiment simulated by the cost model on a topology.

`predict(exp, topo, points, world_size, dtype)` lowers each schedule (and the library baseline) at
each point (size bindings) and simulates the Plan (`cost_model.workload.simulate`), returning rows
of the results table with `source=predicted`, `backend=sim`, `topology=<its name>` and `speedup`
over the predicted baseline at the same point, the time split of the slowest rank (`compute_ms`,
`comm_ms`: communication exposed, `overlapped_ms`: communication hidden behind compute) and the
algorithm and protocol of each collective (`algo`, `proto`: `;`-joined in step order,
`cost_model.workload.choices`). `predictions` also returns the paper's published results for
the experiment (`paper_result_rows`: source `paper`, from cost_model/data/paper_results.csv). The baseline has no Plan of its own: it is
predicted as the library runs it, on the unscheduled program's Plan (AR-C, MM-AR-C, AR-C-P2P:
the library's all-reduce with the topology's algorithm, then the computation). Where the
experiment's baseline calls a library routine for its computation (`LIBRARY_STEP`: torch's fused
Adam, the torch LAMB of `_dp_measure`, the Megatron tail's torch ops of `_mp_measure`) and the
topology's device has that routine's measured
time (`Device.library_steps_us`, from `experiment=calibrate`), the Plan's computation takes that
time (on the gradient's bytes) instead of the generated kernels'; elsewhere it equals the
unscheduled schedule's prediction.

The paper's settings (`PAPER`): data parallel on 16 DGX-2 (256 GPUs) at the paper's sizes 2^10 ..
2^30 (every second power at default scale, 2^20 alone at smoke); model parallel on one DGX-2, 16-way, B in {8, 16},
S=1024, H=3072, K in {H, 4H}, f16; pipeline parallel: GPT-3 175B (hidden 12288, seq 2048, micro-
batch 1), tensor 8 x pipeline 16, the boundary between two stages (16 GPUs), f16, on DGX-2, DGX
A100 and DGX H100 nodes. `local_points(rows)` reads the measured points back from measured rows.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

from codegen.lower import lower
from cost_model.topology import Topology, load_topology
from cost_model.validation import paper_results
from cost_model.workload import choices, simulate
from dsl import f16, f32


@dataclass(frozen=True)
class Setting:
    topologies: tuple[tuple[str, Optional[int]], ...]  # (topology, nodes)
    world_size: int
    dtype: object
    points: dict  # scale -> list of bindings


_DP_SIZES = {"smoke": [1 << 20], "default": [1 << k for k in range(10, 31, 2)],
             "paper": [1 << k for k in range(10, 31)]}
_MP = [{"B": B, "S": 1024, "H": 3072, "K": k * 3072} for B in (8, 16) for k in (1, 4)]
_PP = [{"B": 1, "S": 2048, "H": 12288}]
PAPER = {
    "adam_fusion": Setting((("dgx2", 16),), 256, f32,
                           {s: [{"N": n} for n in v] for s, v in _DP_SIZES.items()}),
    "lamb_fusion": Setting((("dgx2", 16),), 256, f32,
                           {s: [{"N": n} for n in v] for s, v in _DP_SIZES.items()}),
    "model_parallel": Setting((("dgx2", 1),), 16, f16,
                              {"smoke": _MP[:1], "default": _MP, "paper": _MP}),
    "pipeline_parallel": Setting((("dgx2", 1), ("dgx_a100", 2), ("dgx_h100", 2)), 16, f16,
                                 {"smoke": _PP, "default": _PP, "paper": _PP}),
}


def size_and_shape(bindings: dict) -> tuple[int, str]:
    """The principal tensor's elements and the shape column, as the measured rows write them."""
    if "N" in bindings:
        return bindings["N"], f"[{bindings['N']}]"
    S, B, H = bindings["S"], bindings["B"], bindings["H"]
    shape = f"S={S},B={B},H={H}" + (f",K={bindings['K']}" if "K" in bindings else "")
    return S * B * H, shape


def parse_shape(size: int, shape: str) -> dict:
    """Bindings back from a row's size and shape."""
    if "=" not in str(shape):
        return {"N": int(size)}
    return {k: int(v) for k, v in (part.split("=") for part in str(shape).split(","))}


def local_points(rows) -> list[tuple[int, dict]]:
    """(world size, bindings) of every measured point, in the order measured."""
    seen: dict = {}
    for r in rows:
        if r.get("source", "measured") == "measured":
            key = (int(r["world_size"]), str(r["shape"]))
            seen.setdefault(key, (int(r["world_size"]), parse_shape(r["size"], r["shape"])))
    return list(seen.values())


def _schedules(exp: ModuleType, dtype) -> dict:
    try:
        return dict(exp.schedules(dtype))
    except TypeError:  # a module whose schedules take no dtype (data parallel: f32)
        return dict(exp.schedules())


def _program(exp: ModuleType, dtype):
    try:
        return exp.program(dtype)
    except TypeError:
        return exp.program()


# experiment -> (the library routine its baseline calls, the size symbols whose product is the
# routine's element count)
LIBRARY_STEP = {"adam_fusion": ("adam", ("N",)), "lamb_fusion": ("lamb", ("N",)),
                "model_parallel": ("bias_dropout_add", ("S", "B", "H")),
                "pipeline_parallel": ("bias_dropout_add", ("S", "B", "H"))}


def library_compute_us(exp: ModuleType, plan, topo: Topology, bindings: dict,
                       dtype=None) -> dict:
    """{step id: us} for the baseline's Plan: its library routine's measured time on its
    elements (the gradient's N, or the layer output's S * B * H, of dtype) given to the first
    Compute step, 0 to the others and to the collectives' staging copies (the library reduces
    in place); {} where the experiment has no library routine or the topology no time for it."""
    from codegen.plan import Collective, Compute

    routine, symbols = LIBRARY_STEP.get(exp.NAME, (None, ()))
    if routine is None or any(k not in bindings for k in symbols):
        return {}
    elements = math.prod(bindings[k] for k in symbols)
    us = topo.device.library_step_us(routine, elements * (dtype or f32).numpy.itemsize)
    steps = [s.id for s in plan.steps if isinstance(s, Compute)]
    if us is None or not steps:
        return {}
    in_place = {s.id: 0.0 for s in plan.steps if isinstance(s, Collective)}
    return {**in_place, **{sid: (us if i == 0 else 0.0) for i, sid in enumerate(steps)}}


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
    return [{"experiment": name, "schedule": r["schedule"], "source": "paper", "backend": "",
             "topology": "dgx2", "world_size": int(r["world_size"]), "size": 0, "shape": "",
             "dtype": "", "speedup": r["speedup_min"], "speedup_max": r["speedup_max"],
             "note": f"{r['result']} (over {r['baseline']}; {r['setup']})",
             "reference": f"{r['where']}: {r['source']}", "caveat": r["caveat"]}
            for r in paper_results() if r["experiment"] == name]


def predict(exp: ModuleType, topo: Topology, points: list[dict], world_size: int, dtype=None,
            schedules: Optional[dict] = None, show=None) -> list[dict]:
    """Rows for every point x (baseline, schedules) on `topo` at `world_size` ranks."""
    dtype = dtype or f32
    progs = schedules if schedules is not None else _schedules(exp, dtype)
    base = _program(exp, dtype)
    rows = []
    for b in points:
        size, shape = size_and_shape(b)
        t0 = time.perf_counter()
        base_plan = lower(base, b, world_size)
        results = {"baseline": (base_plan, simulate(base_plan, topo, compute_us=library_compute_us(
            exp, base_plan, topo, b, dtype)))}
        for name, p in progs.items():
            plan = lower(p, b, world_size)
            results[name] = (plan, simulate(plan, topo))
        base_ms = results["baseline"][1].time_ms
        for name, (plan, r) in results.items():
            compute, comm, hidden = _split(r)
            picked = choices(plan, topo)
            rows.append({"experiment": exp.NAME, "schedule": name, "source": "predicted",
                         "backend": "sim", "topology": topo.name, "world_size": world_size,
                         "size": size, "shape": shape, "dtype": dtype.name,
                         "time_ms": round(r.time_ms, 6), "speedup": round(base_ms / r.time_ms, 4),
                         "compute_ms": round(compute, 6), "comm_ms": round(comm, 6),
                         "overlapped_ms": round(hidden, 6),
                         "algo": ";".join(a for _, a, _ in picked),
                         "proto": ";".join(p for _, _, p in picked)})
        if show:
            best = max((n for n in results if n != "baseline"),
                       key=lambda n: base_ms / results[n][1].time_ms)
            show(f"  predicted {topo.name} P={world_size} {shape:24s} baseline {base_ms:10.3f} ms"
                 f"  best {best} x{base_ms / results[best][1].time_ms:.2f}"
                 f"  ({time.perf_counter() - t0:.1f} s)")
    return rows


def paper_topologies(name: str) -> list[Topology]:
    return [load_topology(t, nodes=n) for t, n in PAPER[name].topologies] if name in PAPER else []


def paper_rows(exp: ModuleType, scale: str, show=None) -> list[dict]:
    """The paper's setting of this experiment, predicted (no rows for an experiment without)."""
    setting = PAPER.get(exp.NAME)
    if setting is None:
        return []
    rows = []
    for topo in paper_topologies(exp.NAME):
        rows += predict(exp, topo, setting.points[scale], setting.world_size, setting.dtype,
                        show=show)
    return rows


def sim_setting(exp: ModuleType, topo: Topology, scale: str, world_size: int,
                max_elements: int) -> tuple[int, list[dict], object]:
    """(world size, points, dtype) to predict `exp` on `topo` alone (backend=sim): the local
    topology at the experiment's own sweep and `world_size`; a GPU topology in the paper's
    setting of the experiment, scaled to it (data parallel: every device; model parallel: one
    node; pipeline parallel: two stages of min(8, devices per node))."""
    if topo.name == "local":
        pts = exp.points(scale, max_elements) if hasattr(exp, "points") else \
            [{"N": n} for n in exp.sizes(scale, max_elements)]
        return world_size, pts, f32
    setting = PAPER[exp.NAME]
    if exp.NAME in ("adam_fusion", "lamb_fusion"):
        world = topo.devices
    elif exp.NAME == "model_parallel":
        world = topo.devices_per_node
    else:
        world = 2 * min(8, topo.devices_per_node)
    if world > topo.devices:
        raise ValueError(f"{exp.NAME} needs {world} devices; topology {topo.name} has "
                         f"{topo.devices} (set topology.nodes)")
    return world, setting.points[scale], setting.dtype


def predictions(exp: ModuleType, settings, show=None) -> list[dict]:
    """The predicted rows of one run (see the module doc and experiments.PredictSettings)."""
    topo = settings.topology
    if settings.backend == "sim":
        world, pts, dtype = sim_setting(exp, topo, settings.scale, settings.world_size,
                                        settings.max_elements)
        if settings.sizes:
            pts = [dict(b) for b in settings.sizes]
        return predict(exp, topo, pts, world, dtype, show=show) + paper_result_rows(exp.NAME)
    local = topo if topo.name == "local" else load_topology("local")
    rows = []
    for world, b in local_points(settings.measured):
        rows += predict(exp, local, [b], world, show=show)
    return rows + paper_rows(exp, settings.scale, show=show) + paper_result_rows(exp.NAME)
