"""Speed benchmarks of the cost model (benchmarks, not timed tests; CI runs them small).

    python -m benchmarks.simulator              # the issue's sizes
    python -m benchmarks.simulator --nodes 2 --elements 1048576 --evaluations 100

- DES: a `fuse(RS-C-AG)` Adam step (the paper's schedule, 4 chunks) on `--nodes` DGX-2 nodes
  (default 16: 256 GPUs) at `--elements` (default 2^28), simulated at chunk granularity, folded
  by node (exact: every node does the same). Target: under 10 s.
- Closed form: `--evaluations` (default 1000) closed-form evaluations of the same schedules (all
  five, in turn) at sizes 2^10 .. 2^30. Target: under 1 s.
- Symmetric DES at scale (`--scale-nodes`, default 8192 dgx_h100 nodes: 65,536 GPUs): every
  adam_fusion schedule at `--elements`, folded (one simulated rank per class), wall seconds per
  schedule and the process's peak resident memory. Target: under 10 s a schedule, under 4 GB.
- At the largest clusters' scale (`--largest-nodes`, default 16,384 dgx_h100_fattree nodes:
  131,072 GPUs on a rail-optimized three-tier fat tree, 7:1 above its 512-node zones): every
  adam_fusion schedule, wall seconds each and NCCL's picks. Target: under 1 s a schedule.
- Symmetric against full DES (`--check-nodes`, default 128 and 512 dgx_h100 nodes: 1,024 and
  4,096 GPUs): every schedule simulated both ways, the relative difference. Target: within 1%.
"""

from __future__ import annotations

import argparse
import resource
import time

import experiments
from codegen.lower import lower
from cost_model.closed_form import plan_us
from cost_model.topology import load_topology
from cost_model.workload import simulate


def named_plans(world: int, sizes, schedule_names=None) -> list[tuple[str, object]]:
    """[(schedule, Plan)] of adam_fusion's schedules at each size (a benchmark's workload)."""
    progs = experiments.get("adam_fusion").schedules()
    names = schedule_names or list(progs)
    return [(n, lower(progs[n], {"N": s}, world)) for s in sizes for n in names]


def plans(world: int, sizes, schedule_names=None):
    return [p for _, p in named_plans(world, sizes, schedule_names)]


def des_seconds(nodes: int = 16, elements: int = 1 << 28) -> tuple[float, float, int]:
    """(wall seconds, simulated ms, trace rows) of the fused Adam step."""
    topo = load_topology("dgx2", nodes=nodes)
    (plan,) = plans(topo.devices, [elements], ["fuse(RS-C-AG)"])
    start = time.perf_counter()
    r = simulate(plan, topo)
    return time.perf_counter() - start, r.time_ms, len(r.trace)


def closed_form_seconds(nodes: int = 16, evaluations: int = 1000) -> tuple[float, int]:
    """(wall seconds, evaluations) of closed-form schedule times (plans lowered beforehand)."""
    topo = load_topology("dgx2", nodes=nodes)
    ps = plans(topo.devices, [1 << k for k in range(10, 31, 4)])
    start = time.perf_counter()
    for i in range(evaluations):
        plan_us(ps[i % len(ps)], topo)
    return time.perf_counter() - start, evaluations


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (Linux: ru_maxrss in KiB), in GB (1e9 B)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def at_scale(nodes: int = 8192, elements: int = 1 << 28, topology: str = "dgx_h100"):
    """[(schedule, wall seconds, predicted ms, folded)] of every adam_fusion schedule, folded."""
    topo = load_topology(topology, nodes=nodes)
    out = []
    for name, plan in named_plans(topo.devices, [elements]):
        start = time.perf_counter()
        r = simulate(plan, topo, fold=True)
        out.append((name, time.perf_counter() - start, r.time_ms, r.folded))
    return out


def symmetric_vs_full(nodes: int, elements: int = 1 << 24, topology: str = "dgx_h100"):
    """[(schedule, symmetric ms, full ms, relative difference, symmetric s, full s)]."""
    topo = load_topology(topology, nodes=nodes)
    out = []
    for name, plan in named_plans(topo.devices, [elements]):
        t0 = time.perf_counter()
        sym = simulate(plan, topo, fold=True)
        t1 = time.perf_counter()
        full = simulate(plan, topo, fold=False)
        t2 = time.perf_counter()
        assert sym.folded and not full.folded
        out.append(
            (name, sym.time_ms, full.time_ms, sym.time_us / full.time_us - 1.0, t1 - t0, t2 - t1)
        )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--elements", type=int, default=1 << 28)
    ap.add_argument("--evaluations", type=int, default=1000)
    ap.add_argument("--scale-nodes", type=int, default=8192)
    ap.add_argument("--check-nodes", type=int, nargs="*", default=[128, 512])
    ap.add_argument("--largest-nodes", type=int, default=16384)
    a = ap.parse_args(argv)
    secs, ms, rows = des_seconds(a.nodes, a.elements)
    print(
        f"DES: fuse(RS-C-AG) Adam, {a.elements} elements, {a.nodes * 16} GPUs (dgx2): "
        f"{secs:.2f} s wall for {rows} tasks; predicted step {ms:.3f} ms (target < 10 s)"
    )
    secs, n = closed_form_seconds(a.nodes, a.evaluations)
    print(f"closed form: {n} schedule evaluations in {secs:.3f} s (target < 1 s)")
    for nodes in a.check_nodes:
        for name, sym, full, rel, ts, tf in symmetric_vs_full(nodes):
            print(
                f"symmetric vs full DES, {nodes * 8} GPUs (dgx_h100), 2^24, {name}: "
                f"{sym:.4f} vs {full:.4f} ms ({rel:+.2e}; {ts:.2f} s vs {tf:.2f} s wall; "
                f"target within 1%)"
            )
    for name, secs, ms, folded in at_scale(a.scale_nodes, a.elements):
        print(
            f"symmetric DES, {a.scale_nodes * 8} GPUs (dgx_h100), {a.elements} elements, "
            f"{name}: {secs:.2f} s wall, predicted {ms:.3f} ms, peak memory "
            f"{peak_rss_gb():.2f} GB (targets < 10 s, < 4 GB)"
        )
    for name, secs, ms, _ in at_scale(a.largest_nodes, a.elements, "dgx_h100_fattree"):
        print(
            f"{a.largest_nodes * 8} GPUs (dgx_h100_fattree), {a.elements} elements, {name}: "
            f"{secs:.2f} s wall, predicted {ms:.3f} ms (target < 1 s)"
        )


if __name__ == "__main__":
    main()
