"""The collectives layer: each algorithm as chunked, pipelined transfers on the DES's network.

A collective is a `CollSpec`: its kind, its size `nbytes` as nccl-tests counts it (the whole
array for reduce_scatter / all_gather, each rank's buffer for all_to_all), its group (global ranks,
in ring order), `chunks` (pieces pipelined through it; a fused collective's chunks) and whether the
runtime leaves it to its library (`library`: the topology's library link class, gloo on CPU).

On a topology with an `nccl` section (GPUs), the collectives NCCL runs (all_reduce,
reduce_scatter, all_gather, broadcast, reduce) are NCCL calls instead: `applicable` gives NCCL's
algorithms (ring, tree, nvls, nvls_tree, collnet_*), and each of the C chunks is one call that
holds every member's ports (and, across nodes, each node's NIC rails) for the time
`cost_model.nccl` gives it (the tuner's protocol for that algorithm and size), once every member
has the chunk; its trace task names the algorithm and protocol (`ring/LL128 c0`). The DES and
the closed form thus share NCCL's per-call cost; the DES adds contention between calls, P2P and
compute.

Otherwise (the CPU runtime), algorithms (`ALGORITHMS[kind]`; which one runs is `closed_collectives.choose`'s pick, as NCCL's tuner
picks the lowest estimate, unless the topology forces one):
- ring: reduce-scatter and all-gather in P-1 steps of nbytes/P per rank (all-reduce: both, 2(P-1)
  steps); each chunk's step s+1 leaves once its step s arrived. Its hops are spread over NCCL's
  channels: it crosses nodes on all the NIC rails together, and on a mesh (DGX-1) uses every
  Hamiltonian cycle of NVLinks in both directions (`network.mesh_ring_links`). With `ring_work_on_compute` (CPU ranks)
  every received chunk of a reduce-scatter is added by a kernel on the rank's compute stream and
  an all-gather first copies its own chunk into the output, as the runtime's ring does; in a
  group of one (a pipeline stage of one rank) the ring still copies its input into its output.
- tree (all_reduce across nodes): NCCL's double binary tree: two trees, each carrying half the
  data, over the nodes (the second mirrored), with a chain through the devices of each node;
  chunks reduce up to the root and are broadcast down, pipelined.
- hierarchical (all_reduce, reduce_scatter, all_gather across nodes): a ring reduce-scatter inside
  each node, then a ring all-reduce (or reduce-scatter / all-gather) across nodes among the devices
  of the same local index, each over its own NIC rail, then an all-gather inside each node.
- chain (broadcast, reduce): a pipeline from (or to) the root through the group.
- direct (all_to_all): every rank sends nbytes/P to every other rank.

`simulate(sim, spec, algorithm, ready, step)` adds the collective's tasks to a `network.Sim`:
`ready[r][c]` is the event after which chunk c of rank r's input exists (None: at once) for every
simulated member r; it returns (`done`, `finished`): `done[r][c]` when chunk c of r's output is
complete, `finished[r]` when r's part is over (its sends too). Data per rank and chunk follow the
algorithm (ring: nbytes / P / chunks per message).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from dsl.types import DType

from . import nccl
from .network import Sim, join
from .topology import Topology

ALGORITHMS = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_gather": ("ring", "hierarchical"),
    "broadcast": ("chain",),
    "reduce": ("chain",),
    "all_to_all": ("direct",),
}
ITEMSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i32": 4, "i64": 8, "bool": 1}


@dataclass(frozen=True)
class CollSpec:
    kind: str
    nbytes: int
    group: tuple[int, ...]
    chunks: int = 1
    library: bool = False
    dtype: str = "f32"
    root: int = 0  # broadcast / reduce: the root's index in the group
    pieces: int = 1  # this collective is one of `pieces` equal pieces of one (a fused chunk)
    sync: bool = False  # receives posted before the sends: the sender's thread writes each

    @property
    def P(self) -> int:
        return len(self.group)

    def whole(self, message: float) -> float:
        """The bytes of the unchunked transfer that one of this collective's messages is a piece
        of (its chunks, and the pieces of a fused step's collective)."""
        return message * self.chunks * self.pieces


def dtype_name(dtype) -> str:
    return dtype.name if isinstance(dtype, DType) else str(dtype)


def by_node(topo: Topology, group) -> list[list[int]]:
    """The group's members on each node it spans, in group order."""
    return [list(m) for m in _by_node(topo.devices_per_node, tuple(group))]


@lru_cache(maxsize=1024)
def _by_node(per_node: int, group: tuple) -> tuple:
    nodes: dict[int, list[int]] = {}
    for r in group:
        nodes.setdefault(r // per_node, []).append(r)
    return tuple(tuple(m) for m in nodes.values())


def uses_nccl(spec: CollSpec, topo: Topology) -> bool:
    return nccl.applies(spec.kind, spec.library, topo)


def applicable(spec: CollSpec, topo: Topology) -> tuple[str, ...]:
    if uses_nccl(spec, topo):
        ranks, nodes = nccl.communicator(topo, spec.group)
        return tuple(dict.fromkeys(a for a, _ in nccl.enabled(spec.kind, ranks, nodes, topo.nccl)))
    if spec.library:
        return (
            ("ring",)
            if spec.kind in ("all_reduce", "reduce_scatter", "all_gather")
            else ALGORITHMS[spec.kind]
        )
    algos = ALGORITHMS[spec.kind]
    nodes = by_node(topo, spec.group)
    if len(nodes) < 2 or len({len(n) for n in nodes}) != 1:
        algos = tuple(a for a in algos if a not in ("tree", "hierarchical"))
    return algos


def double_trees(topo: Topology, group) -> list[dict[int, Optional[int]]]:
    """Two parent maps (member -> parent, root -> None): binary trees over the nodes (the second
    mirrored), each node a chain through its devices (first tree towards the node's first device,
    second tree towards its last)."""
    nodes = by_node(topo, group)
    N = len(nodes)
    trees = []
    for mirror in (False, True):
        parent: dict[int, Optional[int]] = {}
        for j, members in enumerate(nodes):
            chain = members[::-1] if mirror else members
            for k in range(1, len(chain)):
                parent[chain[k]] = chain[k - 1]
            jj = N - 1 - j if mirror else j
            if jj == 0:
                parent[chain[0]] = None
            else:
                pj = (jj - 1) // 2
                pnode = nodes[N - 1 - pj if mirror else pj]
                parent[chain[0]] = pnode[-1] if mirror else pnode[0]
        trees.append(parent)
    return trees


def chain_parents(spec: CollSpec) -> dict[int, Optional[int]]:
    """A chain rooted at the spec's root, in group order from it."""
    g = spec.group[spec.root :] + spec.group[: spec.root]
    return {r: (g[i - 1] if i else None) for i, r in enumerate(g)}


# -- the DES ------------------------------------------------------------------------------------
class _Build:
    """Adds one collective's tasks to a Sim."""

    def __init__(self, sim: Sim, spec: CollSpec, step: str, first_chunk: int = 0):
        self.sim, self.spec, self.step, self.first = sim, spec, step, first_chunk
        self.topo = sim.topo
        self.link = self.topo.library if spec.library else None
        self.work = self.topo.ring_work_on_compute and not spec.library
        self.sent: dict[int, list] = {}
        members = set(spec.group)
        self.sims = [r for r in sim.ranks if r in members]

    def send(self, src, dst, nbytes, task, deps, channels=False, chunk=0):
        ev = self.sim.transfer(
            src,
            dst,
            nbytes,
            self.step,
            task,
            deps,
            self.link,
            channels,
            self.first + chunk,
            self.spec.whole(nbytes),
            self.spec.sync,
        )
        self.sent.setdefault(src, []).append(ev)
        return ev

    def kernel_us(self, nbytes: float, reads: int) -> float:
        """An add (reads=2) or a copy (reads=1) of nbytes on the rank's compute stream."""
        return self.topo.device.elementwise_us((reads + 1) * nbytes)

    def ring(self, members, b, C, ready, phase, channels=True, tag=""):
        """One ring phase ("rs" or "ag") over `members` for the simulated ones among them; with
        `channels` its hops are spread over NCCL's channels (`network.hop`)."""
        state = self.ring_start(members, b, C, ready, phase, channels, tag)
        for c in range(C):
            self.ring_chunk(state, c)
        return state["done"]

    def ring_start(self, members, b, C, ready, phase, channels=True, tag="") -> dict:
        """As the runtime's rings issue them: every chunk's first send now (`ring_chunk(c)`:
        chunk c's later steps, each after its receive and, on CPU ranks, its add)."""
        sim, P = self.sim, len(members)
        mine = [r for r in self.sims if r in set(members)]
        st = {
            "members": members,
            "b": b,
            "ready": ready,
            "phase": phase,
            "channels": channels,
            "tag": tag,
            "mine": mine,
            "pos": {m: i for i, m in enumerate(members)},
            "recv": {},
            "done": {r: [None] * C for r in mine},
        }
        if P == 1:
            st["done"] = self.alone(phase, b, C, {r: ready[r] for r in mine}, tag)
            return st
        for c in range(C):
            for r in mine:
                dep = ready[r][c]
                if phase == "ag" and self.work:
                    dep = sim.compute(r, self.kernel_us(b, 1), self.step, f"{tag}copy c{c}", [dep])
                right = members[(st["pos"][r] + 1) % P]
                st["recv"][(0, c, sim.rep(right))] = self.send(
                    r, right, b, f"{tag}{phase} c{c} s0", [dep, ready[r][c]], channels, c
                )
        return st

    def alone(self, phase: str, b: float, C: int, ready, tag: str = "") -> dict:
        """A ring of one member (a pipeline stage of one rank): with `work` (CPU ranks) the
        runtime's ring still copies its input into its output, a reduce-scatter the whole of it
        at its start, an all-gather chunk by chunk into its own block (b bytes a chunk);
        otherwise nothing: done[r][c] = ready[r][c]."""
        if not self.work or phase not in ("rs", "ag"):
            return {r: list(evs) for r, evs in ready.items()}
        done = {}
        for r, evs in ready.items():
            if phase == "rs":
                ev = self.sim.compute(
                    r,
                    self.kernel_us(b * C, 1),
                    self.step,
                    f"{tag}copy",
                    [e for e in evs if e is not None],
                )
                done[r] = [ev] * C
            else:
                done[r] = [
                    self.sim.compute(
                        r, self.kernel_us(b, 1), self.step, f"{tag}copy c{self.first + c}", [evs[c]]
                    )
                    for c in range(C)
                ]
        return done

    def ring_chunk(self, st: dict, c: int) -> dict:
        sim, members, P = self.sim, st["members"], len(st["members"])
        if P == 1:
            return {r: st["done"][r][c] for r in st["mine"]}
        recv, ready, b, tag, phase = st["recv"], st["ready"], st["b"], st["tag"], st["phase"]
        for s in range(1, P - 1):
            for r in st["mine"]:  # a rank takes part once it has entered the collective
                right = members[(st["pos"][r] + 1) % P]
                dep = recv[(s - 1, c, r)]
                if phase == "rs" and self.work:
                    dep = sim.compute(
                        r,
                        self.kernel_us(b, 2),
                        self.step,
                        f"{tag}add c{c} s{s - 1}",
                        [dep, ready[r][c]],
                    )
                recv[(s, c, sim.rep(right))] = self.send(
                    r, right, b, f"{tag}{phase} c{c} s{s}", [dep, ready[r][c]], st["channels"], c
                )
        for r in st["mine"]:
            last = [recv[(s, c, r)] for s in range(P - 1)] + [ready[r][c]]
            last = [e for e in last if e is not None]
            if phase == "rs" and self.work:
                st["done"][r][c] = sim.compute(
                    r, self.kernel_us(b, 2), self.step, f"{tag}add c{c} s{P - 2}", last
                )
            else:
                st["done"][r][c] = join(sim.env, last)
        return {r: st["done"][r][c] for r in st["mine"]}

    def tree(self, parents_list, b, C, ready, up=True, down=True):
        """Reduce up and/or broadcast down each tree (parent maps), chunk by chunk."""
        sim = self.sim
        have = {r: [[] for _ in range(C)] for r in self.sims}
        for t, parent in enumerate(parents_list):
            children: dict[int, list[int]] = {}
            for v, p in parent.items():
                if p is not None:
                    children.setdefault(p, []).append(v)
            order = _post_order(parent, children)
            for c in range(C):
                arrived = {}
                for v in order:  # leaves first
                    deps = [ready[v][c]] + [arrived[ch] for ch in children.get(v, [])]
                    if parent[v] is not None and up:
                        arrived[v] = self.send(v, parent[v], b, f"t{t} up c{c}", deps, chunk=c)
                    else:
                        arrived[v] = join(sim.env, deps)
                got = {}
                for v in reversed(order):  # root first
                    p = parent[v]
                    if p is None or not down:
                        got[v] = arrived[v]
                    else:
                        got[v] = self.send(p, v, b, f"t{t} down c{c}", [got[p]], chunk=c)
                for r in self.sims:
                    have[r][c].append(got[r])
        return {r: [join(sim.env, evs) for evs in have[r]] for r in self.sims}

    def finished(self, done):
        return {r: join(self.sim.env, list(done[r]) + self.sent.get(r, [])) for r in self.sims}


def _post_order(parent, children) -> list[int]:
    roots = [v for v, p in parent.items() if p is None]
    out: list[int] = []
    stack = [(r, False) for r in roots]
    while stack:
        v, seen = stack.pop()
        if seen:
            out.append(v)
            continue
        stack.append((v, True))
        stack.extend((ch, False) for ch in children.get(v, []))
    return out


def simulate(sim: Sim, spec: CollSpec, algorithm: str, ready, step: str, first_chunk: int = 0):
    """Add the collective's tasks; returns (done[r][c], finished[r]) for the simulated members.
    `first_chunk`: the index of its first chunk in a larger pipeline (a fused step's piece)."""
    b = _Build(sim, spec, step, first_chunk)
    S, P, C, kind = spec.nbytes, spec.P, spec.chunks, spec.kind
    ready = {r: (ready[r] if ready.get(r) is not None else [None] * C) for r in b.sims}
    if P == 1:
        phase = {"reduce_scatter": "rs", "all_gather": "ag"}.get(kind, "")
        done = b.alone(phase if algorithm == "ring" else "", S / C, C, ready)
        return done, b.finished(done)
    if uses_nccl(spec, b.topo):
        done = _nccl_calls(b, spec, algorithm, ready)
    elif algorithm == "ring":
        phases = {"all_reduce": ("rs", "ag"), "reduce_scatter": ("rs",), "all_gather": ("ag",)}
        done = ready
        for phase in phases[kind]:
            done = b.ring(spec.group, S / P / C, C, done, phase)
    elif algorithm == "hierarchical":
        done = _hierarchical(b, spec, ready)
    elif algorithm == "tree":
        done = b.tree(double_trees(b.topo, spec.group), S / 2 / C, C, ready)
    elif algorithm == "chain":
        up, down = (kind == "reduce"), (kind == "broadcast")
        done = b.tree([chain_parents(spec)], S / C, C, ready, up=up, down=down)
    elif algorithm == "direct":
        done = {r: [] for r in b.sims}
        for c in range(C):
            got = {r: [] for r in b.sims}
            for r in b.sims:
                for peer in spec.group:
                    if peer != r:
                        ev = b.send(r, peer, S / P / C, f"a2a c{c}", [ready[r][c]], chunk=c)
                        got.setdefault(sim.rep(peer), []).append(ev)
            for r in b.sims:
                done[r].append(join(sim.env, got[r]))
    else:
        raise ValueError(f"unknown algorithm {algorithm!r} for {kind}")
    return done, b.finished(done)


def nccl_call(spec: CollSpec, topo: Topology, algorithm: Optional[str] = None) -> nccl.Call:
    """The NCCL call one chunk of this collective is (nbytes / chunks, over its group)."""
    return nccl.call(spec.kind, spec.nbytes / spec.chunks, spec.group, topo, algorithm)


def _nccl_calls(b: _Build, spec: CollSpec, algorithm: str, ready):
    """One NCCL call per chunk: once every member has chunk c, it holds their ports."""
    call = nccl_call(spec, b.topo, algorithm)
    keys = b.sim.keys_of(_ports(b.topo.devices_per_node, tuple(spec.group)))
    done = {r: [None] * spec.chunks for r in b.sims}
    for c in range(spec.chunks):
        ev = b.sim.hold(
            keys,
            b.sims,
            call.time_us,
            b.step,
            f"{call.label} c{c}",
            [ready[r][c] for r in b.sims],
            b.first + c if b.topo.pipelined_chunks else 0,
        )
        for r in b.sims:
            done[r][c] = ev
    return done


@lru_cache(maxsize=64)
def _ports(per_node: int, group: tuple) -> tuple:
    """`nccl.ports` of a group, computed once per group (a fused step calls it per chunk)."""
    return tuple(nccl.ports(per_node, group))


def _hierarchical(b: _Build, spec: CollSpec, ready):
    nodes = by_node(b.topo, spec.group)
    L, N, C, S = len(nodes[0]), len(nodes), spec.chunks, spec.nbytes
    rails = [[nodes[n][k] for n in range(N)] for k in range(L)]
    done = ready

    def intra(phase, d):
        out = {}
        for members in nodes:
            if any(r in b.sims for r in members):
                out.update(b.ring(members, S / L / C, C, d, phase, tag="intra "))
        return out

    def inter(phases, d):
        for phase in phases:
            out = {}
            for members in rails:
                if any(r in b.sims for r in members):
                    out.update(
                        b.ring(members, S / L / N / C, C, d, phase, channels=False, tag="inter ")
                    )
            d = out
        return d

    if spec.kind in ("all_reduce", "reduce_scatter"):
        done = intra("rs", done)
        done = inter(("rs", "ag") if spec.kind == "all_reduce" else ("rs",), done)
        if spec.kind == "all_reduce":
            done = intra("ag", done)
    else:
        done = intra("ag", inter(("ag",), done))
    return done
