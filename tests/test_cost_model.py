"""The discrete-event model: exact timelines of tiny scenarios, its rules, folding, and the
closed form as its oracle (pure: no ranks, no compiler)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import experiments
from codegen import plan as plan_types
from codegen.lower import lower
from cost_model import closed_collectives, collectives, workload
from cost_model.closed_collectives import collective_us
from cost_model.closed_form import closed_rules, plan_us
from cost_model.collectives import CollSpec
from cost_model.network import Sim, mesh_ring_links
from cost_model.topology import LinkClass, Topology, load_topology
from cost_model.workload import cost_rules, simulate, simulate_collective
from dsl import f16

adam_fusion, lamb_fusion, model_parallel, pipeline_parallel = (
    experiments.get(n)
    for n in ("adam_fusion", "lamb_fusion", "model_parallel", "pipeline_parallel")
)


def tiny(
    kind="switch", u=0.0, v=0.0, overhead=0.0, latency=1.0, nodes=1, per_node=2, **kw
) -> Topology:
    """1 GB/s links (1000 bytes per us), 1 us latency, a 1 GB/s memory and no launch cost."""
    d = {
        "name": "tiny",
        "nodes": nodes,
        "devices_per_node": per_node,
        "device": {
            "name": "d",
            "peak_tflops": {"f32": 1.0},
            "memory_bandwidth_gbps": 1.0,
            "launch_us": 0.0,
        },
        "intra": {
            "kind": kind,
            "link": {"bandwidth_gbps": 1.0, "latency_us": latency, "overhead_us": overhead},
        },
        "compute_slowdown": u,
        "comm_slowdown": v,
        **kw,
    }
    if nodes > 1:
        d["inter"] = {"nics": 1, "nic": {"bandwidth_gbps": 0.5, "latency_us": 2.0}}
    return Topology.from_dict(d)


def rows(result_or_sim):
    df = result_or_sim.frame() if isinstance(result_or_sim, Sim) else result_or_sim.trace
    return sorted(
        (r.rank, r.stream, r.task, round(r.start, 9), round(r.end, 9)) for r in df.itertuples()
    )


# -- exact timelines ------------------------------------------------------------------------------
def test_ring_all_reduce_of_two_ranks():
    # 2000 bytes on 2 ranks: each step moves 1000 bytes (1 us on the wire) and arrives 1 us later
    r = simulate_collective(CollSpec("all_reduce", 2000, (0, 1)), tiny(), "ring")
    assert r.time_us == pytest.approx(4.0)
    assert rows(r) == [
        (0, "comm", "ag c0 s0", 2.0, 4.0),
        (0, "comm", "rs c0 s0", 0.0, 2.0),
        (1, "comm", "ag c0 s0", 2.0, 4.0),
        (1, "comm", "rs c0 s0", 0.0, 2.0),
    ]


def test_a_bus_serializes_what_ports_run_side_by_side():
    r = simulate_collective(CollSpec("all_gather", 2000, (0, 1)), tiny("bus", latency=0.0), "ring")
    assert rows(r) == [(0, "comm", "ag c0 s0", 0.0, 1.0), (1, "comm", "ag c0 s0", 1.0, 2.0)]


def test_chunks_queue_on_a_port_and_overhead_holds_it():
    t = tiny(overhead=0.5, latency=0.0)
    r = simulate_collective(CollSpec("reduce_scatter", 4000, (0, 1), chunks=2), t, "ring")
    # 2 chunks of 1000 bytes per rank: each holds the port 0.5 + 1 us, one after the other
    assert [x for x in rows(r) if x[0] == 0] == [
        (0, "comm", "rs c0 s0", 0.0, 1.5),
        (0, "comm", "rs c1 s0", 1.5, 3.0),
    ]


def test_compute_slows_down_while_its_rank_communicates():
    sim = Sim(tiny(u=0.5, latency=0.0), 2)
    sim.transfer(0, 1, 4000, "s", "x")  # 4 us on the wire
    sim.compute(0, 10.0, "s", "k")  # 4 us at half speed (2 us of work), then 8 us
    sim.compute(1, 10.0, "s", "k")  # rank 1 receives: slowed as well
    sim.run()
    assert rows(sim) == [
        (0, "comm", "x", 0.0, 4.0),
        (0, "compute", "k", 0.0, 12.0),
        (1, "compute", "k", 0.0, 12.0),
    ]


def test_communication_slows_down_while_an_end_computes():
    sim = Sim(tiny(v=0.5, latency=0.0), 2)
    sim.compute(1, 2.0, "s", "k")
    sim.transfer(0, 1, 4000, "s", "x")  # 2 us at 3/4 speed (one end of two computes), then
    sim.run()
    assert rows(sim) == [(0, "comm", "x", 0.0, 4.5), (1, "compute", "k", 0.0, 2.0)]


def test_the_compute_stream_runs_in_issue_order():
    sim = Sim(tiny(latency=0.0), 2)
    late = sim.transfer(0, 1, 3000, "s", "x")
    sim.compute(1, 1.0, "s", "a", [late])  # waits for the transfer
    sim.compute(1, 1.0, "s", "b")  # issued after a: waits for it although ready
    sim.run()
    assert rows(sim)[1:] == [(1, "compute", "a", 3.0, 4.0), (1, "compute", "b", 4.0, 5.0)]


def test_a_thread_blocked_on_a_chunk_runs_wake_us_after_it_lands_or_when_transfers_end():
    """`wake_us`: rank 1's kernel waits for the first of two chunks (lands at 2 us, the second
    is on the wire until 4 us): it starts 1 us after the landing with wake_us = 1, at the end of
    the transfers (4 us) with wake_us = 5, at once with 0; a kernel whose input had landed
    before the thread got to it (it was busy) starts at once."""
    for wake, start in ((0.0, 2.0), (1.0, 3.0), (5.0, 4.0)):
        sim = Sim(tiny("bus", latency=0.0, wake_us=wake), 2)
        first = sim.transfer(0, 1, 2000, "s", "c0")
        sim.transfer(0, 1, 2000, "s", "c1")
        sim.compute(1, 1.0, "s", "k", [first])
        sim.run()
        assert [x for x in rows(sim) if x[1] == "compute"] == [
            (1, "compute", "k", start, start + 1.0)
        ], wake
    sim = Sim(tiny("bus", latency=0.0, wake_us=1.0), 2)
    first = sim.transfer(0, 1, 2000, "s", "c0")
    sim.transfer(0, 1, 2000, "s", "c1")
    sim.compute(1, 2.5, "s", "busy")  # the thread works until 2.5 us: c0 is there by then
    sim.compute(1, 1.0, "s", "k", [first])
    sim.run()
    assert [x[3] for x in rows(sim) if x[2] == "k"] == [2.5]


def test_a_fused_step_computes_each_chunk_as_soon_as_it_is_reduced():
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 8000}, 2)
    r = simulate(plan, tiny())
    kernels = r.trace[r.trace.stream == "compute"].sort_values("start")
    rs = r.trace[r.trace.task.str.startswith("rs")].sort_values("end")
    assert len(kernels) == 2 * 4 and kernels.start.iloc[0] < rs.end.max()  # overlapped


def test_a_send_whose_receive_was_posted_first_holds_the_senders_thread():
    # posted by the rank's thread (0.5 us), 4 us on the wire, arriving 1 us later: a sync send
    # keeps the thread until it is off the wire, not until it arrives
    t = tiny(overhead=0.5, ring_work_on_compute=True)
    for sync, start in ((False, 0.5), (True, 4.5)):
        sim = Sim(t, 2)
        sim.transfer(0, 1, 4000, "s", "x", sync=sync)
        sim.compute(0, 1.0, "s", "k")
        sim.run()
        assert [x for x in rows(sim) if x[2] != "post x"] == [
            (0, "comm", "x", 0.5, 5.5),
            (0, "compute", "k", start, start + 1.0),
        ]


def test_a_fused_step_computes_the_next_chunk_once_its_all_gather_chunk_is_written():
    """The runtime posts a fused step's all-gather receives first, so gloo writes each chunk in
    the rank's thread: chunk c+1's kernel waits for chunk c's all-gather send."""
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 8000}, 2)
    t = simulate(plan, tiny(latency=0.0, ring_work_on_compute=True)).trace
    t = t[t["rank"] == 0]
    kernels = t[(t.stream == "compute") & t.task.str.fullmatch(r"c\d")].sort_values("start")
    ag = t[(t.stream == "comm") & t.task.str.startswith("ag")].sort_values("start")
    rs = t[(t.stream == "comm") & t.task.str.startswith("rs")]
    adds = t[t.task.str.startswith("add")]
    assert len(kernels) == len(ag) == 4
    assert adds.start.min() < rs.end.max()  # the reduce-scatter's sends do not hold the thread
    assert all(kernels.start.iloc[c + 1] >= ag.end.iloc[c] - 1e-9 for c in range(3))


# -- rules, folding, the oracle -------------------------------------------------------------------
def test_every_plan_step_kind_has_a_rule():
    kinds = {
        t.__forward_arg__ if isinstance(t, typing.ForwardRef) else t.__name__
        for t in typing.get_args(plan_types.Step)
    }
    kinds = {k.strip("'\"") for k in kinds}
    assert kinds == set(cost_rules) == set(closed_rules)


def test_folding_by_node_is_exact_where_every_node_does_the_same():
    topo = load_topology("dgx2", nodes=4)
    for name in ("RS-C-AG", "fuse(RS-C-AG)+as_slice"):
        plan = lower(adam_fusion.schedules()[name], {"N": 1 << 20}, topo.devices)
        folded, full = simulate(plan, topo, fold=True), simulate(plan, topo, fold=False)
        assert folded.folded and not full.folded
        assert folded.time_us == pytest.approx(full.time_us, rel=1e-9)
        assert len(folded.trace) * 4 == len(full.trace)


def test_mesh_rings_use_every_nvlink():
    assert mesh_ring_links(load_topology("dgx1_v100")) == 6


def _applicable(kind, algo, topo_name, nodes) -> bool:
    topo = load_topology(topo_name, nodes=nodes)
    P = 2 if topo_name == "local" else topo.devices
    spec = CollSpec(kind, 1 << 20, tuple(range(P)), 1, kind in topo.library_kinds)
    return algo in collectives.applicable(spec, topo)


COLLECTIVE_CASES = [
    (kind, algo, topo, nodes, size)
    for topo, nodes in (
        ("dgx_a100", 1),
        ("dgx2", 1),
        ("dgx2", 2),
        ("dgx1_v100", 1),
        ("dgx_h100", 2),
        ("local", 1),
    )
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
    for algo in collectives.ALGORITHMS[kind]
    if _applicable(kind, algo, topo, nodes)
    for size in (1 << 12, 1 << 20, 1 << 28)
]


def quiet(topo: Topology) -> Topology:
    """No overlap slowdowns: nothing contends for a rank's cores."""
    return dataclasses.replace(topo, compute_slowdown=0.0, comm_slowdown=0.0)


@pytest.mark.parametrize("kind,algo,topo_name,nodes,size", COLLECTIVE_CASES)
def test_des_agrees_with_the_closed_form(kind, algo, topo_name, nodes, size):
    topo = quiet(load_topology(topo_name, nodes=nodes))
    P = 2 if topo_name == "local" else topo.devices
    spec = CollSpec(kind, size, tuple(range(P)), 1, kind in topo.library_kinds)
    des = simulate_collective(spec, topo, algo, fold=False).time_us
    assert des == pytest.approx(collective_us(spec, algo, topo), rel=0.02)


def links_only(topo: Topology) -> Topology:
    """The topology without NCCL's model: collectives as the DES's own chunked transfers."""
    return dataclasses.replace(quiet(topo), nccl=None)


def test_chunked_rings_agree_on_one_node():
    """Chunks pipelined through a ring: the busiest port's messages plus one latency (large
    messages on NVSwitch; the CPU runtime's bus, where chunks go first come, first served)."""
    for topo_name, S in (("dgx_a100", 1 << 28), ("local", 1 << 24), ("local", 1 << 16)):
        topo = links_only(load_topology(topo_name))
        P = 8 if topo_name == "dgx_a100" else 2
        for C in (2, 4, 8):
            spec = CollSpec("reduce_scatter", S, tuple(range(P)), C)
            des = simulate_collective(spec, topo, "ring").time_us
            assert des == pytest.approx(collective_us(spec, "ring", topo), rel=0.02)


def test_chunks_go_at_the_whole_transfers_rate_where_the_link_says_so():
    """`rate_by: transfer` reads a chunk's efficiency at its whole message's size (DES and closed
    form alike), so C chunks are no slower on the wire than one message; `message` at its own."""
    base = links_only(load_topology("dgx_a100"))
    times = {}
    for rate_by in ("message", "transfer"):  # wire-bound: no latency, a steep efficiency curve
        link = dataclasses.replace(
            base.intra.link,
            latency_us=0.0,
            rate_by=rate_by,
            efficiency={1 << 16: 0.2, 1 << 24: 1.0},
        )
        t = dataclasses.replace(base, intra=dataclasses.replace(base.intra, link=link))
        spec = CollSpec("reduce_scatter", 1 << 25, tuple(range(8)), 16)  # 256 KiB of 4 MiB
        times[rate_by] = simulate_collective(spec, t, "ring").time_us
        assert times[rate_by] == pytest.approx(collective_us(spec, "ring", t), rel=0.02)
    assert times["transfer"] == pytest.approx(times["message"] * 0.4 / 0.8, rel=0.05)


def _sequential_plans():
    f = {"N": 1 << 22}
    yield "dgx2", 2, adam_fusion.schedules()["AR-C"], f
    yield "dgx2", 2, adam_fusion.schedules()["RS-C-AG"], f
    yield "dgx_a100", 1, lamb_fusion.schedules()["RS-C-AG+as_slice"], f
    yield "local", 1, adam_fusion.schedules()["AR-C"], f
    mp = {"B": 8, "S": 1024, "H": 3072, "K": 3072}
    yield "dgx2", 1, model_parallel.schedules(f16)["MM-RS-C-AG"], mp
    yield (
        "dgx_h100",
        2,
        pipeline_parallel.schedules(f16)["RS-P2P-C-AG"],
        {"B": 1, "S": 2048, "H": 12288},
    )


@pytest.mark.parametrize(
    "topo_name,nodes,program,bindings",
    list(_sequential_plans()),
    ids=lambda x: getattr(x, "schedule", str(x)),
)
def test_des_agrees_with_the_closed_form_on_sequential_schedules(
    topo_name, nodes, program, bindings
):
    topo = quiet(load_topology(topo_name, nodes=nodes))
    world = 16 if program.stages == 2 else (2 if topo_name == "local" else topo.devices)
    if program.name == "megatron_layer":
        world = 16
    plan = lower(program, bindings, world)
    assert simulate(plan, topo).time_us == pytest.approx(plan_us(plan, topo), rel=0.02)


def test_the_tuner_picks_the_fastest_estimate_unless_forced():
    topo = load_topology("dgx2", nodes=4)
    spec = CollSpec("all_reduce", 1 << 12, tuple(range(64)))
    picks = {a: collective_us(spec, a, topo) for a in collectives.applicable(spec, topo)}
    assert closed_collectives.choose(spec, topo) == min(picks, key=picks.get)
    forced = dataclasses.replace(topo, algorithm="ring")
    assert closed_collectives.choose(spec, forced) == "ring"


def test_every_schedule_of_every_experiment_simulates():
    cases = [
        (adam_fusion, {"N": 1 << 16}, 8, None),
        (lamb_fusion, {"N": 1 << 16}, 8, None),
        (model_parallel, {"B": 2, "S": 64, "H": 64, "K": 256}, 8, f16),
        (pipeline_parallel, {"B": 1, "S": 64, "H": 64}, 16, f16),
    ]
    topo = load_topology("dgx_a100", nodes=2)
    for exp, b, world, dtype in cases:
        progs = exp.schedules(dtype) if dtype else exp.schedules()
        for name, p in progs.items():
            r = simulate(lower(p, b, world), topo)
            assert r.time_us > 0 and not r.trace.empty, name
            assert set(r.trace.columns) >= {"rank", "stream", "step", "start", "end"}


def test_workload_module_exports():
    assert workload.FOLDABLE and isinstance(
        LinkClass(bandwidth_gbps=1, latency_us=0).time_us(1e3), float
    )
