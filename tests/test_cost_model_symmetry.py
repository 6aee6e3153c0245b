"""The symmetric DES (one simulated rank per class, `fold=True`) against the full DES at 1,024 and
4,096 GPUs, and its cost at 65,536 GPUs (`python -m benchmarks.simulator` prints the same figures).
Wall-clock bounds are generous: CI machines are shared."""

import time

import pytest

from benchmarks.simulator import at_scale, named_plans, peak_rss_gb, symmetric_vs_full
from cost_model.topology import load_topology
from cost_model.workload import simulate


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [128, 512])
def test_symmetric_des_within_one_percent_of_the_full_des(nodes):
    rows = symmetric_vs_full(nodes, elements=1 << 20)
    assert {r[0] for r in rows} >= {"AR-C", "fuse(RS-C-AG)+as_slice"}
    for name, sym_ms, full_ms, rel, _, _ in rows:
        assert sym_ms > 0 and abs(rel) <= 0.01, (name, sym_ms, full_ms)


def test_symmetric_des_simulates_one_rank_per_class():
    topo = load_topology("dgx_h100", nodes=128)
    ((_, plan),) = named_plans(topo.devices, [1 << 20], ["fuse(RS-C-AG)+as_slice"])
    sym, full = simulate(plan, topo, fold=True), simulate(plan, topo, fold=False)
    assert set(sym.trace["rank"]) == set(range(topo.devices_per_node))
    assert len(full.trace) == 128 * len(sym.trace)


def test_fused_adam_on_65536_gpus_in_seconds_and_little_memory():
    start = time.perf_counter()
    rows = at_scale(nodes=8192, elements=1 << 28)
    assert all(folded and ms > 0 for _, _, ms, folded in rows)
    assert max(secs for _, secs, _, _ in rows) < 10.0
    assert time.perf_counter() - start < 60.0
    assert peak_rss_gb() < 4.0
