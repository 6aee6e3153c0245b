"""The network between nodes as NCCL's collectives load it: a rail-optimized fat tree of tiers.

A topology's `inter.tiers` lists the fabric's tiers, leaves first: a switch of tier t joins
`nodes` nodes on each rail (a leaf's 32, a pod's 512, ...; rail-optimized: NIC k of every node
hangs off rail k's switches) and its downlinks carry `oversubscription` times its uplinks. A
call over `n` nodes (consecutive, as a job's ranks are placed) sends out of each group of
g = tier.nodes nodes, per rail and direction, `crossing` NIC-rates of traffic, against a
capacity of g / oversubscription NIC-rates:

    ring (any ring-based call)   1              the ring leaves each group once per channel
    tree, nvls_tree, collnet     2              NCCL's two binary trees, one edge out each
    p2p (alltoall)               g (n - g) / n  every node's traffic to the nodes outside

`share(topo, pattern, n)` = min over the tiers the call spans (n > g) of min(1, capacity /
crossing): the factor on the NIC rate a flow through the fabric gets (1 for rings and trees on
any fat tree whose groups outnumber their oversubscription; about 1 / oversubscription for an
alltoall across tiers). `tiers(topo, pattern, n)` gives the rows of that breakdown: per tier
its nodes, oversubscription, crossing load, capacity and share. A topology without tiers is
non-blocking (share 1). Units: NIC-rates (one NIC's bandwidth per direction).
"""

from __future__ import annotations

from dataclasses import dataclass

from .topology import Topology

PATTERNS = ("ring", "tree", "p2p")


@dataclass(frozen=True)
class TierLoad:
    tier: int  # 0: the leaves
    nodes: int  # nodes a switch of the tier joins, on each rail
    oversubscription: float
    crossing: float  # NIC-rates leaving a group, per rail and direction
    capacity: float  # NIC-rates its uplinks carry
    share: float  # min(1, capacity / crossing)


def pattern_of(algo: str) -> str:
    """The traffic pattern of an NCCL algorithm across nodes."""
    if algo == "p2p":
        return "p2p"
    return "ring" if algo == "ring" else "tree"


def _crossing(pattern: str, group: int, nodes: int) -> float:
    if pattern == "p2p":
        return group * (nodes - group) / nodes
    return 1.0 if pattern == "ring" else 2.0


def tiers(topo: Topology, pattern: str, nodes: int) -> list[TierLoad]:
    """Per tier the call over `nodes` nodes spans: its load and share (see the module)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r}: must be one of {', '.join(PATTERNS)}")
    out = []
    for k, t in enumerate(topo.inter.tiers if topo.inter else []):
        if nodes <= t.nodes:
            break
        crossing = _crossing(pattern, t.nodes, nodes)
        capacity = t.nodes / t.oversubscription
        out.append(
            TierLoad(
                k, t.nodes, t.oversubscription, crossing, capacity, min(1.0, capacity / crossing)
            )
        )
    return out


def share(topo: Topology, pattern: str, nodes: int) -> float:
    """The factor on the NIC rate a call's flows across nodes get (1: non-blocking)."""
    return min((t.share for t in tiers(topo, pattern, nodes)), default=1.0)


def describe(topo: Topology, nodes: int) -> str:
    """One line for a report: the fabric's tiers and what each pattern gets of the NICs over
    `nodes` nodes ("" for a topology without tiers or a call inside one node)."""
    if nodes < 2 or topo.inter is None or not topo.inter.tiers:
        return ""
    tiers_text = ", ".join(
        f"{t.nodes} nodes a switch {t.oversubscription:g}:1" for t in topo.inter.tiers
    )
    shares = ", ".join(
        f"{name} x{share(topo, pattern, nodes):.2f}"
        for name, pattern in (("rings", "ring"), ("trees", "tree"), ("alltoall", "p2p"))
    )
    return (
        f"fabric: {nodes} nodes on a rail-optimized fat tree ({tiers_text}, leaves first); "
        f"the NICs' rate a call's flows get through it: {shares}"
    )
