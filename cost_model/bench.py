"""Speed benchmarks of the cost model (benchmarks, not timed tests; CI runs them small).

    python -m cost_model.bench              # the issue's sizes
    python -m cost_model.bench --nodes 2 --elements 1048576 --evaluations 100

- DES: a `fuse(RS-C-AG)` Adam step (the paper's schedule, 4 chunks) on `--nodes` DGX-2 nodes
  (default 16: 256 GPUs) at `--elements` (default 2^28), simulated at chunk granularity, folded
  by node (exact: every node does the same). Target: under 10 s.
- Closed form: `--evaluations` (default 1000) closed-form evaluations of the same schedules (all
  five, in turn) at sizes 2^10 .. 2^30. Target: under 1 s.
"""
from __future__ import annotations

import argparse
import time

from .closed_form import plan_us
from .topology import load_topology
from .workload import simulate


def plans(world: int, sizes, schedule_names=None):
    from codegen.lower import lower
    from experiments import adam_fusion

    progs = adam_fusion.schedules()
    names = schedule_names or list(progs)
    return [lower(progs[n], {"N": s}, world) for s in sizes for n in names]


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--elements", type=int, default=1 << 28)
    ap.add_argument("--evaluations", type=int, default=1000)
    a = ap.parse_args(argv)
    secs, ms, rows = des_seconds(a.nodes, a.elements)
    print(f"DES: fuse(RS-C-AG) Adam, {a.elements} elements, {a.nodes * 16} GPUs (dgx2): "
          f"{secs:.2f} s wall for {rows} tasks; predicted step {ms:.3f} ms (target < 10 s)")
    secs, n = closed_form_seconds(a.nodes, a.evaluations)
    print(f"closed form: {n} schedule evaluations in {secs:.3f} s (target < 1 s)")


if __name__ == "__main__":
    main()
