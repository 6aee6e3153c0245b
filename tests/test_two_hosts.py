"""Two hosts for real: two network namespaces joined by a veth pair, each "node" its own address,
the ranks joined as a SLURM job's tasks are (codegen.runtime.joined, with GLOO_SOCKET_IFNAME
naming each node's interface, as the manual tells a cluster user); the store is bound to the
address named for rank 0 and nothing listens beyond the nodes' own addresses; the measured rows
are verified. Needs root and `ip netns` (skipped with the reason elsewhere)."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NODES = {"cc54a": ("10.254.54.1", "cc54a0"), "cc54b": ("10.254.54.2", "cc54b0")}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) to make two hosts")
    names = list(NODES)
    try:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            _ip("netns", "add", ns)
        (a, (_, dev_a)), (b, (_, dev_b)) = NODES.items()
        _ip("link", "add", dev_a, "type", "veth", "peer", "name", dev_b)
        for ns, (address, dev) in NODES.items():
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    yield NODES
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.slow
def test_a_two_host_run_binds_to_the_named_interface_and_verifies(two_hosts, tmp_path):
    head = two_hosts["cc54a"][0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, (ns, (_, dev)) in enumerate(two_hosts.items()):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": dev}
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    sys.executable,
                    str(ROOT / "tests" / "two_host_rank.py"),
                    str(rank),
                    head,
                    str(port),
                    str(tmp_path),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=600)[0] for p in procs]
    results = []
    for out in outs:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, out[-3000:]
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    assert all("error" not in r for r in results), results
    lead = results[0]
    assert f"{head}:{port}" in lead["listening"][0]  # the store, on rank 0's named address
    for rank, (address, _) in enumerate(two_hosts.values()):
        # nothing listens on 0.0.0.0 or :: (every interface): only on the node's own address
        assert lead["listening"][rank], lead
        assert all(a.rsplit(":", 1)[0] == address for a in lead["listening"][rank]), lead
    rows = lead["rows"]
    assert {r["schedule"] for r in rows} >= {"baseline", "AR-C"} and len(rows) >= 4
    assert all(r["verified"] for r in rows), rows
    assert all(int(r["nodes"]) == 2 for r in rows), rows
    assert (tmp_path / "results.csv").exists()
