"""Local ranks, closed and bounded: during a run nothing listens beyond loopback (the rendezvous
store, `codegen.runtime.rendezvous.serve_store`, and gloo's own sockets), and a rank that stops
answering ends the run, named, after its peers' collective timeout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codegen.runtime.launch import launch

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening(pids) -> list[str]:
    """'address:port' of every TCP socket the processes `pids` listen on (IPv4 and IPv6, from
    /proc: what `ss -ltn` shows)."""
    inodes = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            f = line.split()
            if f[3] == LISTEN and f[9] in inodes:
                out.append(f"{_address(f[1].split(':')[0])}:{int(f[1].split(':')[1], 16)}")
    return out


def _address(hex_ip: str) -> str:
    if len(hex_ip) == 8:  # IPv4, little-endian
        return ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return "::1" if hex_ip == "0" * 24 + "01000000" else ("::" if set(hex_ip) == {"0"} else hex_ip)


def _sockets(rank, world, parent):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))  # gloo's pairs are up
    mine = listening([os.getpid()])
    dist.barrier()
    return mine + (listening([parent]) if rank == 0 else [])


@pytest.mark.slow
def test_nothing_listens_beyond_loopback_during_a_run():
    got = launch(_sockets, 2, args=(os.getpid(),))
    every = [a for per_rank in got for a in per_rank]
    assert every, "the store and gloo's sockets listen somewhere"
    assert all(a.startswith(("127.", "::1:")) for a in every), every


def _stop_rank_one(rank, world):
    import signal as sig

    import torch
    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), sig.SIGSTOP)
    dist.all_reduce(torch.ones(4))


@pytest.mark.slow
def test_a_stopped_rank_ends_the_run_named_after_the_collective_timeout():
    """Bounded work: a rank suspended by SIGSTOP (alive, silent) is named once its peers'
    collective times out (`collective_timeout_s`), not at the run's end."""
    import time

    import pytest

    from codegen.runtime.failures import RankError

    start = time.monotonic()
    with pytest.raises(RankError) as got:
        launch(_stop_rank_one, 2, timeout_s=120.0, collective_timeout_s=3.0)
    assert str(got.value).startswith("rank 1 is stopped") and got.value.rank == 1
    assert time.monotonic() - start < 60


from test_suite_cli import assert_one_line_error, suite_cmd  # noqa: E402


@pytest.mark.parametrize(
    "override,says",
    [
        ("world_size=4096", "more ranks than this machine can run"),
        ("scale.budget_s=inf", "must be > 0 and finite"),
        ("scale.long_budget_s=inf", "must be >= 0 and finite"),
        ("collective_timeout_s=0", "must be > 0 and finite"),
    ],
)
@pytest.mark.slow
def test_unbounded_work_is_refused_before_it_starts(override, says, tmp_path):
    assert_one_line_error(
        suite_cmd("experiment=adam_fusion", "scale=smoke", override, f"hydra.run.dir={tmp_path}"),
        says,
    )


def test_the_collective_timeout_comes_from_the_calibrated_rate():
    """Seconds, not minutes: 100x the calibrated all-reduce of the run's largest tensor, at least
    30 s; what the user sets wins; before a calibration exists, 120 s."""
    import dataclasses

    from cost_model.topology import load_topology
    from suite.config import Config, collective_timeout

    cfg = Config()
    cfg = dataclasses.replace(
        cfg, world_size=2, scale=dataclasses.replace(cfg.scale, max_elements=1 << 22)
    )
    topo = load_topology("local")
    assert collective_timeout(cfg, None) == collective_timeout(cfg, topo) == 120.0
    # 2 ranks: 32 MiB (2^22 f64) all-reduced in 0.4 s -> 40 s; 4 ranks' curve ignored
    fast = dataclasses.replace(topo, all_reduce_us={2: {1 << 20: 12_500.0}, 4: {1 << 20: 1e6}})
    assert collective_timeout(cfg, fast) == pytest.approx(40.0)
    faster = dataclasses.replace(topo, all_reduce_us={2: {1 << 20: 100.0}})
    assert collective_timeout(cfg, faster) == 30.0  # the floor
    assert collective_timeout(dataclasses.replace(cfg, collective_timeout_s=5.0), fast) == 5.0
