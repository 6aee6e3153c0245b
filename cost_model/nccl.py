"""NCCL's own collective cost model and tuner: (algorithm x protocol) -> time, the fastest picked.

Follows NCCL 2.20.3 (src/graph/tuning.cc: `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`; src/enqueue.cc:
the channels and chunks a call uses; tables transcribed below with their NCCL names), written
afresh. For one call of a collective of `nbytes` (nccl-tests' size: the whole array for
reduce_scatter / all_gather) on `ranks` GPUs over `nodes` nodes of a topology whose `nccl` section
gives NCCL's graph (channels, per-channel bandwidths, NVLS, CollNet):

    time_us  = latency + nbytes / (1000 * bandwidth x used) + pipeline
    latency  = base[algo][proto] + hops x hw latency per link class (NVLink, PCI, network)
    bandwidth (algorithm bandwidth, GB/s) = channels x per-channel bw, capped and scaled per
               protocol (LL: 1/4 of the ring, at most llMaxBw; LL128: 92%, at most a per-channel
               cap; tree: 92% and its own caps), then x nranks/nsteps (ring) or 1/2 (tree,
               CollNet) to turn NCCL's bus bandwidth into the algorithm's. NVLS (all_reduce):
               x 15/16 x n/(n+1) for n GPUs a node: through NVLink SHARP each GPU's port carries
               the whole buffer up (the switch reduces it) and 1/n of it back (the switch
               multicasts each shard), i.e. S (n+1)/n per S reduced, at 15/16 of the channels'
               rate; at n = 8 that is NCCL's own 5/6, and it gives the measured drop to ~370
               GB/s busbw at 4 GPUs (NCCL 2.20's tuner keeps 5/6 at every n).
               NVLS reduce_scatter / all_gather: x 15/16 (the buffer crosses each port once).
               Where the topology gives `ll_bw_gbps` / `ll128_bw_gbps` (fitted: the ring's LL /
               LL128 rate a channel of the graph reaches), a ring's LL / LL128 call runs at most
               at that per channel, though the tuner, as NCCL's, still weighs it with NCCL's
               tables (llMaxBws, perChMaxRingLL128Bws).
    used     = the share of the communicator's channels and threads NCCL runs a small call on
               (enqueue.cc: `while (nBytes < nc*nt*threadThreshold) nc--`, then nt /= 2; the
               communicator has twice the graph's channels, at half the rate each: ncclTopoPostset);
               a call too small for even the fewest threads takes their threshold's time (the
               wire time of nc x nt x threshold bytes: the floor of a small call).
    pipeline = the cost of NCCL's pipeline beyond latency and wire, per algorithm and protocol:
               Simple ring: `slice_us` per slice a channel works through in sequence (NCCL's
               chunks: 512 KiB steps, 4 a chunk in 2 slices for all_reduce / reduce_scatter /
               all_gather, so (nsteps x 2) slices per loop of channels x ranks x 2 MiB; 1 a chunk
               for broadcast / reduce, chained through the ranks);
               NVLS, NVLS tree, CollNet (chunks NCCL sizes by the call, 16 KiB .. 128 KiB for
               NVLS): the fill and drain of a pipeline with optimal chunking, 2 sqrt(wire x
               (2 fill_us + hops net_fill_us)): NVLS's 2 stages in the node, and NVLS tree's
               hops of the inter-node tree up and down (`net_fill_us` each, fitted apart on
               multi-node points);
               LL, LL128 (every 8 / 128 bytes carry their own flag, forwarded as they land) and
               tree (NCCL's own mid-size correction, treeCorrectionFactor): none, NCCL's
               estimate as it stands (the A100 curve's LL128 time is linear in its size).
               `fill_us` and `slice_us` are fitted to published measurements, one value each
               for the whole system (0: NCCL's own linear model).

`pick(kind, nbytes, ranks, nodes, nc, algo, proto)` is the tuner: the (algorithm, protocol) of
least time among those NCCL enables for the collective on that communicator, restricted to a
forced algorithm / protocol where it is available (NCCL_ALGO / NCCL_PROTO; NCCL falls back to
its own choice where a forced one does not apply). `parts(...)` splits one (algorithm, protocol)'s
time into its fixed part and the coefficients of `sqrt(fill_us)` and `slice_us` (the fit's
input). `p2p_us` is a send/recv (NCCL's Simple protocol over the GPU's NVLink channels inside a
node, over its NIC rail across nodes). `ports(per_node, group)` are the DES resources a collective
call holds: every member's switch ports and, across nodes, each node's NIC rails. Units: us, bytes,
GB/s (1e9 B/s). Across nodes, `call` gives the call's flows their share of the NICs through the
fabric's tiers (`cost_model.fabric`; the tuner picks without seeing it, as NCCL's does).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from . import fabric
from .topology import NCCL_ALGOS, PROTOCOLS, Nccl, Topology

TUNED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")  # the tuner's
KINDS = TUNED + ("all_to_all",)  # and NCCL's alltoall: grouped send/recv to every peer (`p2p`)
LL, LL128, SIMPLE = PROTOCOLS

# baseLat [algorithm][LL, LL128, Simple], us
BASE_LAT_US = {
    "tree": (6.8, 14.0, 0.0),
    "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
# hwLat [link class][algorithm][LL, LL128, Simple], us
HW_LAT_US = {
    "nvlink": {
        "tree": (0.6, 1.25, 28.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet_direct": (0, 0, 3.7),
        "collnet_chain": (0, 0, 2.8),
        "nvls": (0, 0, 23.0),
        "nvls_tree": (0, 0, 23.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 28.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet_direct": (0, 0, 3.7),
        "collnet_chain": (0, 0, 2.8),
        "nvls": (0, 0, 0.0),
        "nvls_tree": (0, 0, 0.0),
    },
    "net": {
        "tree": (5.0, 8.5, 28.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet_direct": (0, 0, 31.0),
        "collnet_chain": (0, 0, 30.0),
        "nvls": (0, 0, 18.0),
        "nvls_tree": (0, 0, 14.0),
    },
}
# per-arch tables [Volta, Ampere, Hopper][1 node, 2 nodes, more], GB/s. NCCL 2.20 has no
# Blackwell row: Blackwell takes Hopper's (as later NCCL versions start from).
ARCH_INDEX = {"volta": 0, "ampere": 1, "hopper": 2, "blackwell": 2}
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))  # llMaxBws
RING_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
TREE_LL128_PER_CH = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
TREE_PER_CH = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# treeCorrectionFactor [protocol][log2(bytes / 64)], 64 B .. 256 MiB
TREE_CORRECTION = {
    LL: (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    LL128: (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
    ),
    SIMPLE: (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
    ),
}
# which algorithms NCCL runs each collective with (ncclTopoTuneModel's `continue`s)
# enqueue.cc / device headers: threads and per-thread work before a call takes another channel
MAX_CHANNELS = 32  # MAXCHANNELS
MAX_THREADS = {LL: 512, LL128: 640, SIMPLE: 512}  # NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS
THREAD_THRESHOLD = {LL: 8, LL128: 8, SIMPLE: 64}  # NCCL_*_THREAD_THRESHOLD (ring LL: x nranks)
SIMPLE_STEP_BYTES = (4 << 20) // 8  # DEFAULT_BUFFSIZE / NCCL_STEPS
CHUNK_STEPS = {"all_reduce": 4, "reduce_scatter": 4, "all_gather": 4, "broadcast": 1, "reduce": 1}
SLICE_STEPS = {"all_reduce": 2, "reduce_scatter": 2, "all_gather": 2, "broadcast": 1, "reduce": 1}
NVLS_PROTOCOL = 15 / 16  # NVLS's share of its channels' rate: 5/6 = 15/16 x 8/9 at 8 GPUs
ALGOS_FOR = {
    "all_reduce": NCCL_ALGOS,
    "reduce_scatter": ("ring", "nvls", "collnet_direct"),
    "all_gather": ("ring", "nvls", "collnet_direct"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("p2p",),
}


@dataclass(frozen=True)
class Call:
    """The tuner's pick for one call: algorithm, protocol and its time split."""

    algo: str
    proto: str
    time_us: float
    latency_us: float
    bandwidth_gbps: float  # the algorithm bandwidth (bytes / wire time)

    @property
    def label(self) -> str:
        return f"{self.algo}/{self.proto}"


def applies(kind: str, library: bool, topo: Topology) -> bool:
    """NCCL runs this collective on this topology (a GPU topology, not the CPU runtime's)."""
    return topo.nccl is not None and not library and kind in KINDS


def communicator(topo: Topology, group) -> tuple[int, int]:
    """(ranks, nodes) of the communicator over `group` (global ranks)."""
    return len(group), len({r // topo.devices_per_node for r in group})


def enabled(kind: str, ranks: int, nodes: int, nc: Nccl) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL enables for the collective on this communicator."""
    if kind == "all_to_all":
        return [("p2p", SIMPLE)]
    out = []
    for algo in ALGOS_FOR[kind]:
        if algo == "nvls" and not (nc.nvls and nodes == 1):  # no NVLS across nodes w/o CollNet
            continue
        if algo == "nvls_tree" and not (nc.nvls and nodes > 1):
            continue
        if algo.startswith("collnet") and not (nc.collnet and nodes > 1):
            continue
        if algo in ("collnet_direct",) and kind != "all_reduce":
            continue  # CollNet reduce_scatter / all_gather need a 1:1 GPU:NIC plugin path
        protos = (SIMPLE,) if algo.startswith(("nvls", "collnet")) else PROTOCOLS
        out += [(algo, p) for p in protos]
    return out


def _steps(kind: str, ranks: int, nodes: int) -> tuple[int, int]:
    """(nsteps, nInterSteps) of a ring."""
    if kind == "all_reduce":
        return 2 * (ranks - 1), (2 * nodes if nodes > 1 else 0)
    if kind in ("reduce_scatter", "all_gather"):
        return ranks - 1, nodes - 1
    return ranks, nodes


def bandwidth_gbps(kind: str, algo: str, proto: str, ranks: int, nodes: int, nc: Nccl) -> float:
    """NCCL's algorithm bandwidth (comm->bandwidths) of (algo, proto), GB/s."""
    ai, n2 = ARCH_INDEX[nc.arch], min(nodes, 3) - 1
    ll_max = LL_MAX_BW[ai if nodes == 1 else 0][n2]  # across nodes: the (Intel) host's row
    ppn = ranks / nodes
    collnet = algo.startswith("collnet")
    # across nodes NCCL's graph runs each channel at the NIC's share (its search gives the
    # channels of a multi-node graph bwIntra = bwInter), so one node's bandwidth is bw_intra's
    bw = nc.bw_intra_gbps if nodes == 1 or collnet else nc.bw_inter_gbps
    # a tree over 2 nodes: its graph's bwIntra, which the tuner takes at <= 2 nodes and which
    # search.cc raises for trees (2 nodes, CollNet) up to 2x bwInter
    if algo == "tree" and nodes == 2:
        bw = min(nc.bw_intra_gbps, 2 * nc.bw_inter_gbps)
    channels = nc.channels
    if algo == "nvls":
        bw, channels = nc.nvls_bw_gbps, nc.nvls_channels
    elif algo == "nvls_tree":
        inter = nc.bw_inter_gbps * nc.channels / nc.nvls_channels
        bw = min(nc.nvls_bw_gbps, inter if nodes <= 2 else inter / 2)
        channels = nc.nvls_channels
    bus = channels * bw
    if algo == "ring" and proto == LL:
        bus = min(ll_max, bus * (0.25 if nodes > 1 or kind in ("all_reduce", "reduce") else 1 / 3))
    if algo == "ring" and proto == LL128:
        bus = min(bus * (0.7 if ppn < 2 else 0.92), channels * RING_LL128_PER_CH[ai][n2])
    if algo == "tree":
        bus = min(bus * 0.92, channels * TREE_PER_CH[ai][n2])
        if proto == LL:
            bus = min(bus / 3.8, ll_max)
        if proto == LL128:
            bus = min(
                bus * (7 / 9 if nodes == 1 else 120 / 128), channels * TREE_LL128_PER_CH[ai][n2]
            )
    if algo == "collnet_direct":
        factor = ppn / channels  # GPUs per NIC
        bus = bus / (factor - (factor - 1) / 2) * (0.85 if ai >= 2 else 1.0)
    if algo == "ring":
        nsteps = _steps(kind, ranks, nodes)[0]
        return bus * ranks / nsteps
    if algo.startswith("nvls"):
        return bus * NVLS_PROTOCOL * (ppn / (ppn + 1) if kind == "all_reduce" else 1.0)
    return bus * 0.5


def latency_us(kind: str, algo: str, proto: str, ranks: int, nodes: int, nc: Nccl) -> float:
    """NCCL's latency (comm->latencies) of (algo, proto), us."""
    p = PROTOCOLS.index(proto)
    intra = HW_LAT_US[nc.intra_link][algo][p]
    inter = HW_LAT_US["net"][algo][p]
    ppn = ranks // nodes
    lat = BASE_LAT_US[algo][p]
    if algo == "ring":
        nsteps, inter_steps = _steps(kind, ranks, nodes)
        if kind in ("broadcast", "reduce"):  # rings of one order on every channel: one hop
            return lat + (intra if nodes == 1 else inter)
        overhead = nc.net_overhead_us * (3 if proto == SIMPLE else 1) if nodes > 1 else 0.0
        return lat + (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
    log_nodes = int(math.log2(nodes))
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + log_nodes * inter)
    if algo == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algo == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    return lat + intra + 2 * log_nodes * inter  # nvls_tree


def depth(kind: str, algo: str, ranks: int, nodes: int) -> tuple[int, int]:
    """Pipeline stages a chunk of NVLS / CollNet goes through (the fill term's depth): (inside
    the node: up to the switch and back; across nodes: NVLS tree's hops of the inter-node tree,
    up and down, each paced by `net_fill_us` rather than `fill_us`)."""
    if algo == "nvls_tree":
        return 2, 2 * int(math.log2(nodes))
    return 2, 0


def comm_channels(nc: Nccl) -> int:
    """The communicator's channels: the graph's, duplicated (ncclTopoPostset), at most 32."""
    return min(MAX_CHANNELS, 2 * nc.channels)


def used(
    kind: str, algo: str, proto: str, nbytes: float, ranks: int, nc: Nccl
) -> tuple[int, float, float]:
    """(channels, share of the communicator's bandwidth, bytes' worth of time) of a call
    (enqueue.cc: a small call drops channels, then halves its threads, until each thread has its
    threshold's bytes; below the last halving a thread still takes its threshold's time, so a
    call's wire time is at least that of channels x threads x threshold bytes)."""
    if algo.startswith(("nvls", "collnet")):
        return (nc.nvls_channels if algo.startswith("nvls") else comm_channels(nc)), 1.0, nbytes
    full = comm_channels(nc)
    n, nt = full, MAX_THREADS[proto]
    threshold = THREAD_THRESHOLD[proto] * (ranks if algo == "ring" and proto == LL else 1)
    while nbytes < n * nt * threshold:
        if n >= 2:
            n -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    return n, (n / full) * (nt / MAX_THREADS[proto]), max(nbytes, n * nt * threshold)


def slices(kind: str, nbytes: float, ranks: int, nodes: int, channels: int) -> int:
    """The Simple ring's slices one channel works through in sequence (its chunks: enqueue.cc,
    all_reduce.h / all_gather.h / reduce_scatter.h / broadcast.h's loops)."""
    chunk = SIMPLE_STEP_BYTES * CHUNK_STEPS[kind]
    per_chunk = CHUNK_STEPS[kind] // SLICE_STEPS[kind]
    if kind in ("broadcast", "reduce"):  # a chain through the ranks, chunk after chunk
        loops = max(1, math.ceil(nbytes / (channels * chunk)))
        return loops * per_chunk + ranks - 2
    loops = max(1, math.ceil(nbytes / (channels * ranks * chunk)))
    return loops * _steps(kind, ranks, nodes)[0] * per_chunk


def estimate(
    kind: str, nbytes: float, algo: str, proto: str, ranks: int, nodes: int, nc: Nccl
) -> tuple[float, float]:
    """NCCL's own estimate (ncclTopoGetAlgoTime): (latency us, bandwidth GB/s), the tree's
    correction and the multi-node ring's plateau applied; the tuner compares lat + bytes / bw."""
    bw = bandwidth_gbps(kind, algo, proto, ranks, nodes, nc)
    lat = latency_us(kind, algo, proto, ranks, nodes, nc)
    log_size = int(math.log2(max(nbytes, 64) / 64))
    if algo == "tree" and log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if (
        algo == "ring"
        and proto == SIMPLE
        and nodes > 1
        and kind == "all_reduce"
        and nbytes / (nc.channels * ranks) >= 64
    ):
        lat *= 1.9 if nc.arch == "volta" else 1.4  # the ring's plateau
    return lat, bw


def parts(
    kind: str, nbytes: float, algo: str, proto: str, ranks: int, nodes: int, nc: Nccl
) -> tuple[float, float, float, float, float]:
    """(fixed us, wire us of the fill (0: none), coefficient of slice_us, latency, bandwidth):
    time_us = fixed + fill (`fill_us_of`) + b slice_us, the bandwidth the one the call reaches."""
    lat, bw = estimate(kind, nbytes, algo, proto, ranks, nodes, nc)
    rate = {LL: nc.ll_bw_gbps, LL128: nc.ll128_bw_gbps}.get(proto) if algo == "ring" else None
    if rate:  # the ring's measured LL / LL128 rate per graph channel, where fitted
        bw = min(bw, nc.channels * rate * ranks / _steps(kind, ranks, nodes)[0])
    channels, share, work = used(kind, algo, proto, nbytes, ranks, nc)
    bw *= share
    wire = work / (1000.0 * bw)
    if algo == "ring" and proto == SIMPLE:
        return lat + wire, 0.0, float(slices(kind, nbytes, ranks, nodes, channels)), lat, bw
    if algo.startswith(("nvls", "collnet")):  # chunks NCCL sizes by the call: a fill
        return lat + wire, wire, 0.0, lat, bw
    return lat + wire, 0.0, 0.0, lat, bw  # LL, LL128, tree: NCCL's estimate as it stands


def alltoall(nbytes: float, ranks: int, nodes: int, nc: Nccl) -> Call:
    """NCCL's alltoall of `nbytes` a rank (nccl-tests' size): a send and a receive of
    nbytes / ranks with every peer at once, over the GPU's NVLink channels to the peers on its
    node (channels x bw_intra) and over its share of the node's NICs to the others (channels x
    bw_inter / GPUs a node), the two at the same time; the latency of one Simple hop (and of the
    network's, across nodes)."""
    ppn = ranks // nodes
    lat = BASE_LAT_US["ring"][2] + HW_LAT_US[nc.intra_link]["ring"][2]
    if nodes > 1:
        lat += HW_LAT_US["net"]["ring"][2]
    intra = nbytes * (ppn - 1) / ranks / (1000.0 * nc.channels * nc.bw_intra_gbps)
    inter = nbytes * (ranks - ppn) / ranks / (1000.0 * nc.channels * nc.bw_inter_gbps / ppn)
    wire = max(intra, inter)
    return Call("p2p", SIMPLE, lat + wire, lat, nbytes / (1000.0 * wire) if wire > 0 else math.inf)


def time_us(
    kind: str, nbytes: float, algo: str, proto: str, ranks: int, nodes: int, nc: Nccl
) -> Call:
    """One call's time: NCCL's estimate (ncclTopoGetAlgoTime) at the channels the call uses,
    plus its pipeline's cost (the fill, or the Simple ring's slices)."""
    if kind == "all_to_all":
        return alltoall(nbytes, ranks, nodes, nc)
    fixed, wire, b, lat, bw = parts(kind, nbytes, algo, proto, ranks, nodes, nc)
    return Call(
        algo,
        proto,
        fixed + fill_us_of(kind, algo, ranks, nodes, wire, nc) + b * nc.slice_us,
        lat,
        bw,
    )


def fill_us_of(kind: str, algo: str, ranks: int, nodes: int, wire: float, nc: Nccl) -> float:
    """The fill and drain of a pipeline of optimal chunking over `wire` us: 2 sqrt(wire x the
    stages' fill), the node's stages at `fill_us` each, the network's at `net_fill_us` (NVLS
    tree across nodes; `fill_us` where the topology gives none)."""
    if wire <= 0:
        return 0.0
    inside, across = depth(kind, algo, ranks, nodes)
    net = nc.net_fill_us if nc.net_fill_us is not None else nc.fill_us
    return 2.0 * math.sqrt(wire * (inside * nc.fill_us + across * net))


def candidates(
    kind: str,
    ranks: int,
    nodes: int,
    nc: Nccl,
    algo: Optional[str] = None,
    proto: Optional[str] = None,
) -> list[tuple[str, str]]:
    """The pairs the tuner chooses among: NCCL's enabled ones, within a forced algorithm /
    protocol where the collective has it."""
    pairs = enabled(kind, ranks, nodes, nc)
    if algo and any(a == algo for a, _ in pairs):
        pairs = [(a, p) for a, p in pairs if a == algo]
    if proto and any(p == proto for _, p in pairs):
        pairs = [(a, p) for a, p in pairs if p == proto]
    return pairs


@lru_cache(maxsize=65536)
def pick(
    kind: str,
    nbytes: float,
    ranks: int,
    nodes: int,
    nc: Nccl,
    algo: Optional[str] = None,
    proto: Optional[str] = None,
) -> Call:
    """The tuner: the enabled (algorithm, protocol) of least estimate (NCCL's lat + bytes / bw),
    within a forced algorithm / protocol where the collective has it; the call's time is then
    what it takes (`time_us`: at the channels it uses, with its pipeline's cost)."""
    if kind == "all_to_all":
        return alltoall(nbytes, ranks, nodes, nc)

    def nccl_us(pair):
        lat, bw = estimate(kind, nbytes, pair[0], pair[1], ranks, nodes, nc)
        return lat + nbytes / (1000.0 * bw)

    a, p = min(candidates(kind, ranks, nodes, nc, algo, proto), key=nccl_us)
    return time_us(kind, nbytes, a, p, ranks, nodes, nc)


def call(kind: str, nbytes: float, group, topo: Topology, algo: Optional[str] = None) -> Call:
    """The call NCCL makes for `nbytes` over `group` on `topo` (the topology's forced algo /
    proto, or `algo` where given, else the tuner's)."""
    ranks, nodes = communicator(topo, group)
    forced = algo or topo.algo or (topo.algorithm if topo.algorithm in NCCL_ALGOS else None)
    if ranks == 1:
        return Call("none", SIMPLE, 0.0, 0.0, math.inf)
    made = pick(kind, float(nbytes), ranks, nodes, topo.nccl, forced, topo.proto)
    share = fabric.share(topo, fabric.pattern_of(made.algo), nodes) if nodes > 1 else 1.0
    if share < 1.0:  # the tuner does not see the fabric; the call's flows get its share
        slowed = dataclasses.replace(topo.nccl, bw_inter_gbps=topo.nccl.bw_inter_gbps * share)
        return time_us(kind, float(nbytes), made.algo, made.proto, ranks, nodes, slowed)
    return made


def p2p_us(topo: Topology, src: int, dst: int, nbytes: float) -> float:
    """A send/recv of nbytes (NCCL's Simple protocol): inside a node over the GPU's NVLink
    channels, across nodes over its NIC rail (the node's NIC bandwidth shared by its rails)."""
    nc = topo.nccl
    if topo.node_of(src) == topo.node_of(dst):
        lat = BASE_LAT_US["ring"][2] + HW_LAT_US[nc.intra_link]["ring"][2]
        return lat + nbytes / (1000.0 * nc.channels * nc.bw_intra_gbps)
    nics = topo.inter.nics if topo.inter else 1
    lat = BASE_LAT_US["ring"][2] + HW_LAT_US["net"]["ring"][2]
    return lat + nbytes / (1000.0 * nc.channels * nc.bw_inter_gbps / nics)


def p2p_ports(topo: Topology, src: int, dst: int) -> list[tuple]:
    if topo.node_of(src) == topo.node_of(dst):
        return [("out", src), ("in", dst)]
    return [
        ("nic_out", topo.node_of(src), topo.rail_of(src)),
        ("nic_in", topo.node_of(dst), topo.rail_of(dst)),
    ]


def ports(per_node: int, group) -> list[tuple]:
    """The DES resources one collective call over `group` holds (`per_node` devices a node)."""
    keys = [k for r in group for k in (("out", r), ("in", r))]
    nodes = sorted({r // per_node for r in group})
    if len(nodes) > 1:
        keys += [k for n in nodes for k in (("rails_out", n), ("rails_in", n))]
    return keys
