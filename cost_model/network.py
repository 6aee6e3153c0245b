"""The network and device layer of the discrete-event model (SimPy): links, ports, compute, trace.

`Sim(topology, world_size, fold)` owns one SimPy environment (time in microseconds) and:
- the resources of the topology, created on first use, each a `Port` (a capacity-1 resource
  whose waiting messages go by priority, then arrival): a
  device's switch ports (`out`, `in`), a mesh's directed NVLink bundles, PCIe fallbacks, the NICs of
  each node (one per rail and direction) and, for a ring's hops spread over NCCL's channels, a
  node's NIC rails taken together (`rails_out`, `rails_in`);
- `transfer(src, dst, nbytes, ...)`: a process that takes the route's resources (in one global
  order, so processes never deadlock), holds them for `overhead + bytes / (bandwidth *
  efficiency(bytes))`, releases them, and arrives `latency` later (`whole`: the size of the
  transfer a chunk belongs to, where the link's rate goes by it); where the runtime's own
  thread posts its messages (`ring_work_on_compute`: the CPU runtime's isend), the overhead is
  a task on the sender's compute stream before the transfer instead; with `sync` (the receive
  was posted before the send: gloo then writes the message in the posting thread; measured in
  fused Adam and LAMB steps at 2^24 elements, 3-11 ms to post one 8 MiB all-gather chunk against
  0.3-0.6 ms for all four reduce-scatter chunks, whose receives are posted with the sends) the
  sender's next compute also waits until the message is off the wire;
- `hold(keys, ends, us, ...)`: a process that takes the resources `keys` (folded as routes are)
  and holds them for `us` (a time the caller computed, e.g. one NCCL call by `cost_model.nccl`
  over every member's ports), its `ends` communicating meanwhile;
- `compute(rank, us, ...)`: a process that runs `us` microseconds of work on the rank's compute
  stream. Where its inputs come later than the rank's previous compute ended (the rank's thread
  blocked on them) and the rank still has transfers in flight, it starts the topology's
  `wake_us` later, or when the last of those transfers ends if that is sooner (the thread waits
  for a core the library's threads hold; 0: at once). While the rank communicates (a transfer
  it sends or receives is in flight) compute runs at (1 - compute_slowdown) of its speed; a
  transfer runs at (1 - comm_slowdown x the fraction of its ends that compute): both ends
  computing is what calibration measures. Rates change as activity starts and stops
  (work-conserving);
- `trace`: every task appends (rank, stream, step, task, start, end) (microseconds); `frame()`
  returns it as a pandas DataFrame.

Folding (the symmetric DES; rank symmetry, exact only where every node does the same thing at the
same time): ranks fall into classes by their position in the hierarchy (their local index in a
node), and with `fold=True` one representative per class is simulated (node 0's ranks); a resource
or a mailbox of node n is node 0's (`rep(rank)`), so a representative's traffic stands for its
whole class (every node's NIC rails carry what node 0's carry). This is exact when the workload is
invariant under moving every rank by a node. `keys_of(keys)` folds the resources of a call over a
whole group once (cached): the simulation's cost then grows with the number of classes, not ranks.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from typing import Iterable, Optional

import simpy

from .topology import LinkClass, Topology

STREAMS = ("compute", "comm")


def join(env: simpy.Environment, events) -> Optional[simpy.Event]:
    """An event that fires when every one of `events` (None: already done) has; None if none is
    pending. Cheaper than `simpy.AllOf` (a counter and callbacks; no values are collected)."""
    pending = [e for e in events if e is not None and not e.processed]
    if not pending:
        return None
    if len(pending) == 1:
        return pending[0]
    done = env.event()
    left = [len(pending)]

    def one(_event) -> None:
        left[0] -= 1
        if left[0] == 0:
            done.succeed()

    for e in pending:
        e.callbacks.append(one)
    return done


class Port:
    """A link or port held by one message at a time; waiting messages go by (priority, arrival)."""

    __slots__ = ("env", "busy", "queue", "seq")

    def __init__(self, env: simpy.Environment):
        self.env, self.busy, self.queue, self.seq = env, False, [], 0

    def acquire(self, priority: int = 0) -> Optional[simpy.Event]:
        """None when granted at once, else an event that fires when granted."""
        if not self.busy:
            self.busy = True
            return None
        ev = self.env.event()
        self.seq += 1
        heapq.heappush(self.queue, (priority, self.seq, ev))
        return ev

    def release(self) -> None:
        if self.queue:
            heapq.heappop(self.queue)[2].succeed()
        else:
            self.busy = False


def hop(
    topo: Topology,
    src: int,
    dst: int,
    link: Optional[LinkClass] = None,
    channels: bool = False,
    p2p: bool = False,
) -> tuple[list[tuple], LinkClass, float]:
    """The route of a message src -> dst: (resource keys, link class, bandwidth scale).

    Same node: a bus (the node's one medium), a switch's ports (`out` of src, `in` of dst); on a
    mesh the NVLink bundle src ->
    dst (bandwidth x links) or, without one, the PCIe fallback; `link` (the library's link class)
    uses the ports. Across nodes: src's NIC out and dst's NIC in, on each device's rail.
    `channels=True` is a ring's hop spread over NCCL's channels: across nodes all of the node's NIC
    rails together, on a mesh all its rings together (`mesh_ring_links`: a port of that many links).
    `p2p=True` is a one-way message between stages: on a bus or a switch it takes the topology's
    `p2p_link` where it has one (the ring's link is fitted to exchanges, every rank sending).
    """
    if topo.node_of(src) == topo.node_of(dst):
        own = topo.p2p_link if p2p and topo.p2p_link is not None else topo.intra.link
        if topo.intra.kind == "bus":
            return [("bus", topo.node_of(src))], link or own, 1.0
        if link is not None or topo.intra.kind == "switch":
            return [("out", src), ("in", dst)], link or own, 1.0
        if channels:
            return [("out", src), ("in", dst)], topo.intra.link, float(mesh_ring_links(topo))
        links = topo.mesh_links(src, dst)
        if links:
            return [("nvl", src, dst)], topo.intra.link, float(links)
        return [("pcie_out", src), ("pcie_in", dst)], topo.intra.fallback or topo.intra.link, 1.0
    inter = topo.inter
    scale = 1.0 / inter.spine_oversubscription
    a, b = topo.node_of(src), topo.node_of(dst)
    if channels:
        return [("rails_out", a), ("rails_in", b)], inter.nic, scale * inter.nics
    return [("nic_out", a, topo.rail_of(src)), ("nic_in", b, topo.rail_of(dst))], inter.nic, scale


def mesh_ring_links(topo: Topology) -> int:
    """Links per direction a device of a mesh drives when rings run over every Hamiltonian cycle
    the mesh holds, each in both directions (NCCL's rings on a DGX-1: all six NVLinks)."""
    edges = tuple(sorted((min(a, b), max(a, b), k) for a, b, k in topo.intra.mesh))
    return _ring_links(edges, topo.devices_per_node)


@lru_cache(maxsize=64)
def _ring_links(edges: tuple, n: int) -> int:
    left = {}
    for a, b, k in edges:
        left[(a, b)] = left.get((a, b), 0) + k
    total = 0
    while True:
        cycle = _hamiltonian(left, n)
        if cycle is None:
            return max(total, 1)
        pairs = [tuple(sorted((cycle[i], cycle[(i + 1) % n]))) for i in range(n)]
        k = min(left[p] for p in pairs)
        for p in pairs:
            left[p] -= k
        total += 2 * k  # the ring and its reverse


def _hamiltonian(left: dict, n: int):
    """The Hamiltonian cycle through pairs with links left whose thinnest pair has the most links
    (exhaustive depth-first search; meshes have a handful of devices)."""
    if n < 2 or n > 12:
        return None
    links = {(v, w): left.get(tuple(sorted((v, w))), 0) for v in range(n) for w in range(n)}
    best: list = [0, None]
    path = [0]

    def extend(width: int) -> None:
        if width <= best[0]:
            return
        if len(path) == n:
            width = min(width, links[(path[-1], 0)])
            if width > best[0]:
                best[:] = [width, list(path)]
            return
        for w in range(1, n):
            if w not in path and links[(path[-1], w)] > 0:
                path.append(w)
                extend(min(width, links[(path[-2], w)]))
                path.pop()

    extend(1 << 30)
    return best[1]


def hop_us(
    topo: Topology,
    src: int,
    dst: int,
    nbytes: float,
    link: Optional[LinkClass] = None,
    channels: bool = False,
    whole: Optional[float] = None,
    p2p: bool = False,
) -> float:
    """Uncontended time of one message src -> dst (a chunk of `whole` bytes), in microseconds."""
    _, cls, scale = hop(topo, src, dst, link, channels, p2p)
    return cls.overhead_us + cls.wire_us(nbytes, whole) / scale + cls.latency_us


def _fold_key(key: tuple, per_node: int) -> tuple:
    """A resource of node n is node 0's (ranks modulo the node size, node indices to 0)."""
    kind = key[0]
    if kind in ("out", "in", "pcie_out", "pcie_in", "nvl"):
        return (kind,) + tuple(r % per_node for r in key[1:])
    return (kind, 0) + key[2:]


@lru_cache(maxsize=256)
def _folded_keys(keys: tuple, per_node: int) -> tuple:
    return tuple(dict.fromkeys(_fold_key(k, per_node) for k in keys))


class Sim:
    def __init__(self, topo: Topology, world_size: int, fold: bool = False):
        if world_size > topo.devices:
            raise ValueError(
                f"world size {world_size} exceeds the {topo.devices} devices of "
                f"topology {topo.name} ({topo.nodes} nodes x {topo.devices_per_node})"
            )
        self.topo, self.world, self.fold = topo, world_size, fold
        self.env = simpy.Environment()
        self.trace: list[tuple] = []
        self._res: dict[tuple, tuple[int, Port]] = {}
        self._comm = [0] * world_size  # transfers in flight per rank (sent or received)
        self._busy = [False] * world_size  # compute running per rank
        self._idle_from = [0.0] * world_size  # when each rank's last compute ended
        self._changed: dict[int, simpy.Event] = {}
        self.tail = {}  # rank -> last compute event issued (the compute stream's order)

    # -- ranks and resources --------------------------------------------------------------------
    @property
    def ranks(self) -> range:
        """The ranks simulated: node 0's under folding, else all."""
        return (
            range(min(self.world, self.topo.devices_per_node)) if self.fold else range(self.world)
        )

    def rep(self, rank: int) -> int:
        return rank % self.topo.devices_per_node if self.fold else rank

    def resource(self, key: tuple) -> Port:
        if key not in self._res:
            self._res[key] = (len(self._res), Port(self.env))
        return self._res[key][1]

    def keys_of(self, keys) -> tuple:
        """The resources `keys` as this simulation holds them (folded onto node 0's, once each)."""
        keys = tuple(keys)
        return _folded_keys(keys, self.topo.devices_per_node) if self.fold else keys

    def route(
        self,
        src: int,
        dst: int,
        link: Optional[LinkClass] = None,
        channels: bool = False,
        p2p: bool = False,
    ) -> tuple[list[tuple], LinkClass, float]:
        """(resource keys, link class, bandwidth scale) of a message src -> dst (see `hop`)."""
        keys, cls, scale = hop(self.topo, src, dst, link, channels, p2p)
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
        """Run `work_us` of work at (1 - slowdown x slowed()) of full speed (`slowed()`: the
        fraction of the interfering activity present); the rate is re-read whenever an involved
        rank's activity changes."""
        if slowdown <= 0.0:
            yield self.env.timeout(work_us)
            return
        remaining = work_us
        while True:
            rate = 1.0 - slowdown * slowed()
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
        ready = join(self.env, deps)
        if ready is not None:
            yield ready
        if self.topo.wake_us > 0 and self._comm[rank] > 0 and self.env.now > self._idle_from[rank]:
            yield from self._woken(rank)
        start = self.env.now
        self._busy[rank] = True
        self._signal(rank)
        yield from self._work(
            us, (rank,), self.topo.compute_slowdown, lambda: 1.0 if self._comm[rank] > 0 else 0.0
        )
        self._busy[rank] = False
        self._signal(rank)
        self._idle_from[rank] = self.env.now
        self.trace.append((rank, "compute", step, task, start, self.env.now))

    def _woken(self, rank: int):
        """A blocked thread's wait for a core: `wake_us`, or until the rank's transfers end."""
        woken = self.env.timeout(self.topo.wake_us)
        while self._comm[rank] > 0 and not woken.processed:
            yield woken | self._wake((rank,))

    def delay(self, rank: int, us: float, step: str, task: str, deps=(), stream: str = "comm"):
        """A process that only takes time (a closed-form estimate inside a folded simulation)."""
        return self.env.process(self._delay(rank, us, step, task, [d for d in deps if d]))

    def _delay(self, rank, us, step, task, deps):
        ready = join(self.env, deps)
        if ready is not None:
            yield ready
        start = self.env.now
        yield self.env.timeout(us)
        self.trace.append((rank, "comm", step, task, start, self.env.now))

    def transfer(
        self,
        src: int,
        dst: int,
        nbytes: float,
        step: str,
        task: str,
        deps=(),
        link: Optional[LinkClass] = None,
        channels: bool = False,
        chunk: int = 0,
        whole: Optional[float] = None,
        sync: bool = False,
        p2p: bool = False,
    ):
        """A process: wait for deps, send nbytes src -> dst over the route (a chunk of a
        transfer of `whole` bytes, for a link whose rate goes by the transfer). With the
        topology's `pipelined_chunks` a waiting message of a lower chunk goes first; else first
        come, first served. `sync`: where the rank's thread posts it, that thread writes it too
        (its receive was posted first): the rank's next compute starts once it is off the wire.
        `p2p`: a one-way message between stages (`hop`)."""
        prio = chunk if self.topo.pipelined_chunks else 0
        deps = [d for d in deps if d is not None]
        posted = self.posts_on_compute(link)
        if posted:  # the sender's thread posts the message: its overhead is compute-stream time
            _, cls, _ = self.route(src, dst, link, channels, p2p)
            if cls.overhead_us > 0:
                deps = [self.compute(src, cls.overhead_us, step, f"post {task}", deps)]
        written = self.env.event() if posted and sync else None
        if written is not None:  # the sender's thread writes it: its next compute waits
            self.tail[src] = written
        return self.env.process(
            self._transfer(
                src,
                dst,
                nbytes,
                step,
                task,
                deps,
                link,
                channels,
                prio,
                posted,
                whole,
                written,
                p2p,
            )
        )

    def posts_on_compute(self, link: Optional[LinkClass]) -> bool:
        """A CPU runtime's own messages (not the library's) are posted by the rank's thread."""
        return self.topo.ring_work_on_compute and link is None

    def _transfer(
        self,
        src,
        dst,
        nbytes,
        step,
        task,
        deps,
        link,
        channels,
        prio,
        posted,
        whole,
        written=None,
        p2p=False,
    ):
        keys, cls, scale = self.route(src, dst, link, channels, p2p)
        a, b = self.rep(src), self.rep(dst)
        hold = (0.0 if posted else cls.overhead_us) + cls.wire_us(nbytes, whole) / scale
        yield from self._occupy(
            keys,
            (a,) if a == b else (a, b),
            hold,
            cls.latency_us,
            step,
            task,
            deps,
            prio,
            (a,),
            written,
        )

    def hold(
        self,
        keys,
        ends,
        us: float,
        step: str,
        task: str,
        deps=(),
        prio: int = 0,
        latency_us: float = 0.0,
    ):
        """A process: wait for deps, hold the resources `keys` for `us` (work of the ranks
        `ends`, slowed as a transfer is), arrive `latency_us` later; traced on every end."""
        ends = tuple(dict.fromkeys(self.rep(r) for r in ends))
        return self.env.process(
            self._occupy(
                list(self.keys_of(keys)),
                ends,
                us,
                latency_us,
                step,
                task,
                [d for d in deps if d is not None],
                prio,
                ends,
            )
        )

    def _occupy(self, keys, ends, hold, latency_us, step, task, deps, prio, traced, written=None):
        ready = join(self.env, deps)
        if ready is not None:
            yield ready
        ports = [self.resource(k) for k in sorted(keys, key=self._res_id)]
        for port in ports:
            granted = port.acquire(prio)
            if granted is not None:
                yield granted
        start = self.env.now
        for r in ends:
            self._comm[r] += 1
            if self._comm[r] == 1:
                self._signal(r)
        yield from self._work(
            hold,
            ends,
            self.topo.comm_slowdown,
            lambda: sum(self._busy[r] for r in ends) / len(ends),
        )
        for r in ends:
            self._comm[r] -= 1
            if self._comm[r] == 0:
                self._signal(r)
        for port in ports:
            port.release()
        if written is not None:  # off the wire: the sender's thread is free
            written.succeed()
        if latency_us:
            yield self.env.timeout(latency_us)
        for r in traced:
            self.trace.append((r, "comm", step, task, start, self.env.now))

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
