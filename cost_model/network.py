"""The network and device layer of the discrete-event model (SimPy): links, ports, compute, trace.

`Sim(topology, world_size, fold)` owns one SimPy environment (time in microseconds) and:
- the resources of the topology, created on first use, each a SimPy `Resource(capacity=1)`: a
  device's switch ports (`out`, `in`), a mesh's directed NVLink bundles, PCIe fallbacks, the NICs of
  each node (one per rail and direction) and, for a flat ring crossing nodes, a node's NIC rails
  taken together (`rails`: the channels NCCL spreads over every NIC, folded into one);
- `transfer(src, dst, nbytes, ...)`: a process that takes the route's resources (in one global
  order, so processes never deadlock), holds them for `latency + bytes / (bandwidth *
  efficiency(bytes))` of the slowest hop, and releases them;
- `compute(rank, us, ...)`: a process that runs `us` microseconds of work on the rank's compute
  stream. While the rank communicates (a transfer it sends or receives is in flight) compute runs
  at (1 - compute_slowdown) of its speed; while either end computes, a transfer runs at
  (1 - comm_slowdown). Rates change as activity starts and stops (work-conserving);
- `trace`: every task appends (rank, stream, step, task, start, end) (microseconds); `frame()`
  returns it as a pandas DataFrame.

Folding (rank symmetry, exact only where every node does the same thing at the same time): with
`fold=True` only the ranks of node 0 are simulated; a resource or a mailbox of node n is node 0's
(`rep(rank)`), which is exact when the workload is invariant under moving every rank by a node.
"""
from __future__ import annotations

from typing import Iterable, Optional

import simpy

from .topology import LinkClass, Topology

STREAMS = ("compute", "comm")


def hop(topo: Topology, src: int, dst: int, link: Optional[LinkClass] = None,
        rails: bool = False) -> tuple[list[tuple], LinkClass, float]:
    """The route of a message src -> dst: (resource keys, link class, bandwidth scale).

    Same node: a switch's ports (`out` of src, `in` of dst), a mesh's NVLink bundle src -> dst
    (bandwidth x links) or the PCIe fallback; `link` (the library's link class) uses the ports.
    Across nodes: src's NIC out and dst's NIC in, on each device's rail; `rails=True` takes all
    of the node's NICs together (a flat ring's crossing, spread over every rail by its channels).
    """
    if topo.node_of(src) == topo.node_of(dst):
        if link is not None or topo.intra.kind == "switch":
            return [("out", src), ("in", dst)], link or topo.intra.link, 1.0
        links = topo.mesh_links(src, dst)
        if links:
            return [("nvl", src, dst)], topo.intra.link, float(links)
        return [("pcie_out", src), ("pcie_in", dst)], topo.intra.fallback or topo.intra.link, 1.0
    inter = topo.inter
    scale = 1.0 / inter.spine_oversubscription
    a, b = topo.node_of(src), topo.node_of(dst)
    if rails:
        return [("rails_out", a), ("rails_in", b)], inter.nic, scale * inter.nics
    return [("nic_out", a, topo.rail_of(src)), ("nic_in", b, topo.rail_of(dst))], inter.nic, scale


def hop_us(topo: Topology, src: int, dst: int, nbytes: float, link: Optional[LinkClass] = None,
           rails: bool = False) -> float:
    """Uncontended time of one message src -> dst, in microseconds."""
    _, cls, scale = hop(topo, src, dst, link, rails)
    return cls.latency_us + cls.wire_us(nbytes) / scale


def _fold_key(key: tuple, per_node: int) -> tuple:
    """A resource of node n is node 0's (ranks modulo the node size, node indices to 0)."""
    kind = key[0]
    if kind in ("out", "in", "pcie_out", "pcie_in", "nvl"):
        return (kind,) + tuple(r % per_node for r in key[1:])
    return (kind, 0) + key[2:]


class Sim:
    def __init__(self, topo: Topology, world_size: int, fold: bool = False):
        if world_size > topo.devices:
            raise ValueError(f"world size {world_size} exceeds the {topo.devices} devices of "
                             f"topology {topo.name} ({topo.nodes} nodes x {topo.devices_per_node})")
        self.topo, self.world, self.fold = topo, world_size, fold
        self.env = simpy.Environment()
        self.trace: list[tuple] = []
        self._res: dict[tuple, tuple[int, simpy.Resource]] = {}
        self._comm = [0] * world_size  # transfers in flight per rank (sent or received)
        self._busy = [False] * world_size  # compute running per rank
        self._changed: dict[int, simpy.Event] = {}
        self.tail = {}  # rank -> last compute event issued (the compute stream's order)

    # -- ranks and resources --------------------------------------------------------------------
    @property
    def ranks(self) -> range:
        """The ranks simulated: node 0's under folding, else all."""
        return range(min(self.world, self.topo.devices_per_node)) if self.fold else range(self.world)

    def rep(self, rank: int) -> int:
        return rank % self.topo.devices_per_node if self.fold else rank

    def resource(self, key: tuple) -> simpy.Resource:
        if key not in self._res:
            self._res[key] = (len(self._res), simpy.Resource(self.env, capacity=1))
        return self._res[key][1]

    def route(self, src: int, dst: int, link: Optional[LinkClass] = None,
              rails: bool = False) -> tuple[list[tuple], LinkClass, float]:
        """(resource keys, link class, bandwidth scale) of a message src -> dst (see `hop`)."""
        keys, cls, scale = hop(self.topo, src, dst, link, rails)
        if self.fold:
            keys = [_fold_key(k, self.topo.devices_per_node) for k in keys]
        return keys, cls, scale

    # -- activity and rates ---------------------------------------------------------------------
    def _signal(self, rank: int) -> None:
        ev = self._changed.pop(rank, None)
        if ev is not None:
            ev.succeed()

    def _wake(self, ranks: Iterable[int]) -> simpy.Event:
        evs = []
        for r in ranks:
            if r not in self._changed:
                self._changed[r] = self.env.event()
            evs.append(self._changed[r])
        return evs[0] if len(evs) == 1 else simpy.AnyOf(self.env, evs)

    def _work(self, work_us: float, ranks: tuple[int, ...], slowdown: float, slowed):
        """Run `work_us` of work at full speed, or at (1 - slowdown) while `slowed()`; the rate
        is re-read whenever an involved rank's activity changes."""
        if slowdown <= 0.0:
            yield self.env.timeout(work_us)
            return
        remaining = work_us
        while True:
            rate = 1.0 - slowdown if slowed() else 1.0
            start = self.env.now
            done = self.env.timeout(remaining / rate)
            yield done | self._wake(ranks)
            if done.processed:
                return
            remaining -= (self.env.now - start) * rate
            if remaining <= 1e-9 * max(1.0, work_us):
                return

    # -- tasks ----------------------------------------------------------------------------------
    def compute(self, rank: int, us: float, step: str, task: str, deps=()):
        """A process: wait for deps and the rank's previous compute, run `us` of work."""
        prev = self.tail.get(rank)
        deps = [d for d in deps if d is not None] + ([prev] if prev is not None else [])
        proc = self.env.process(self._compute(rank, us, step, task, deps))
        self.tail[rank] = proc
        return proc

    def _compute(self, rank, us, step, task, deps):
        if deps:
            yield simpy.AllOf(self.env, deps)
        start = self.env.now
        self._busy[rank] = True
        self._signal(rank)
        yield from self._work(us, (rank,), self.topo.compute_slowdown,
                              lambda: self._comm[rank] > 0)
        self._busy[rank] = False
        self._signal(rank)
        self.trace.append((rank, "compute", step, task, start, self.env.now))

    def delay(self, rank: int, us: float, step: str, task: str, deps=(), stream: str = "comm"):
        """A process that only takes time (a closed-form estimate inside a folded simulation)."""
        return self.env.process(self._delay(rank, us, step, task, [d for d in deps if d]))

    def _delay(self, rank, us, step, task, deps):
        if deps:
            yield simpy.AllOf(self.env, deps)
        start = self.env.now
        yield self.env.timeout(us)
        self.trace.append((rank, "comm", step, task, start, self.env.now))

    def transfer(self, src: int, dst: int, nbytes: float, step: str, task: str, deps=(),
                 link: Optional[LinkClass] = None, rails: bool = False):
        """A process: wait for deps, send nbytes src -> dst over the route; its value is None."""
        return self.env.process(self._transfer(src, dst, nbytes, step, task,
                                               [d for d in deps if d is not None], link, rails))

    def _transfer(self, src, dst, nbytes, step, task, deps, link, rails):
        if deps:
            yield simpy.AllOf(self.env, deps)
        keys, cls, scale = self.route(src, dst, link, rails)
        ordered = sorted(keys, key=lambda k: self._res_id(k))
        requests = [(self.resource(k), self.resource(k).request()) for k in ordered]
        for _, req in requests:
            yield req
        start = self.env.now
        a, b = self.rep(src), self.rep(dst)
        ends = (a,) if a == b else (a, b)
        for r in ends:
            self._comm[r] += 1
            if self._comm[r] == 1:
                self._signal(r)
        yield self.env.timeout(cls.latency_us)
        yield from self._work(cls.wire_us(nbytes) / scale, ends, self.topo.comm_slowdown,
                              lambda: any(self._busy[r] for r in ends))
        for r in ends:
            self._comm[r] -= 1
            if self._comm[r] == 0:
                self._signal(r)
        for res, req in requests:
            res.release(req)
        self.trace.append((a, "comm", step, task, start, self.env.now))

    def _res_id(self, key: tuple) -> int:
        self.resource(key)
        return self._res[key][0]

    # -- results --------------------------------------------------------------------------------
    def run(self) -> float:
        self.env.run()
        return self.env.now

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.trace, columns=["rank", "stream", "step", "task", "start", "end"])
