"""The fabric between nodes (cost_model.fabric): what NCCL's calls get of their NICs through a
rail-optimized fat tree's tiers, and a data-parallel step on 131,072 GPUs predicted with it."""

import dataclasses
import time

import pytest

from cost_model import fabric, nccl
from cost_model.topology import FabricTier, TopologyError, load_topology


def on_tiers(*tiers, nodes=16384):
    topo = load_topology("dgx_h100", nodes=nodes)
    return dataclasses.replace(
        topo,
        inter=dataclasses.replace(
            topo.inter, tiers=[FabricTier(nodes=n, oversubscription=o) for n, o in tiers]
        ),
    )


def test_rings_and_trees_keep_their_nics_on_an_oversubscribed_fat_tree():
    topo = on_tiers((32, 1.0), (512, 7.0))
    assert fabric.share(topo, "ring", 16384) == fabric.share(topo, "tree", 16384) == 1.0
    loads = fabric.tiers(topo, "tree", 16384)
    assert [(t.nodes, t.crossing, t.capacity) for t in loads] == [
        (32, 2.0, 32.0),
        (512, 2.0, 512 / 7),
    ]


def test_an_alltoall_across_zones_gets_the_oversubscribed_share():
    topo = on_tiers((32, 1.0), (512, 7.0))
    assert fabric.share(topo, "p2p", 16384) == pytest.approx(1 / 7 * 16384 / (16384 - 512))
    assert fabric.share(topo, "p2p", 512) == 1.0  # inside one zone: non-blocking
    slow = nccl.call("all_to_all", 1 << 30, range(16384 * 8), topo)
    fast = nccl.call("all_to_all", 1 << 30, range(16384 * 8), on_tiers((32, 1.0), (512, 1.0)))
    assert slow.time_us / fast.time_us == pytest.approx(7 * (16384 - 512) / 16384, rel=0.01)


def test_a_tier_oversubscribed_beyond_its_group_slows_a_ring():
    topo = on_tiers((4, 8.0), nodes=16)
    assert fabric.share(topo, "ring", 16) == 0.5
    ring = dataclasses.replace(topo, algo="ring")
    free = dataclasses.replace(on_tiers((4, 1.0), nodes=16), algo="ring")
    slowed = nccl.call("all_reduce", 1 << 30, range(128), ring).time_us
    assert slowed > 1.5 * nccl.call("all_reduce", 1 << 30, range(128), free).time_us


def test_tiers_grow_from_the_leaves_up():
    data = load_topology("dgx_h100_fattree").to_dict()
    data["inter"]["tiers"] = [{"nodes": 512}, {"nodes": 32}]
    from cost_model.topology import Topology

    with pytest.raises(TopologyError, match="must grow from the leaves up"):
        Topology.from_dict(data)


def test_a_data_parallel_step_on_131072_gpus_in_under_a_second_a_schedule():
    """Every adam_fusion schedule on 16,384 DGX H100 nodes of the three-tier fat tree: folded
    (one simulated rank per class), under a second each (a generous bound: shared CI machines),
    with NCCL's picks at that scale."""
    from benchmarks.simulator import at_scale

    rows = at_scale(nodes=16384, elements=1 << 28, topology="dgx_h100_fattree")
    assert len(rows) == 5 and all(folded and ms > 0 for _, _, ms, folded in rows)
    assert max(secs for _, secs, _, _ in rows) < 1.0
    topo = load_topology("dgx_h100_fattree", nodes=16384)
    assert nccl.call("all_reduce", 1 << 30, range(131072), topo).algo == "tree"
    assert nccl.call("reduce_scatter", 1 << 30, range(131072), topo).algo == "ring"
    start = time.perf_counter()
    assert "7:1" in fabric.describe(topo, 16384) and time.perf_counter() - start < 1.0
