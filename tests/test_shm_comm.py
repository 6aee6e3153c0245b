"""comm=shm: collectives and point to point over POSIX shared memory between local ranks, checked
against exact expectations; waits that time out with a clear error; no segment left behind by a
run, a rank that fails, or a rank killed by SIGKILL (the launcher removes them by the run's prefix),
and what a launcher killed outright left is swept by the next launch (`shm.sweep`).
"""

import dataclasses
import glob
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import dsl
from codegen.build import build
from codegen.lower import lower
from codegen.plan import Collective, Compute, FusedCollective
from codegen.render_cpp import CppRenderer
from codegen.runtime import shm
from codegen.runtime.backend import CpuBackend
from codegen.runtime.comm import Group
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import RankError, launch
from codegen.runtime.shm_comm import ShmComm
from codegen.shm_fuse import peer_step
from cost_model.closed_collectives import choose, collective_us, shm_all_reduce_bytes
from cost_model.closed_form import kernel_bytes, spec_of
from cost_model.peer_fused import peer_readable
from cost_model.topology import load_topology
from cost_model.workload import simulate
from dsl.space import Budget as SpaceBudget
from dsl.space import schedule_space
from experiments import adam_fusion, lamb_fusion
from experiments.predict import library_compute_us


def _segments() -> set:
    return set(glob.glob(os.path.join(shm.ROOT, "coconet-shm-*")))


@pytest.fixture
def no_leaks():
    before = _segments()
    yield
    assert _segments() <= before, "shared-memory segments left behind"


def _collectives(rank, world):
    c = CpuBackend(comm="shm").communicator(Group.world(), None)
    assert isinstance(c, ShmComm)
    out = {}
    for n in (12 * world, 3 << 20):  # a small message, then one that grows the slots
        x = torch.arange(n, dtype=torch.float32) + 1000 * rank
        c.all_reduce(x, "sum")
        out[f"ar{n}"] = x
        y = torch.full((n,), float(rank + 1))
        c.all_reduce(y, "max")
        out[f"max{n}"] = y[:4]
        part = torch.empty(n // world)
        c.reduce_scatter(torch.arange(n, dtype=torch.float32) * (rank + 1), part, "sum")
        out[f"rs{n}"] = part
        full = torch.empty(n)
        c.all_gather(torch.full((n // world,), float(rank)), full)
        out[f"ag{n}"] = full
    b = torch.full((8,), float(rank))
    c.broadcast(b, 1)
    r = torch.empty(8)
    c.reduce(torch.full((8,), float(rank + 1)), r, 0, "sum")
    a = torch.empty(4 * world)
    c.all_to_all(torch.arange(4 * world, dtype=torch.float32) + 100 * rank, a)
    out.update(bcast=b, reduce=r, a2a=a)
    # a fused step's pattern: reduce-scatter chunk by chunk, gathers started per chunk
    C, n = 4, 64 * world
    g = torch.arange(n, dtype=torch.float32) * (rank + 1)
    red = torch.empty(n // world)
    rs = c.reduce_scatter_chunks(g, red, "sum", C).start(send=False)
    ags = [c.all_gather_chunks(red, torch.empty(n), C) for _ in range(2)]
    for k in range(C):
        rs.send_chunk(k)
        lo, hi = rs.wait_chunk(k)
        red[lo:hi] *= 2
        for ag in ags:
            ag.start_chunk(k)
    rs.wait()
    for ag in ags:
        ag.wait()
    out["fused"] = ags[1].out
    # point to point, chunk by chunk, twice (the second waits for the first to be read)
    for k, m in enumerate((256, 1 << 19) if rank < 2 else ()):  # from rank 0 to rank 1
        buf = torch.arange(m, dtype=torch.float32) + k if rank == 0 else torch.zeros(m)
        p = c.p2p(buf if rank == 0 else None, None if rank == 0 else buf, 0, 1, 4)
        p.start() if rank == 0 else None
        p.wait()
        out[f"p2p{k}"] = buf
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])  # 3: slices of unequal size, two peers per member
def test_every_collective_and_p2p_gives_the_exact_result(no_leaks, world):
    res = launch(_collectives, world, timeout_s=180)
    for n in (12 * world, 3 << 20):
        base = torch.arange(n, dtype=torch.float32)
        for rank in range(world):
            o = res[rank]
            assert torch.equal(o[f"ar{n}"], base * world + 1000 * sum(range(world)))
            assert torch.equal(o[f"max{n}"], torch.full((4,), float(world)))
            k = n // world
            full = base * sum(r + 1 for r in range(world))
            assert torch.equal(o[f"rs{n}"], full[rank * k : (rank + 1) * k])
            assert torch.equal(o[f"ag{n}"], torch.arange(world).repeat_interleave(k).float())
    for rank in range(world):
        o = res[rank]
        assert torch.equal(o["bcast"], torch.full((8,), 1.0))
        expect = (
            torch.full((8,), float(sum(r + 1 for r in range(world))))
            if rank == 0
            else torch.zeros(8)
        )
        assert torch.equal(o["reduce"], expect)
        assert torch.equal(
            o["a2a"],
            torch.cat(
                [torch.arange(4 * rank, 4 * rank + 4).float() + 100 * i for i in range(world)]
            ),
        )
        n = 64 * world
        assert torch.equal(
            o["fused"], torch.arange(n).float() * sum(r + 1 for r in range(world)) * 2
        )
        if rank < 2:
            assert torch.equal(o["p2p0"], torch.arange(256).float())
            assert torch.equal(o["p2p1"], torch.arange(1 << 19).float() + 1)


def _one_skips(rank, world):
    c = ShmComm(Group.world(), timeout_s=1.0)
    if rank == 0:
        c.all_reduce(torch.ones(16), "sum")
    else:
        time.sleep(30)


@pytest.mark.slow
def test_a_peer_that_never_comes_is_a_timeout_not_a_hang(no_leaks):
    start = time.monotonic()
    with pytest.raises(
        RankError,
        match=r"rank 0 failed: ShmTimeout: shm: member 0 waited "
        r"1\.\d s for member\(s\) \[1\] \(all_reduce",
    ):
        launch(_one_skips, 2, timeout_s=60)
    assert time.monotonic() - start < 30


def _killed(rank, world, where):
    c = ShmComm(Group.world())
    c.all_reduce(torch.ones(1 << 16), "sum")
    if rank == 1:
        if where == "setup":  # between creating a segment and unlinking it
            shm.Segment(c.base + "l0-m1-g99", 1 << 20, create=True)
        os.kill(os.getpid(), signal.SIGKILL)
    c.all_reduce(torch.ones(1 << 16), "sum")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after", "setup"])
def test_a_killed_rank_ends_the_run_and_leaves_no_segment(no_leaks, where):
    with pytest.raises(RankError, match="rank 1 failed: killed by signal SIGKILL"):
        launch(_killed, 2, args=(where,), timeout_s=60)


def test_sweep_removes_the_segments_of_ports_no_socket_uses_and_keeps_the_others():
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        with socket.socket() as probe:  # a port nothing uses once this socket closes
            probe.bind(("127.0.0.1", 0))
            dead = probe.getsockname()[1]
        kept = shm.Segment(shm.prefix(live.getsockname()[1]) + "board", 64, create=True)
        left = shm.Segment(shm.prefix(dead) + "board", 64, create=True)
        try:
            gone = shm.sweep()
            assert os.path.basename(left.path) in gone and not os.path.exists(left.path)
            assert os.path.exists(kept.path)
        finally:
            kept.unlink()
            left.unlink()


@pytest.mark.slow
def test_a_launcher_killed_outright_leaves_segments_the_next_launch_sweeps(no_leaks):
    code = textwrap.dedent("""
        from codegen.runtime.launch import launch
        from tests.test_shm_comm import _stuck
        launch(_stuck, 2, timeout_s=90)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        paths = [parent.stdout.readline().strip() for _ in range(2)]
        assert all(p.startswith(shm.ROOT) and os.path.exists(p) for p in paths)
    finally:
        parent.kill()  # no cleanup runs; its ranks end within a second (they watch their parent)
        parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _in_use(paths) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(os.path.exists(p) for p in paths)  # left behind ...
    launch(_nothing, 2, timeout_s=60)
    assert not any(os.path.exists(p) for p in paths)  # ... and swept by the next launch


def _stuck(rank, world):
    """A segment mid-setup when the launcher dies: made, its path printed, never unlinked."""
    seg = shm.Segment(shm.prefix(os.environ["MASTER_PORT"]) + f"r{rank}", 64, create=True)
    os.write(1, (seg.path + "\n").encode())  # one write: the two ranks' lines never interleave
    time.sleep(60)


def _in_use(paths):
    """The segments among `paths` whose port a socket still uses (the dying ranks' own)."""
    used = shm.ports_in_use()
    return [p for p in paths if shm.port_of(p) in used]


def _nothing(rank, world):
    return rank


# -- the fused kernel that reads its peers' chunks (codegen.shm_fuse) ---------------------------
def test_the_fused_adam_kernel_reads_every_members_gradient_chunk():

    for name in ("fuse(RS-C-AG)", "fuse(RS-C-AG)+as_slice"):
        plan = lower(adam_fusion.schedules()[name], {"N": 1024}, 4, fused_chunks=2)
        (f,) = [s for s in plan.steps if isinstance(s, FusedCollective)]
        ps = peer_step(plan, f)
        assert ps is not None and len(ps.peer_buffers) == 4
        src = CppRenderer().render(ps.kernels[0].kernel)
        assert all(f"b{b}[e]" in src for b in ps.peer_buffers)
        assert f"b{ps.head.dst}" not in src  # the reduced gradient is never materialised
    lamb = lower(lamb_fusion.schedules()["fuse(RS-C-AG)"], {"N": 1024}, 2, fused_chunks=2)
    (f,) = [s for s in lamb.steps if isinstance(s, FusedCollective)]
    assert peer_step(lamb, f) is None  # its norms are a barrier inside: the chunked path runs it


def _peer_adam(rank, world, plan, inputs):
    backend = CpuBackend(comm="shm")
    runner = PlanRunner(plan, rank, backend.build(plan.kernels()), backend.groups(), backend)
    runner.load(inputs[rank])
    runner.run()
    return sorted(runner.peer_steps), runner.outputs()


@pytest.mark.slow
@pytest.mark.parametrize("world,n", [(2, 1 << 12), (3, 3 << 10)])
def test_fused_adam_over_shared_memory_matches_the_interpreter(no_leaks, world, n):
    b = {"N": n}
    prog = adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"]
    plan = lower(prog, b, world, fused_chunks=4)
    build(plan.kernels())
    inputs = dsl.random_inputs(prog, world, b, np.random.default_rng(3))
    expect = dsl.interpret(prog, inputs, world, b)
    bounds = dsl.error_bounds(prog, inputs, world, b)
    for rank, (steps, got) in enumerate(
        launch(_peer_adam, world, args=(plan, inputs), timeout_s=300)
    ):
        assert steps, "the peer-reading kernel did not run"
        assert dsl.runs_agree(got, expect[rank], bounds[rank])


def test_the_cost_models_shm_topology_loads_and_predicts_the_fused_step_faster():
    path = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "local_shm.yaml"
    shm_topo, gloo_topo = load_topology("local", path=str(path)), load_topology("local")
    assert shm_topo.library.bandwidth_gbps > gloo_topo.library.bandwidth_gbps
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": 1 << 24}, 2)
    assert simulate(plan, shm_topo).time_us < simulate(plan, gloo_topo).time_us


def test_on_a_peer_reads_topology_the_fused_step_is_memory_traffic_on_each_rank():
    """comm=shm's fused all-reduce in the DES: per chunk the peers' blocks published, the kernel
    with the peers' chunks read inside and its output written twice, then the peers' blocks of
    the parameters read: the sum of those memory times (both ranks alike, nothing waits)."""
    path = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "local_shm.yaml"
    topo = load_topology("local", path=str(path))
    assert topo.peer_reads
    n, P, C = 1 << 24, 2, 4
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": n}, P, fused_chunks=C)
    (f,) = [s for s in plan.steps if isinstance(s, FusedCollective)]
    head, dev = f.steps[0], topo.device
    (k,) = [s for s in f.steps if isinstance(s, Compute)]
    (g,) = [s for s in f.steps[1:] if isinstance(s, Collective)]
    mem = lambda b: b / (dev.stream_memory_gbps * 1e3)  # noqa: E731
    assert dev.write_allocate  # a copy: read, write, the destination's line read first
    kernel = dev.launch_us + mem(kernel_bytes(plan, k, topo) / C)
    expect = (
        C * (dev.launch_us + mem(3 * head.nbytes / 2 / C))
        + C
        * (
            kernel + mem(head.nbytes / 2 / C) + mem(g.nbytes / 2 / C)
        )  # the own block: lines of w the kernel read
        + dev.launch_us
        + mem(3 * g.nbytes / 2)
        + topo.step_overhead_us
    )
    assert simulate(plan, topo).time_us == pytest.approx(expect, rel=1e-6)
    split = lower(adam_fusion.schedules()["RS-C-AG+as_slice"], {"N": n}, P, fused_chunks=C)
    assert simulate(plan, topo).time_us < simulate(split, topo).time_us
    plain = dataclasses.replace(topo, peer_reads=False)  # the chunked rings' model otherwise
    assert simulate(plan, plain).time_us != pytest.approx(expect, rel=1e-3)


def _traffic_topology(write_allocate: bool):
    """local_shm.yaml streaming 1 GB/s per rank with no launch, no step overhead and compute
    for free: a task's microseconds are the kilobytes it moves."""
    path = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "local_shm.yaml"
    topo = load_topology("local", path=str(path))
    dev = dataclasses.replace(
        topo.device,
        launch_us=0.0,
        write_allocate=write_allocate,
        peak_tflops={k: 1e6 for k in topo.device.peak_tflops},
        stream_memory_gbps=1.0,
    )
    return dataclasses.replace(topo, device=dev, step_overhead_us=0.0)


@pytest.mark.parametrize("write_allocate", [True, False])
def test_the_fused_steps_modelled_bytes_are_what_the_runtime_moves(write_allocate):
    """Per rank, per unit u = one rank's slice (N/2 f32) of Adam's fuse(RS-C-AG)+as_slice on 2
    ranks, counted from `pipelined.peer_fused` and the kernel `codegen.shm_fuse` generates:
    publish (its peer's block of g copied into its slot): read u, write u, and on a
    write-allocate CPU the slot's lines read first: 3u (2u without);
    the kernel: reads its own and the peer's block of g, m, v, its slice of w (5u), writes m, v
    (in place), w's slice into its slot (fresh: +u write-allocate) and into its own block of w
    (in place: the lines it just read): 4u + 1u;
    read peers (the peer's slot copied into its block of w): 3u (2u).
    A regression in any of these counts (e.g. the second write charged a line read again, or
    a copy charged two passes on a write-allocate CPU) fails here."""
    n, P, C = 1 << 22, 2, 4
    u = n // P * 4
    plan = lower(adam_fusion.schedules()["fuse(RS-C-AG)+as_slice"], {"N": n}, P, fused_chunks=C)
    r = simulate(plan, _traffic_topology(write_allocate))
    df = r.trace[(r.trace["rank"] == 0) & (r.trace.stream == "compute")]
    kb = {
        task: float((d.end - d.start).sum())
        for task, d in df.assign(task=df.task.str.replace(r" c\d+$", "", regex=True)).groupby(
            "task"
        )
    }
    wa = 1 if write_allocate else 0
    assert kb["publish"] * 1e3 == pytest.approx((2 + wa) * u, rel=1e-9)
    assert kb["peers"] * 1e3 == pytest.approx((9 + wa) * u, rel=1e-9)
    assert kb["read peers"] * 1e3 == pytest.approx((2 + wa) * u, rel=1e-9)
    assert r.time_us * 1e3 == pytest.approx((13 + 3 * wa) * u, rel=1e-9)


@pytest.mark.parametrize("write_allocate", [True, False])
def test_the_shm_baselines_modelled_bytes_are_what_its_all_reduce_moves(write_allocate):
    """The library baseline on comm=shm: ShmComm.all_reduce's memory traffic per rank (2 ranks,
    slices s = N/2 f32: its peer's slice copied into its slot, its own slice reduced in place
    (reads 2 s, writes s), copied into its slot, the peer's reduced slice copied out: 3 copies
    of 3 s (2 s without write-allocate) and 3 s) plus the library's fixed cost, then torch's
    optimizer at its measured time; the same in the DES and the closed form, and at 3 ranks."""
    topo = _traffic_topology(write_allocate)
    n, copy = 1 << 22, 3 if write_allocate else 2
    s = n // 2 * 4
    assert shm_all_reduce_bytes(4 * n, 2, write_allocate) == (3 * copy + 3) * s
    assert shm_all_reduce_bytes(4 * n, 3, write_allocate) == (5 * copy + 6) * (4 * n / 3)
    plan = lower(adam_fusion.EXPERIMENT.program(), {"N": n}, 2)
    fixed = topo.library.latency_us + topo.library.overhead_us
    r = simulate(plan, topo, compute_us=library_compute_us(plan, 5.0))
    assert r.time_us == pytest.approx(fixed + (3 * copy + 3) * s / 1e3 + 5000.0, rel=1e-9)
    (ar,) = [st for st in plan.steps if isinstance(st, Collective)]
    spec = spec_of(plan, ar, topo)
    assert collective_us(spec, choose(spec, topo), topo) == pytest.approx(
        fixed + (3 * copy + 3) * s / 1e3, rel=1e-9
    )
    gloo = dataclasses.replace(topo, peer_reads=False)  # not shared memory: the fitted link
    assert simulate(plan, gloo, compute_us=library_compute_us(plan, 5.0)).time_us != pytest.approx(
        r.time_us, rel=1e-3
    )


def test_the_cost_model_runs_peer_style_exactly_what_the_runtime_does():
    """`peer_reads` applies to the fused steps `codegen.shm_fuse.peer_step` accepts, no others
    (every schedule of Adam's space, fuse(RS-AG-C) among them, and LAMB's)."""
    space = schedule_space(adam_fusion.EXPERIMENT.program(), SpaceBudget(sliceable=("m", "v")))
    named = {s.name: s.program for s in space.schedules}
    assert "fuse(RS-AG-C)" in named
    for progs in (named, lamb_fusion.schedules()):
        for name, prog in progs.items():
            plan = lower(prog, {"N": 1024}, 2, fused_chunks=2)
            for f in [s for s in plan.steps if isinstance(s, FusedCollective)]:
                assert peer_readable(plan, f) == (peer_step(plan, f) is not None), name
