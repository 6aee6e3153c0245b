"""Topologies: every shipped file loads, and a bad value fails at load naming its field (pure)."""

from __future__ import annotations

import copy

import pytest
import yaml

from cost_model.topology import (
    CONF_TOPOLOGY_DIR,
    Topology,
    TopologyError,
    dump_topology,
    interpolate,
    load_topology,
)
from suite.cli import prevalidate
from suite.config import topology_of
from suite.errors import SuiteError

NAMES = sorted(p.stem for p in CONF_TOPOLOGY_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", NAMES)
def test_every_topology_loads(name):
    t = load_topology(name)
    assert t.name == name and t.devices >= 4  # ABCI's V nodes hold 4
    assert t.device.memory_bandwidth_gbps > 0 and t.intra.link.bandwidth_gbps > 0


def test_dgx2_is_the_papers_cluster_and_nodes_override():
    assert load_topology("dgx2").devices == 256
    assert load_topology("dgx2", nodes=1).devices == 16
    assert topology_of(prevalidate(["topology=dgx2", "topology.nodes=2"])).devices == 32


def test_every_figure_cites_its_source():
    for path in CONF_TOPOLOGY_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if any(k in line for k in ("bandwidth_gbps:", "peak_tflops:", "latency_us:")):
                assert "#" in line, f"{path.name}: no source for {line.strip()!r}"


def _base() -> dict:
    return yaml.safe_load((CONF_TOPOLOGY_DIR / "dgx2.yaml").read_text())


def _set(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    node, *rest = dotted.split(".")
    cur = d
    for key in dotted.split(".")[:-1]:
        cur = cur[key]
    last = dotted.split(".")[-1]
    if value is _DELETE:
        del cur[last]
    else:
        cur[last] = value
    return d


_DELETE = object()
BAD = [
    ("intra.link.bandwidth_gbps", -1, "topology.intra.link.bandwidth_gbps=-1"),
    ("intra.link.bandwidth_gbps", 0, "must be > 0"),
    ("intra.link.latency_us", "fast", "topology.intra.link.latency_us='fast': must be a number"),
    ("device.peak_tflops", {"f16": -3}, "topology.device.peak_tflops['f16']"),
    ("device.memory_efficiency", {1024: 1.5}, "fractions in (0, 1]"),
    ("intra.kind", "torus", "topology.intra.kind='torus': must be one of switch, mesh, bus"),
    ("intra.speed", 3, "topology.intra.speed: unknown key"),
    ("nodes", 0, "topology.nodes=0: must be >= 1"),
    ("nodes", 2.5, "topology.nodes=2.5: must be an integer"),
    ("devices_per_node", _DELETE, "topology.devices_per_node: missing"),
    ("inter", None, "several nodes need an inter section"),
    ("compute_slowdown", 1.0, "topology.compute_slowdown=1.0: must be <= 0.95"),
    ("algorithm", "butterfly", "topology.algorithm='butterfly'"),
    ("library_kinds", ["all_reduce"], "no library link class"),
    ("ring_work_on_compute", "yes", "must be true or false"),
    ("device.inplace_write_weight", 1.5, "topology.device.inplace_write_weight=1.5: must be <= 1"),
    ("device.inplace_write_weight", -0.1, "inplace_write_weight=-0.1: must be >= 0"),
    ("alone_scale", 0.0, "topology.alone_scale=0.0: must be >= 0.25"),
    ("alone_scale", 5.0, "topology.alone_scale=5.0: must be <= 4"),
    ("cores", 0, "topology.cores=0: must be >= 1"),
]


@pytest.mark.parametrize(
    "key,value,expected",
    BAD,
    ids=[f"{b[0]}={'<deleted>' if b[1] is _DELETE else b[1]}" for b in BAD],
)
def test_bad_values_fail_with_their_name(key, value, expected):
    with pytest.raises(TopologyError) as info:
        Topology.from_dict(_set(_base(), key, value))
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_a_bad_mesh_is_refused():
    d = yaml.safe_load((CONF_TOPOLOGY_DIR / "dgx1_v100.yaml").read_text())
    with pytest.raises(TopologyError, match=r"topology.intra.mesh\[0\]"):
        Topology.from_dict(_set(d, "intra.mesh", [[0, 9, 1]]))


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["topology.intra.link.bandwidth_gbps=-1"], "bandwidth_gbps=-1.0: must be > 0"),
        (["topology.device.launch_us=abc"], "launch_us=abc"),
        (["topology.intra.typo=1"], "typo"),
        (["topology.path=/nonexistent/topology.yaml"], "not found"),
    ],
)
def test_bad_topology_overrides_are_one_line(argv, expected):
    with pytest.raises(SuiteError) as info:
        prevalidate(argv)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_dumped_topology_loads_back(tmp_path):
    t = load_topology("dgx1_v100")
    path = dump_topology(t, tmp_path / "t.yaml", header="test")
    assert load_topology(path=path) == t
    cfg = prevalidate(["topology=local", f"topology.path={path}"])
    assert topology_of(cfg) == t


def test_interpolation_is_log_linear_and_clamped():
    pts = {1024: 0.2, 4096: 0.6}
    assert interpolate(pts, 10) == 0.2 and interpolate(pts, 1 << 20) == 0.6
    assert interpolate(pts, 2048) == pytest.approx(0.4)
    assert interpolate({}, 123) == 1.0


def test_a_moved_key_says_where_it_went():
    """A topology written before 1a0f2c8 (`peer_memory_gbps` at the top level) is refused with
    the field's new place, not as an unknown key."""
    d = load_topology("local").to_dict()
    d["peer_memory_gbps"] = 32.0
    with pytest.raises(
        TopologyError,
        match=r"^topology\.peer_memory_gbps: moved to "
        r"topology\.device\.stream_memory_gbps",
    ):
        Topology.from_dict(d)
