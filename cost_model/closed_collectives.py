"""The closed-form (alpha-beta) model of the collectives: the DES's oracle (whole schedules:
`closed_form`).

On a topology with an `nccl` section, a collective NCCL runs is C NCCL calls of nbytes / C each,
one after the other: C x `cost_model.nccl`'s time of the call (the DES holds the same ports for
the same time), and `choose` is NCCL's tuner (`nccl.pick`: the algorithm and protocol of least
time, or the topology's forced `algo` / `proto`); a P2P is `nccl.p2p_us`. Otherwise (CPU ranks):

Every hop costs what the DES charges an uncontended message: it holds its route for `overhead +
bytes / (bandwidth * efficiency(bytes))` and arrives `latency` later (`network.hop_us`). A
collective of C chunks is a pipeline:
    time = L1 + (C - 1) * bottleneck
where L1 is the first chunk's critical path and the bottleneck is the busiest resource's time per
chunk (a rank's port, a NIC, or its compute stream when a CPU ring adds on it):
- ring (P members, steps = P-1 per phase): L1 = the longest run of `steps` consecutive hops (plus
  the adds and the own-chunk copy of `ring_work_on_compute`), but no less than the busiest
  resource's time for `steps` ring steps (a port: one message per step; a bus: all P);
  bottleneck = that resource's time per chunk; C chunks take the most of L1, the busiest
  resource's C chunks plus one latency (the chunks behind hide the others'), and the compute
  stream's C chunks of work;
- tree: per tree, the reduce and broadcast critical paths through it; bottleneck = the most loaded
  port over both trees;
- hierarchical: the sum of its phases' L1 (a NIC shared by k devices counts k hops per step);
  bottleneck = the busier of the intra-node ports and the NICs;
- chain / direct: the path through the chain / every rank's sends through its port.
Where nothing contends these are the DES's times (tested within 2%); where streams share links
(fused steps, overlap) they are estimates. `choose(spec, topo)` is the tuner: the algorithm with
the lowest estimate (as NCCL's tuner picks, `src/graph/tuning.cc`), or the topology's forced one.
Units: microseconds, bytes.
"""

from __future__ import annotations

from .collectives import (
    CollSpec,
    applicable,
    by_node,
    chain_parents,
    double_trees,
    nccl_call,
    uses_nccl,
)
from .network import hop
from .topology import Topology

_CHOICE: dict = {}


def collective_us(spec: CollSpec, algorithm: str, topo: Topology) -> float:
    if uses_nccl(spec, topo):
        return spec.chunks * nccl_call(spec, topo, algorithm).time_us if spec.P > 1 else 0.0
    shm = shm_all_reduce_us(spec, topo)
    if shm is not None:
        return shm
    shape = _shape(spec, algorithm, topo)
    if len(shape) == 3:  # a ring knows its chunked time
        return shape[2]
    L1, bottleneck = shape
    return L1 + (spec.chunks - 1) * bottleneck


def copy_bytes(nbytes: float, write_allocate: bool) -> float:
    """The memory traffic of copying nbytes into lines the copy has not read: the read, the
    write and, on a `write_allocate` device, the destination's line read before it is written."""
    return nbytes * (3 if write_allocate else 2)


def shm_all_reduce_bytes(nbytes: float, P: int, write_allocate: bool) -> float:
    """The memory traffic per member of comm=shm's all-reduce of nbytes
    (`codegen.runtime.shm_comm.ShmComm.all_reduce`), in slices s = nbytes / P: it copies its
    peers' P-1 slices into its slot, reduces its own slice in place (P-1 passes of an add that
    reads two slices and writes one), copies the result into its slot and copies its peers' P-1
    reduced slices out of theirs. A copy reads, writes and, on a `write_allocate` device, reads
    the destination's line first (3 s; 2 s without): (2 copy + 3)(P-1) s + copy s."""
    copy = copy_bytes(1, write_allocate)
    return nbytes / P * ((2 * copy + 3) * (P - 1) + copy)


def shm_all_reduce_us(spec: CollSpec, topo: Topology):
    """comm=shm's library all-reduce as what it is, memory traffic on each member at the
    device's `stream_memory_gbps` (every rank streaming at once) plus the library link's fixed
    cost per call (its flags and Python: `latency_us` + `overhead_us`), per chunk; None where
    the topology does not share memory that way (`peer_reads` with a calibrated rate)."""
    rate = topo.device.stream_memory_gbps
    if not (
        topo.peer_reads
        and rate
        and spec.library
        and topo.library
        and spec.kind == "all_reduce"
        and spec.P > 1
    ):
        return None
    lib, calls = topo.library, spec.chunks
    traffic = shm_all_reduce_bytes(spec.nbytes / calls, spec.P, topo.device.write_allocate)
    return calls * (lib.latency_us + lib.overhead_us + traffic / (rate * 1e3))


def choose(spec: CollSpec, topo: Topology) -> str:
    """The algorithm the tuner runs for this collective (the topology's forced one if it applies)."""
    key = (id(topo), spec)
    if key in _CHOICE and _CHOICE[key][0] is topo:
        return _CHOICE[key][1]
    algos = applicable(spec, topo)
    if uses_nccl(spec, topo):
        pick = nccl_call(spec, topo).algo
    elif topo.algorithm in algos:
        pick = topo.algorithm
    else:
        pick = min(algos, key=lambda a: collective_us(spec, a, topo))
    if len(_CHOICE) > 100_000:
        _CHOICE.clear()
    _CHOICE[key] = (topo, pick)
    return pick


def _work_us(topo: Topology, spec: CollSpec, b: float, reads: int) -> float:
    """A ring's add (reads=2) or copy (reads=1) of b bytes on the compute stream."""
    return topo.device.elementwise_us((reads + 1) * b)


def _shape(spec: CollSpec, algorithm: str, topo: Topology) -> tuple[float, float]:
    S, P, C = spec.nbytes, spec.P, spec.chunks
    link = topo.library if spec.library else None
    work = topo.ring_work_on_compute and not spec.library
    if P == 1:  # the CPU runtime's ring of one still copies its input into its output
        if not (work and algorithm == "ring"):
            return 0.0, 0.0
        if spec.kind == "reduce_scatter":  # whole, at its start
            return _work_us(topo, spec, S, 1), 0.0
        copy = _work_us(topo, spec, S / C, 1) if spec.kind == "all_gather" else 0.0
        return copy, copy  # chunk by chunk
    if algorithm == "ring":
        phases = {"all_reduce": ("rs", "ag"), "reduce_scatter": ("rs",), "all_gather": ("ag",)}[
            spec.kind
        ]
        return _ring(topo, spec, spec.group, S / P / C, phases, link, work, True, C=C)
    if algorithm == "hierarchical":
        return _hierarchical(topo, spec, S / C)
    if algorithm == "tree":
        return _trees(topo, double_trees(topo, spec.group), S / 2 / C, link, True, True, spec)
    if algorithm == "chain":
        kind = spec.kind
        return _trees(
            topo, [chain_parents(spec)], S / C, link, kind == "reduce", kind == "broadcast", spec
        )
    if algorithm == "direct":
        load: dict = {}
        for r in spec.group:
            for peer in spec.group:
                if peer != r:
                    keys, cls, scale = hop(topo, r, peer, link)
                    for k in keys:
                        load[k] = (
                            load.get(k, 0.0)
                            + cls.overhead_us
                            + cls.wire_us(S / P / C, spec.whole(S / P / C)) / scale
                        )
        worst = max(load.values())
        return worst + cls.latency_us, worst
    raise ValueError(f"unknown algorithm {algorithm!r}")


class _Edges:
    """The size-independent shape of a set of messages (src, dst) on a topology: their distinct
    link classes, and for every resource the count of messages of each class through it (so a
    closed-form evaluation costs a few link-class evaluations, not one per rank)."""

    def __init__(self, topo: Topology, pairs, link, channels: bool):
        self.classes: list = []
        self.edge_class: list[int] = []
        loads: dict = {}
        index: dict = {}
        for src, dst in pairs:
            keys, cls, scale = hop(topo, src, dst, link, channels)
            k = index.setdefault((id(cls), scale), len(self.classes))
            if k == len(self.classes):
                self.classes.append((cls, scale))
            self.edge_class.append(k)
            for key in keys:
                loads.setdefault(key, []).append(k)
        n = len(self.classes)
        vec = {tuple(sum(1 for c in ks if c == j) for j in range(n)) for ks in loads.values()}
        self.load_vectors = list(vec)
        self.windows: dict[int, list] = {}

    def times(self, b: float, posted: bool = False, whole: float | None = None):
        """(busy, latency) of one message of b bytes (a chunk of a `whole`-byte transfer), per
        class (`posted`: without the overhead, which the sender's compute stream pays)."""
        return [
            ((0.0 if posted else cls.overhead_us) + cls.wire_us(b, whole) / scale, cls.latency_us)
            for cls, scale in self.classes
        ]

    def overhead(self) -> float:
        return max(cls.overhead_us for cls, _ in self.classes)

    def busiest(self, busy: list[float]) -> float:
        return max(sum(c * t for c, t in zip(v, busy)) for v in self.load_vectors)

    def window(self, n: int, per: list[float]) -> float:
        """The largest sum of n consecutive edges' times around the ring (edges in order)."""
        if n not in self.windows:
            m = len(self.edge_class)
            ext = self.edge_class * (n // m + 2)
            vecs = set()
            for j in range(m):
                counts = [0] * len(self.classes)
                for c in ext[j : j + n]:
                    counts[c] += 1
                vecs.add(tuple(counts))
            self.windows[n] = list(vecs)
        return max(sum(c * t for c, t in zip(v, per)) for v in self.windows[n])


_EDGES: dict = {}


def _edges(topo: Topology, pairs: tuple, link, channels: bool) -> _Edges:
    key = (id(topo), pairs, id(link), channels)
    hit = _EDGES.get(key)
    if hit is None or hit[0] is not topo:
        if len(_EDGES) > 10_000:
            _EDGES.clear()
        hit = _EDGES[key] = (topo, _Edges(topo, pairs, link, channels))
    return hit[1]


def _ring(topo, spec, members, b, phases, link, work, channels, share: float = 1.0, C: int = 1):
    """(L1, bottleneck per chunk, time of C chunks) of a ring: C chunks either pace the busiest
    port (n C messages, one latency: the chunks behind hide the others) or the compute stream,
    or take the first chunk's path."""
    n_m = len(members)
    pairs = tuple((members[i], members[(i + 1) % n_m]) for i in range(n_m))
    edges = _edges(topo, pairs, link, channels)
    posted = topo.ring_work_on_compute and link is None  # the CPU runtime's thread posts sends
    parts = edges.times(b, posted, spec.whole(b))
    post = edges.overhead() if posted else 0.0
    busy = share * edges.busiest([p[0] for p in parts])  # the busiest resource, per ring step
    steps = n_m - 1
    n = steps * len(phases)
    add = _work_us(topo, spec, b, 2) if work and "rs" in phases else 0.0
    copy = _work_us(topo, spec, b, 1) if work and "ag" in phases else 0.0
    # the first chunk's path (behind the other rings sharing its port once), but never faster
    # than the slowest port sending its n messages (for every ring that shares it); a CPU
    # runtime's thread posts each message first (`post`), then does the chunk's adds
    first = edges.window(n, [p[0] + p[1] + post for p in parts]) + (share - 1) * max(
        p[0] for p in parts
    )
    lat = max(p[1] for p in parts)
    head, tail = copy + post, steps * add
    L1 = max(first + copy + tail, head + n * busy + lat + tail)
    work_chunk = copy + steps * add + n * post  # the compute stream's time per chunk
    bottleneck = max(n * busy, work_chunk)
    compute = max(C * work_chunk, C * (copy + n * post) + busy + lat + tail)
    return L1, bottleneck, max(L1, head + n * C * busy + lat + tail, compute)


def _hierarchical(topo: Topology, spec: CollSpec, chunk_bytes: float):
    nodes = by_node(topo, spec.group)
    L, N = len(nodes[0]), len(nodes)
    share = max(1.0, L / topo.inter.nics) if topo.inter else 1.0
    rail0 = [nodes[n][0] for n in range(N)]
    parts = []
    kind = spec.kind
    intra = [
        p
        for p, kinds in (
            ("rs", ("all_reduce", "reduce_scatter")),
            ("ag", ("all_reduce", "all_gather")),
        )
        if kind in kinds
    ]
    inter = {"all_reduce": ("rs", "ag"), "reduce_scatter": ("rs",), "all_gather": ("ag",)}[kind]
    for phase in intra:
        parts.append(_ring(topo, spec, nodes[0], chunk_bytes / L, (phase,), None, False, True)[:2])
    parts.append(
        _ring(topo, spec, rail0, chunk_bytes / L / N, inter, None, False, False, share)[:2]
    )
    L1 = sum(p[0] for p in parts)
    intra_load = sum(p[1] for p in parts[:-1])
    return L1, max(intra_load, parts[-1][1])


class _Tree:
    """A tree's size-independent shape: its edges in post-order, each with its link class."""

    def __init__(self, topo: Topology, parent: dict, link):
        self.order = _post_order(parent)
        pos = {v: i for i, v in enumerate(self.order)}
        self.parent = [pos[parent[v]] if parent[v] is not None else -1 for v in self.order]
        pairs = tuple((v, parent[v]) for v in self.order if parent[v] is not None)
        self.up = _Edges(topo, pairs, link, False)
        self.down = _Edges(topo, tuple((p, v) for v, p in pairs), link, False)


_TREES: dict = {}


def _tree(topo: Topology, parent: dict, link) -> _Tree:
    key = (id(topo), tuple(sorted(parent.items(), key=lambda kv: kv[0])), id(link))
    hit = _TREES.get(key)
    if hit is None or hit[0] is not topo:
        if len(_TREES) > 1000:
            _TREES.clear()
        hit = _TREES[key] = (topo, _Tree(topo, parent, link))
    return hit[1]


def _post_order(parent: dict) -> list:
    children: dict = {}
    for v, p in parent.items():
        if p is not None:
            children.setdefault(p, []).append(v)
    out, stack = [], [(v, False) for v, p in parent.items() if p is None]
    while stack:
        v, seen = stack.pop()
        if seen:
            out.append(v)
        else:
            stack.append((v, True))
            stack.extend((c, False) for c in children.get(v, []))
    return out


def _trees(topo, parents_list, b, link, up, down, spec: CollSpec):
    """L1: the slowest tree's reduce path up plus broadcast path down; bottleneck: the busiest
    port's time per chunk over every tree (up and down); messages of b bytes of `spec`."""
    L1, pairs = 0.0, []
    for parent in parents_list:
        tr = _tree(topo, parent, link)
        t_up = [p[0] + p[1] for p in tr.up.times(b, whole=spec.whole(b))]
        t_dn = [p[0] + p[1] for p in tr.down.times(b, whole=spec.whole(b))]
        n = len(tr.order)
        reduce_at, depth = [0.0] * n, [0.0] * n
        e = 0
        for i in range(n):  # children come before parents
            pi = tr.parent[i]
            if pi >= 0:
                if up:
                    reduce_at[pi] = max(reduce_at[pi], reduce_at[i] + t_up[tr.up.edge_class[e]])
                e += 1
        e = 0
        edge_of = {}
        for i in range(n):
            if tr.parent[i] >= 0:
                edge_of[i] = e
                e += 1
        for i in reversed(range(n)):  # parents before children
            pi = tr.parent[i]
            if pi >= 0 and down:
                depth[i] = depth[pi] + t_dn[tr.down.edge_class[edge_of[i]]]
        L1 = max(L1, reduce_at[n - 1] + (max(depth) if down else 0.0))
        edges = [(v, p) for v, p in parent.items() if p is not None]
        pairs += (edges if up else []) + ([(p, v) for v, p in edges] if down else [])
    every = _edges(topo, tuple(pairs), link, False)
    return L1, every.busiest([p[0] for p in every.times(b, whole=spec.whole(b))])
