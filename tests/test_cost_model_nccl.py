"""NCCL's tuner model (cost_model/nccl.py): every algorithm and protocol against times computed by
hand from NCCL 2.20.3's formulas, the tuner's picks, forced choices, the published H100 figures,
and the DES agreeing with the closed form where nothing contends (pure)."""

from __future__ import annotations

import dataclasses

import pytest

import experiments
from cost_model import nccl
from cost_model.closed_collectives import choose, collective_us
from cost_model.collectives import CollSpec
from cost_model.topology import Nccl, Topology, TopologyError, load_topology
from cost_model.workload import simulate_collective

# 2 channels of 10 GB/s inside a node, 5 GB/s across; NVLS and CollNet on; no fill
SMALL = Nccl(
    arch="hopper",
    channels=2,
    bw_intra_gbps=10.0,
    bw_inter_gbps=5.0,
    nvls=True,
    nvls_channels=2,
    nvls_bw_gbps=10.0,
    collnet=True,
)
MB = 1e6  # bytes; log2(1e6 / 64) = 13.9: the tree correction's entry 13

# (kind, algo, proto, ranks, nodes, hand-computed us). Ring all_reduce, 4 ranks: nsteps 6, algbw
# = bus x 4/6; tree: bus x 0.92 (x 7/9 LL128, / 3.8 LL) x 1/2 x correction (LL .4, LL128 .6,
# Simple .5); NVLS all_reduce: bus x 15/16 x n/(n+1) (n GPUs a node), reduce_scatter /
# all_gather: bus x 15/16. 1 MB uses every channel of every protocol here (4 channels: 2 x 2).
HAND = [
    ("all_reduce", "ring", "LL", 4, 1, 6.6 + 6 * 0.6 + MB / (1e3 * 5 * 4 / 6)),  # 310.2
    ("all_reduce", "ring", "LL128", 4, 1, 14.0 + 6 * 1.9 + MB / (1e3 * 18.4 * 4 / 6)),
    ("all_reduce", "ring", "Simple", 4, 1, 8.4 + 6 * 3.4 + MB / (1e3 * 20 * 4 / 6)),  # 103.8
    ("all_reduce", "tree", "LL", 4, 1, 6.8 + 2 * 3 * 0.6 + MB / (1e3 * 18.4 / 3.8 * 0.5 * 0.4)),
    (
        "all_reduce",
        "tree",
        "LL128",
        4,
        1,
        14.0 + 2 * 3 * 1.25 + MB / (1e3 * 18.4 * 7 / 9 * 0.5 * 0.6),
    ),
    ("all_reduce", "tree", "Simple", 4, 1, 2 * 3 * 28.0 + MB / (1e3 * 18.4 * 0.5 * 0.5)),
    ("all_reduce", "nvls", "Simple", 4, 1, 23.0 + MB / (1e3 * 20 * 15 / 16 * 4 / 5)),  # 89.7
    # 2 nodes: NVLS tree at min(10, the NICs' 5 per channel); CollNet at the node's bandwidth
    (
        "all_reduce",
        "nvls_tree",
        "Simple",
        4,
        2,
        23.0 + 2 * 14.0 + MB / (1e3 * 10 * 15 / 16 * 2 / 3),
    ),
    (
        "all_reduce",
        "collnet_direct",
        "Simple",
        4,
        2,
        2 * (3.7 + 0.4) + 31.0 + MB / (1e3 * 20 * 0.85 * 0.5),
    ),
    ("all_reduce", "collnet_chain", "Simple", 4, 2, 2 * 2.8 + 30.0 + MB / (1e3 * 20 * 0.5)),
    # a ring across 2 nodes: 4 of its 6 steps cross the network; Simple's plateau x 1.4
    (
        "all_reduce",
        "ring",
        "Simple",
        4,
        2,
        (8.4 + 2 * 3.4 + 4 * 14.0) * 1.4 + MB / (1e3 * 10 * 4 / 6),
    ),
    ("reduce_scatter", "ring", "Simple", 4, 1, 8.4 + 3 * 3.4 + MB / (1e3 * 20 * 4 / 3)),
    ("all_gather", "ring", "LL128", 4, 1, 14.0 + 3 * 1.9 + MB / (1e3 * 18.4 * 4 / 3)),
    ("all_gather", "nvls", "Simple", 4, 1, 23.0 + MB / (1e3 * 20 * 15 / 16)),
    ("broadcast", "ring", "Simple", 4, 1, 8.4 + 3.4 + MB / (1e3 * 20 * 4 / 4)),
    ("reduce", "ring", "LL", 4, 1, 6.6 + 0.6 + MB / (1e3 * 20 / 4)),
]


@pytest.mark.parametrize(
    "kind,algo,proto,ranks,nodes,expect",
    HAND,
    ids=[f"{k}-{a}-{p}-{n}n" for k, a, p, _, n, _ in HAND],
)
def test_each_algorithm_and_protocol_against_hand_computed_times(
    kind, algo, proto, ranks, nodes, expect
):
    got = nccl.time_us(kind, MB, algo, proto, ranks, nodes, SMALL)
    assert (got.algo, got.proto) == (algo, proto)
    assert got.time_us == pytest.approx(expect, rel=1e-9)


def test_the_fill_term_is_the_pipelines_optimal_chunking():
    # NVLS, 4 GPUs: 2 stages (up to the switch and back); wire MB / (20 x 15/16 x 4/5 GB/s);
    # fill = 2 sqrt(1 us x 2 x wire). LL, LL128 and tree stay NCCL's estimate; slices: Simple only
    filled = dataclasses.replace(SMALL, fill_us=1.0, slice_us=5.0)
    wire = MB / (1e3 * 20 * 15 / 16 * 4 / 5)
    got = nccl.time_us("all_reduce", MB, "nvls", "Simple", 4, 1, filled).time_us
    assert got == pytest.approx(23.0 + wire + 2 * (2 * wire) ** 0.5)
    for algo, proto in [("ring", "LL128"), ("ring", "LL"), ("tree", "Simple")]:
        assert (
            nccl.time_us("all_reduce", MB, algo, proto, 4, 1, filled).time_us
            == nccl.time_us("all_reduce", MB, algo, proto, 4, 1, SMALL).time_us
        )


def test_the_simple_ring_pays_per_slice_of_nccls_chunks():
    # 4 ranks, 4 channels: a loop is 4 x 4 x 2 MiB = 32 MiB; each loop 6 steps x 2 slices
    sliced = dataclasses.replace(SMALL, fill_us=1.0, slice_us=5.0)  # fill: not the Simple ring
    base = 8.4 + 6 * 3.4
    for nbytes, loops in [(MB, 1), (32 << 20, 1), ((32 << 20) + 1, 2), (100 << 20, 4)]:
        got = nccl.time_us("all_reduce", nbytes, "ring", "Simple", 4, 1, sliced).time_us
        assert got == pytest.approx(base + nbytes / (1e3 * 20 * 4 / 6) + loops * 12 * 5.0)
    # reduce_scatter: 3 steps x 2 slices a loop; broadcast: 512 KiB chunks chained over 3 hops
    got = nccl.time_us("reduce_scatter", MB, "ring", "Simple", 4, 1, sliced).time_us
    assert got == pytest.approx(8.4 + 3 * 3.4 + MB / (1e3 * 20 * 4 / 3) + 6 * 5.0)
    got = nccl.time_us("broadcast", 4 << 20, "ring", "Simple", 4, 1, sliced).time_us
    assert got == pytest.approx(8.4 + 3.4 + (4 << 20) / (1e3 * 20) + (2 + 2) * 5.0)


def test_a_small_call_runs_on_fewer_channels():
    """enqueue.cc: a call drops channels while nBytes < channels x threads x threshold."""
    # Simple: 64 B a thread x 512 threads = 32 KiB a channel; 4 channels from 128 KiB up
    assert nccl.used("all_reduce", "ring", "Simple", 1 << 17, 4, SMALL) == (4, 1.0, 1 << 17)
    assert nccl.used("all_reduce", "ring", "Simple", 65536, 4, SMALL) == (2, 0.5, 65536)
    assert nccl.used("all_reduce", "ring", "Simple", 65535, 4, SMALL) == (1, 0.25, 65535)
    # then threads halve down to 64 (nt % 128 == 0 no longer), below which a call takes the
    # time of 64 threads x 64 B: the small-call floor
    assert nccl.used("all_reduce", "ring", "Simple", 8192, 4, SMALL) == (1, 0.25 * 128 / 512, 8192)
    assert nccl.used("all_reduce", "ring", "Simple", 1024, 4, SMALL) == (1, 0.25 * 64 / 512, 4096)
    # ring LL: 8 B a thread x nranks; NVLS keeps its channels
    assert nccl.used("all_reduce", "ring", "LL", 3 * 16384, 4, SMALL)[0] == 3
    assert nccl.used("all_reduce", "nvls", "Simple", 1024, 4, SMALL) == (2, 1.0, 1024)
    slow = nccl.time_us("all_reduce", 65536, "ring", "Simple", 4, 1, SMALL).time_us
    assert slow == pytest.approx(8.4 + 6 * 3.4 + 65536 / (1e3 * 20 * 4 / 6 * 0.5))
    tiny = [
        nccl.time_us("all_reduce", b, "ring", "Simple", 4, 1, SMALL).time_us
        for b in (256, 1024, 4096)
    ]
    assert (
        tiny[0]
        == tiny[1]
        == tiny[2]
        == pytest.approx(8.4 + 6 * 3.4 + 4096 / (1e3 * 20 * 4 / 6 * 0.25 * 64 / 512))
    )


def test_nvls_bandwidth_follows_the_gpus_on_the_switch():
    """Each GPU's port carries the buffer up and 1/n of it back: algbw x n/(n+1), which is
    NCCL's 5/6 at 8 GPUs and the maintainers' ~370 GB/s busbw at 4 (NVIDIA/nccl issue 1455)."""
    nc = load_topology("dgx_h100").nccl
    bw = {n: nccl.bandwidth_gbps("all_reduce", "nvls", "Simple", n, 1, nc) for n in range(2, 9)}
    assert bw[8] == pytest.approx(16 * 20.6 * 5 / 6)
    assert bw[4] * 2 * 3 / 4 == pytest.approx(370, rel=0.03)
    assert all(bw[n] < bw[n + 1] for n in range(2, 8))
    # 3 GPUs: NVLS below the ring, so the tuner takes the ring
    assert nccl.pick("all_reduce", 1 << 33, 3, 1, nc).algo == "ring"


def test_p2p_goes_over_nvlink_inside_a_node_and_a_nic_rail_across():
    topo = load_topology("dgx_h100", nodes=2)
    nc = topo.nccl
    assert nccl.p2p_us(topo, 0, 1, MB) == pytest.approx(8.4 + 3.4 + MB / (1e3 * 360.0))
    per_rail = nc.channels * nc.bw_inter_gbps / topo.inter.nics
    assert nccl.p2p_us(topo, 0, 8, MB) == pytest.approx(8.4 + 14.0 + MB / (1e3 * per_rail))


def test_which_algorithms_nccl_enables():
    algos = lambda kind, nodes, nc=SMALL: {a for a, _ in nccl.enabled(kind, 4, nodes, nc)}  # noqa: E731
    assert algos("all_reduce", 1) == {"ring", "tree", "nvls"}
    assert algos("all_reduce", 2) == {
        "ring",
        "tree",
        "nvls_tree",
        "collnet_direct",
        "collnet_chain",
    }
    assert algos("reduce_scatter", 1) == {"ring", "nvls"}
    assert algos("broadcast", 2) == {"ring"}
    plain = dataclasses.replace(SMALL, nvls=False, collnet=False)
    assert algos("all_reduce", 2, plain) == {"ring", "tree"}
    assert {p for a, p in nccl.enabled("all_reduce", 4, 1, SMALL) if a == "nvls"} == {"Simple"}


# the tuner's pick at a small, a medium and a large size (8 GPUs, one node)
PICKS = [
    ("dgx_a100", 1 << 16, "ring", "LL"),
    ("dgx_a100", 1 << 24, "ring", "LL128"),
    ("dgx_a100", 1 << 30, "ring", "Simple"),
    ("dgx_h100", 1 << 12, "ring", "LL"),
    ("dgx_h100", 1 << 24, "nvls", "Simple"),
    ("dgx_h100", 1 << 30, "nvls", "Simple"),
]


@pytest.mark.parametrize("topo_name,nbytes,algo,proto", PICKS)
def test_the_tuner_picks_the_fastest(topo_name, nbytes, algo, proto):
    topo = load_topology(topo_name)
    got = nccl.call("all_reduce", nbytes, range(8), topo)
    assert got.label == f"{algo}/{proto}"
    # the least of NCCL's own estimates (lat + bytes / bw); the call then takes its time
    estimates = {
        (a, p): nccl.estimate("all_reduce", nbytes, a, p, 8, 1, topo.nccl)
        for a, p in nccl.enabled("all_reduce", 8, 1, topo.nccl)
    }
    us = {k: lat + nbytes / (1e3 * bw) for k, (lat, bw) in estimates.items()}
    assert us[(algo, proto)] == min(us.values())
    assert got.time_us == nccl.time_us("all_reduce", nbytes, algo, proto, 8, 1, topo.nccl).time_us
    assert choose(CollSpec("all_reduce", nbytes, tuple(range(8))), topo) == algo


def test_across_nodes_the_tuner_weighs_trees_against_rings():
    topo = load_topology("dgx2", nodes=16)
    small = nccl.call("all_reduce", 1 << 12, range(256), topo)
    large = nccl.call("all_reduce", 1 << 30, range(256), topo)
    assert small.algo == "tree" and large.algo == "ring"  # log2(16) hops against 2 x 16


def _busbw(topo, nbytes: int, ranks: int = 8) -> tuple[str, float]:
    spec = CollSpec("all_reduce", nbytes, tuple(range(ranks)))
    algo = choose(spec, topo)
    t = simulate_collective(spec, topo, algo).time_us
    return algo, nbytes / (t * 1e3) * 2 * (ranks - 1) / ranks


def test_h100_all_reduce_at_1_gib_nvls_and_forced_ring():
    """Must show: NVLS by default at >= 440 GB/s busbw; with ring forced within 10% of 370."""
    topo = load_topology("dgx_h100")
    algo, busbw = _busbw(topo, 1 << 30)
    assert algo == "nvls" and busbw >= 440
    algo, busbw = _busbw(dataclasses.replace(topo, algo="ring"), 1 << 30)
    assert algo == "ring" and busbw == pytest.approx(370, rel=0.10)


def test_a_forced_protocol_and_an_inapplicable_forced_algorithm():
    topo = load_topology("dgx_a100")
    assert (
        nccl.call("all_reduce", 1 << 30, range(8), dataclasses.replace(topo, proto="LL")).label
        == "ring/LL"
    )
    # no NVLS on an A100: NCCL falls back to its own choice
    assert (
        nccl.call("all_reduce", 1 << 30, range(8), dataclasses.replace(topo, algo="nvls")).label
        == "ring/Simple"
    )
    with pytest.raises(TopologyError, match="topology.algo='butterfly'"):
        Topology.from_dict({**_raw("dgx_a100"), "algo": "butterfly"})


def _raw(name):
    import yaml

    from cost_model.topology import CONF_TOPOLOGY_DIR

    return yaml.safe_load((CONF_TOPOLOGY_DIR / f"{name}.yaml").read_text())


DES_CASES = [
    ("dgx_h100", 1, "all_reduce", "nvls", 1),
    ("dgx_h100", 1, "reduce_scatter", "ring", 4),
    ("dgx_h100", 2, "all_reduce", "nvls_tree", 1),
    ("dgx2", 2, "all_reduce", "tree", 2),
    ("dgx_a100", 1, "all_gather", "ring", 8),
    ("dgx_b200", 1, "all_reduce", "nvls", 2),
    ("dgx1_v100", 1, "broadcast", "ring", 1),
]


@pytest.mark.parametrize("topo_name,nodes,kind,algo,chunks", DES_CASES)
def test_des_and_closed_form_agree_where_nothing_contends(topo_name, nodes, kind, algo, chunks):
    topo = load_topology(topo_name, nodes=nodes)
    spec = CollSpec(kind, 1 << 26, tuple(range(topo.devices)), chunks)
    r = simulate_collective(spec, topo, algo)
    assert r.time_us == pytest.approx(collective_us(spec, algo, topo), rel=1e-9)
    assert r.time_us == pytest.approx(
        chunks * nccl.call(kind, (1 << 26) / chunks, spec.group, topo, algo).time_us
    )
    assert r.trace.task.str.startswith(f"{algo}/").all()  # the trace names algorithm/protocol


def test_choices_name_each_collective_of_a_plan_as_the_des_runs_it():
    from codegen.lower import lower
    from cost_model.workload import choices, simulate

    adam_fusion = experiments.get("adam_fusion")

    topo = load_topology("dgx_h100")
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 1 << 24}, 8)
    picked = choices(plan, topo)
    assert [k for k, _, _ in picked if k != "all_reduce"] == ["reduce_scatter", "all_gather"]
    trace = simulate(plan, topo).trace
    labels = set(trace[trace.stream == "comm"].task.str.split(" ").str[0])
    assert {f"{a}/{p}" for _, a, p in picked} <= labels  # the calls the DES made
    ar = lower(adam_fusion.schedules()["AR-C"], {"N": 1 << 28}, 8)
    assert choices(ar, topo)[0] == ("all_reduce", "nvls", "Simple")


def test_predicted_rows_split_time_into_compute_hidden_and_exposed():
    from experiments.predict import _overlap_us, _union, predict

    adam_fusion = experiments.get("adam_fusion")

    assert _union([(3, 4), (0, 2), (1, 2.5)]) == [(0, 2.5), (3, 4)]
    assert _overlap_us([(0, 2.5), (3, 4)], [(2, 3.5)]) == pytest.approx(1.0)
    rows = predict(adam_fusion, load_topology("dgx_h100"), [{"N": 1 << 24}], 8)
    for r in rows:
        assert r["overlapped_ms"] <= r["compute_ms"] + 1e-9
        assert r["compute_ms"] + r["comm_ms"] == pytest.approx(r["time_ms"], rel=1e-3)
        assert r["algo"].count(";") == r["proto"].count(";")
    fused = next(r for r in rows if r["schedule"] == "fuse(RS-C-AG)+as_slice")
    assert fused["overlapped_ms"] > 0  # its chunks' kernels run under the next chunks' calls


def test_a_fitted_ll128_rate_is_what_the_call_runs_at_not_what_the_tuner_weighs():
    topo = load_topology("dgx_a100")
    nc = topo.nccl
    assert nc.ll128_bw_gbps is not None
    nbytes = 16 << 20
    got = nccl.call("all_reduce", nbytes, range(8), topo)
    assert got.label == "ring/LL128"  # NCCL's table (0.92 x 240 GB/s) makes LL128 the pick
    lat, bw = nccl.estimate("all_reduce", nbytes, "ring", "LL128", 8, 1, nc)
    assert bw == pytest.approx(240 * 0.92 * 8 / 14)
    runs_at = nc.channels * nc.ll128_bw_gbps * 8 / 14
    assert got.time_us == pytest.approx(lat + nbytes / (1e3 * runs_at))
    table = dataclasses.replace(nc, ll128_bw_gbps=None, fill_us=0.0)
    assert nccl.time_us(
        "all_reduce", nbytes, "ring", "LL128", 8, 1, table
    ).time_us == pytest.approx(lat + nbytes / (1e3 * bw))
    # LL likewise: NCCL's estimate picks ring/LL at 1 MiB; the call runs at the fitted LL rate
    nbytes = 1 << 20
    got = nccl.call("all_reduce", nbytes, range(8), topo)
    lat, _ = nccl.estimate("all_reduce", nbytes, "ring", "LL", 8, 1, nc)
    assert got.label == "ring/LL" and lat == pytest.approx(6.6 + 14 * 0.6)
    assert got.time_us == pytest.approx(lat + nbytes / (1e3 * nc.channels * nc.ll_bw_gbps * 8 / 14))
