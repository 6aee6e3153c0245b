"""codegen.runtime.comm and .launch on real gloo ranks, against single-process torch references.

Distributed. Every primitive runs as a case of a table; all cases of one world size run in one
launch (2 ranks, and one launch of 4 ranks whose ids start with `w4-`; deselect them with
`-k "not w4"`). Inputs are small integers, so every reduction order is exact in every dtype.
Then the launcher's failure modes (a rank raising while its peer waits in a collective, a rank
dying, a hung run) and a torchrun start of tests/torchrun_allreduce.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
import zlib

import pytest
import torch
import torch.distributed as dist

from codegen.runtime import comm
from codegen.runtime.launch import MALLOC_SETTINGS, RankError, default_threads, launch, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
}
RED = {
    "sum": lambda t: t.sum(0),
    "max": lambda t: t.amax(0),
    "min": lambda t: t.amin(0),
    "prod": lambda t: t.prod(0),
}
RS_SHAPES = [(1, 1), (6, 1), (6, 2), (100, 1), (100, 2), (100, 4), (12300, 4)]  # (n, chunks)


def case(prim, n, chunks=1, op="sum", dt="f32", group=None, **kw) -> dict:
    parts = [prim, f"n{n}", f"c{chunks}", op, dt] + [f"{k}{v}" for k, v in kw.items()]
    if group:
        parts.append("g" + "".join(map(str, group)))
    return dict(id="-".join(parts), prim=prim, n=n, chunks=chunks, op=op, dt=dt, group=group, **kw)


def cases_w2() -> list[dict]:
    out = [case("all_reduce", 37, dt=dt) for dt in DTYPES]
    out += [
        case("all_reduce", 37, op=op, dt=dt)
        for op in ("max", "min", "prod")
        for dt in ("f32", "i32")
    ]
    out += [case("reduce_scatter", n, c, op) for n, c in RS_SHAPES for op in ("sum", "max")]
    out += [case("reduce_scatter", 100, 2, dt=dt) for dt in ("f64", "f16", "bf16", "i64")]
    out += [case("reduce_scatter", 6, 2, op=op) for op in ("min", "prod")]
    out += [case("all_gather", n, c) for n, c in RS_SHAPES]
    out += [case("all_gather", 100, 4, dt=dt) for dt in ("bf16", "i32")]
    out += [case("all_gather_inplace", n, c) for n, c in [(6, 2), (100, 4), (12300, 1)]]
    out += [case("fused", 100, 4), case("fused", 12300, 4), case("fused", 6, 2, "max", "i64")]
    out += [
        case("p2p", 1000, 1, src=0, dst=1),
        case("p2p", 1000, 4, src=1, dst=0),
        case("p2p", 6, 2, dt="f16", src=0, dst=1),
    ]
    out += [case("broadcast", 50, src=0), case("broadcast", 50, dt="i64", src=1)]
    out += [case("reduce", 50, root=0), case("reduce", 50, op="max", root=1)]
    out += [case("all_to_all", 12), case("all_to_all", 2000, dt="bf16")]
    out += [case("library_rs", 100), case("library_ag", 100), case("bad_chunks", 10, 3)]
    return out


def cases_w4() -> list[dict]:
    out = [case("all_reduce", 37)]
    out += [case("reduce_scatter", n, c) for n, c in [(6, 1), (6, 2), (100, 4), (12300, 4)]]
    out += [
        case("reduce_scatter", 100, 4, "max"),
        case("all_gather", 6, 2),
        case("all_gather", 100, 4),
        case("all_gather_inplace", 100, 4),
    ]
    out += [case("fused", 100, 4), case("fused", 6, 2, "max", "i32")]
    out += [case("reduce_scatter", 100, 2, group=(1, 3)), case("all_reduce", 9, group=(0, 1, 3))]
    out += [case(p, 100, 4, group=(0, 1, 3)) for p in ("reduce_scatter", "all_gather", "fused")]
    out += [case("all_to_all", 12, group=(0, 1, 3))]
    out += [case(p, 6, 2, group=(2,)) for p in ("reduce_scatter", "all_gather", "fused")]
    out += [
        case("p2p", 30, 2, src=3, dst=0),
        case("broadcast", 30, src=2),
        case("reduce", 30, root=3),
        case("all_to_all", 40),
    ]
    return out


CASES = {2: cases_w2(), 4: cases_w4()}


def make_input(c: dict, member: int, size: int) -> torch.Tensor:
    """Member `member`'s input of case c: small integers, so reductions are exact."""
    numel = c["n"] * size if c["prim"] in ("reduce_scatter", "fused", "library_rs") else c["n"]
    g = torch.Generator().manual_seed(zlib.crc32(c["id"].encode()) % 100_000 * 97 + member)
    return torch.randint(-3, 4, (numel,), generator=g).to(DTYPES[c["dt"]])


# ----------------------------------------------------------------------------- in the ranks


def run_cases(rank: int, world: int, cases: list[dict]) -> dict:
    """Body of each rank: every case's result on this rank (None where it takes no part)."""
    groups = {g: comm.Group.new(g) for g in sorted({c["group"] for c in cases if c["group"]})}
    results = {
        "meta": {
            "rank": rank,
            "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "malloc": {k: os.environ.get(k) for k in MALLOC_SETTINGS},
        }
    }
    for c in cases:
        group = groups[c["group"]] if c["group"] else comm.Group.world()
        if rank not in group.ranks:
            results[c["id"]] = None
            continue
        try:
            results[c["id"]] = run_case(c, group, group.me)
        except Exception:  # noqa: BLE001 - reported per case
            results[c["id"]] = "ERROR " + traceback.format_exc()
    dist.barrier()
    return results


def run_case(c: dict, g: comm.Group, me: int):
    n, k, op, P, prim = c["n"], c["chunks"], c["op"], g.size, c["prim"]
    x = make_input(c, me, P)
    x0 = x.clone()
    if prim == "all_reduce":
        return comm.all_reduce(x, op, g)
    if prim == "reduce_scatter":
        out = comm.reduce_scatter(x, torch.empty(n, dtype=x.dtype), op, k, g)
        assert torch.equal(x, x0), "reduce_scatter modified its input"
        return out
    if prim == "all_gather":
        return comm.all_gather(x, torch.empty(n * P, dtype=x.dtype), k, g)
    if prim == "all_gather_inplace":
        out = torch.empty(n * P, dtype=x.dtype)
        own = out[me * n : (me + 1) * n]
        own.copy_(x)
        return comm.all_gather(own, out, k, g)
    if prim == "fused":
        return run_fused(x, n, k, op, g, me)
    if prim == "p2p":
        rank = dist.get_rank()
        if rank not in (c["src"], c["dst"]):
            return None
        out = torch.empty(n, dtype=x.dtype) if rank == c["dst"] else None
        handle = comm.p2p_async(x, out, c["src"], c["dst"], k)
        ranges = [handle.wait_chunk(i) for i in range(k)]
        assert ranges == [(i * n // k, (i + 1) * n // k) for i in range(k)], ranges
        return handle.wait()
    if prim == "broadcast":
        return comm.broadcast(x, c["src"], g)
    if prim == "reduce":
        return comm.reduce(x, torch.empty_like(x), c["root"], op, g)
    if prim == "all_to_all":
        return comm.all_to_all(x, torch.empty_like(x), g)
    if prim == "library_rs":
        return comm.library_reduce_scatter(x, torch.empty(n, dtype=x.dtype), op, g)
    if prim == "library_ag":
        return comm.library_all_gather(x, torch.empty(n * P, dtype=x.dtype), g)
    if prim == "bad_chunks":
        try:
            comm.RingAllGather(x, torch.empty(n * P, dtype=x.dtype), k, g)
        except ValueError as exc:
            return str(exc)
        return "no error"
    raise AssertionError(prim)


def run_fused(x, n, k, op, g, me):
    """fuse(RS-C-AG): kernels y = 2*r + 1 and z = r - 1 on each reduced chunk as soon as it is
    ready, each gathered by its own all-gather (two of them in flight, same tags, issued in the
    same order on every rank); y is computed in place in its output's own block, z is not."""
    reduced = torch.empty(n, dtype=x.dtype)
    y, z = torch.empty(n * g.size, dtype=x.dtype), torch.empty(n * g.size, dtype=x.dtype)
    own, z_src = y[me * n : (me + 1) * n], torch.empty(n, dtype=x.dtype)
    rs = comm.RingReduceScatter(x, reduced, op, k, g).start()
    ags = comm.RingAllGather(own, y, k, g), comm.RingAllGather(z_src, z, k, g)
    snapshots = []
    for c in range(k):
        lo, hi = rs.wait_chunk(c)
        assert (lo, hi) == (c * n // k, (c + 1) * n // k)
        snapshots.append(reduced[lo:hi].clone())  # what the kernel saw when the chunk was ready
        torch.add(reduced[lo:hi] * 2, 1, out=own[lo:hi])
        torch.sub(reduced[lo:hi], 1, out=z_src[lo:hi])
        ags[0].start_chunk(c)
        ags[1].send_chunk(c)
    rs.wait()
    for ag in ags:
        ag.wait()
    return y, z, torch.cat(snapshots)


# ----------------------------------------------------------------------------- references


def expected(c: dict, world: int, rank: int):
    members = c["group"] or tuple(range(world))
    if rank not in members:
        return None
    P, me, n, prim = len(members), members.index(rank), c["n"], c["prim"]
    xs = [make_input(c, i, P) for i in range(P)]
    red = RED[c["op"]](torch.stack(xs)).to(xs[0].dtype)  # (integer sums promote to int64)
    if prim == "all_reduce":
        return red
    if prim in ("reduce_scatter", "library_rs"):
        return red[me * n : (me + 1) * n]
    if prim in ("all_gather", "all_gather_inplace", "library_ag"):
        return torch.cat(xs)
    if prim == "fused":
        return red * 2 + 1, red - 1, red[me * n : (me + 1) * n]
    if prim == "p2p":
        return xs[c["src"]] if rank == c["dst"] else None
    if prim == "broadcast":
        return xs[members.index(c["src"])]
    if prim == "reduce":
        return red if rank == c["root"] else torch.zeros_like(red)
    if prim == "all_to_all":
        return torch.cat([xs[i].chunk(P)[me] for i in range(P)])
    if prim == "bad_chunks":
        return "chunks=3 must be >= 1 and divide the slice of n=10 elements"
    raise AssertionError(prim)


def same(got, want) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    return got == want


@pytest.fixture(scope="module")
def results():
    cache: dict[int, list] = {}

    def get(world: int) -> list:
        if world not in cache:
            cache[world] = run_ranks(run_cases, world, (CASES[world],), timeout_s=60.0)
        return cache[world]

    return get


@pytest.mark.parametrize(
    "world,c",
    [(w, c) for w in CASES for c in CASES[w]],
    ids=[f"w{w}-{c['id']}" for w in CASES for c in CASES[w]],
)
@pytest.mark.slow
def test_primitive_matches_reference(results, world, c):
    per_rank = results(world)
    for rank in range(world):
        got, want = per_rank[rank][c["id"]], expected(c, world, rank)
        assert not (isinstance(got, str) and got.startswith("ERROR")), got
        assert same(got, want), f"rank {rank}: got {got}, want {want}"


def test_launch_returns_rank_values_in_order_and_sets_threads(results):
    metas = [r["meta"] for r in results(2)]
    assert [m["rank"] for m in metas] == [0, 1]
    assert {m["threads"] for m in metas} == {default_threads(2)}
    assert {m["omp"] for m in metas} == {str(default_threads(2))}
    # malloc keeps freed memory in every rank (unless the caller set the variables)
    assert all(
        m["malloc"] == {k: os.environ.get(k, v) for k, v in MALLOC_SETTINGS.items()} for m in metas
    )


def test_chunk_size_must_divide_slice():
    assert comm.chunk_size(12, 4) == 3
    with pytest.raises(ValueError, match="chunks=5 must be >= 1 and divide the slice of n=12"):
        comm.chunk_size(12, 5)


# ----------------------------------------------------------------------------- failures


def raise_while_peer_waits(rank: int, world: int):
    if rank == 1:
        time.sleep(0.5)
        raise ValueError("bad input on rank one")
    comm.all_reduce(torch.ones(4))  # blocks: rank 1 never joins
    return rank


def die_while_peer_waits(rank: int, world: int):
    if rank == 1:
        time.sleep(0.5)
        os._exit(3)
    comm.all_reduce(torch.ones(4))
    return rank


def sleep_on_rank0(rank: int, world: int):
    if rank == 0:
        time.sleep(300)
    return rank


def wait_for_silent_peer(rank: int, world: int):
    if rank == 1:
        time.sleep(15)  # alive, but never takes part
        return rank
    short = comm.Group(None, (0, 1), timeout_s=1.0)
    comm.reduce_scatter(torch.ones(4), torch.empty(2), group=short)


@pytest.mark.slow
def test_collective_waits_honour_the_group_timeout():
    start = time.monotonic()
    with pytest.raises(RankError, match=r"^rank 0 failed: .*(?i:timed out|timeout)") as info:
        launch(wait_for_silent_peer, 2, timeout_s=20.0)
    assert time.monotonic() - start < 12.0
    assert info.value.rank == 0


def test_rank_raising_ends_run_with_its_error():
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(raise_while_peer_waits, 2, timeout_s=20.0)
    assert time.monotonic() - start < 30.0
    err = info.value
    assert str(err) == "rank 1 failed: ValueError: bad input on rank one"
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "raise_while_peer_waits" in err.remote_traceback


def test_rank_dying_is_reported_with_exit_code():
    start = time.monotonic()
    with pytest.raises(RankError, match=r"^rank 1 failed: died with exit code 3$") as info:
        launch(die_while_peer_waits, 2, timeout_s=20.0)
    assert time.monotonic() - start < 30.0
    assert info.value.exitcode == 3


@pytest.mark.slow
def test_hung_run_ends_at_deadline_naming_unfinished_ranks():
    start = time.monotonic()
    # 10 s: rank 1 must have started and finished by then (it takes 2-4 s on 2 busy cores)
    with pytest.raises(RankError, match=r"ranks \[0\] did not finish within timeout_s=10") as info:
        launch(sleep_on_rank0, 2, timeout_s=10.0)
    assert time.monotonic() - start < 30.0
    assert info.value.ranks == (0,)
    assert "sleep_on_rank0" in info.value.remote_traceback  # where the hung rank was


@pytest.mark.slow
def test_torchrun_joins_ranks_through_run_ranks():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        os.path.join(REPO, "tests", "torchrun_allreduce.py"),
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK 2 ranks" in proc.stdout


def _short_and_long_steps(rank, world):
    from codegen.runtime.measure import time_ranks

    short = time_ranks(
        lambda: time.sleep(0.005 * (1 + rank)), 1, 3, min_total_ms=100.0, max_repeats=12
    )
    long = time_ranks(lambda: time.sleep(0.05), 0, 3, min_total_ms=100.0, max_repeats=12)
    return len(short.times_ms), len(long.times_ms), min(short.times_ms)


def test_a_short_step_gets_more_repeats_the_same_on_every_rank():
    """min_total_ms: repeats until they add up to it (at most max_repeats), counted from the
    first repeat's slowest rank, so every rank runs the same number of barriers."""
    got = launch(_short_and_long_steps, 2, timeout_s=60.0)
    assert got[0][:2] == got[1][:2]
    n_short, n_long, fastest = got[0]
    assert n_long == 3 and 6 <= n_short <= 12 and fastest >= 10.0  # rank 1's 10 ms sleeps


def _rank_and_world(rank, world):
    return rank, world


def _sleep_and_say_pid(rank, world, folder):
    import os as _os

    with open(_os.path.join(folder, f"rank{rank}.pid"), "w") as f:
        f.write(str(_os.getpid()))
    time.sleep(60)


@pytest.mark.slow
def test_ranks_end_when_their_parent_is_killed(tmp_path):
    """A parent killed with SIGKILL runs no cleanup: its ranks notice and exit on their own."""
    import signal
    import subprocess
    import sys

    code = (
        "import sys; sys.path[:0] = {path!r}; from codegen.runtime.launch import launch; "
        "from tests.test_runtime_comm import _sleep_and_say_pid; "
        "launch(_sleep_and_say_pid, 2, ({folder!r},), timeout_s=120.0)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code.format(path=sys.path, folder=str(tmp_path))]
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        assert len(pids) == 2
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def alive(pid):  # a zombie waiting for its new parent to reap it has ended too
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
    # its ranks' stack files stay behind (its cleanup never ran) until the next launch
    import glob
    import tempfile

    from codegen.runtime.launch import STACKS_PREFIX

    left = glob.glob(os.path.join(tempfile.gettempdir(), f"{STACKS_PREFIX}{parent.pid}-*"))
    assert len(left) == 1
    assert run_ranks(_rank_and_world, 2, timeout_s=60) == [(0, 2), (1, 2)]
    assert not os.path.exists(left[0])
