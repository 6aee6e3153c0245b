"""Topologies as validated, frozen data: the hardware the cost model predicts on.

A `Topology` is `nodes` nodes of `devices_per_node` devices (GPUs, or rank processes on a CPU),
world rank r on node r // devices_per_node. Units are in the names: `bandwidth_gbps` in GB/s
(1e9 bytes per second) per direction, `latency_us` in microseconds, `peak_tflops` in 1e12 flop/s,
message and kernel sizes in bytes.

- `Device`: dense peak flop/s per dtype name (`f16`, `bf16`, `f32`, `f64`), memory bandwidth, a
  fixed cost per kernel (`launch_us`), the fraction of the memory bandwidth a kernel of a given size
  reaches (`memory_efficiency`), of the peak a library matmul reaches (`matmul_efficiency`, times
  `matmul_efficiency_by_flops` {flops: fraction} where a calibration measured the rate by size:
  a CPU's matmul is fastest where its operands fit the caches), and
  of the memory bandwidth the library's own elementwise ops reach (`library_efficiency`: torch's
  adds and copies in the CPU runtime's rings; empty: as generated kernels), and the measured
  time of whole library routines (`library_steps_us` {routine: {bytes: us}}: a library optimizer
  step such as torch's fused Adam, which the experiments' baselines call; `library_step_us`
  interpolates in log-log between sizes, the smallest size's time below it, per byte beyond the
  largest; None where the device has no figure for the routine). `write_allocate`: a store
  reads its cache line first (CPUs without streaming stores), so a kernel's writes to a buffer
  it does not read cost their bytes twice. `inplace_write_weight`: what a byte a kernel writes
  into a buffer it also reads costs against a byte it reads (its line is in the cache already:
  only the write-back; 1: as a read, where not calibrated; `cost_model.closed_form.kernel_bytes`).
  `stream_memory_gbps`: the memory rate of a generated
  kernel inside a program's step, every rank at once on data beyond the caches (calibration's
  `kernel_stream`; a step's buffers were last touched by communication or by the step before, not
  by the kernel itself as in the `memory_efficiency` sweep, which reuses its buffers); 0: the
  sweep's curve (`step_kernel_us`). `sms`: a GPU's streaming multiprocessors (the share of
  them a fused collective's thread blocks stream memory with, `cost_model.kernel_fused`); 0 on
  a CPU.
- `LinkClass`: one port or link, per direction: a message of b bytes holds it for
  `overhead_us + b / (bandwidth_gbps * efficiency(b))` (the per-message software cost and the
  wire), then arrives `latency_us` later (propagation and pipeline latency, which does not hold
  the link: NCCL's per-hop latency; LogP's o and L). `rate_by`: `message` reads the efficiency
  at the message's own size (NCCL: a chunk of a pipelined collective is a message of its own);
  `transfer` at the size of the whole transfer a chunk belongs to (a CPU runtime: the chunks of
  one buffer stream through the same sockets, copies and caches at the whole buffer's rate, as
  calibration's `exchange_chunked` shows: C chunks cost one whole message plus C - 1 posts).
- `IntraNode`: `kind` switch (each device has one port into a non-blocking switch: NVSwitch),
  mesh (point-to-point links, `mesh` = [[a, b, links], ...] between local devices, each link a
  `link`; pairs without one go over `fallback`: PCIe / host) or bus (one medium every message of
  the node takes in turn: loopback TCP between the processes of one CPU, whose copies share its
  cores and memory). `copy_engine_gbps` (switch nodes): the rate, per direction, at which a
  device's copy engines move a collective's data over its port (NCCL's zero-CTA copy-engine
  collectives: no SMs taken, `cost_model.contention`); None: no copy-engine collectives modelled.
- `InterNode`: `nics` NICs per node (rails: device d uses NIC d * nics // devices_per_node), each a
  `nic` link class; the spine is non-blocking unless `spine_oversubscription` > 1. `tiers`: the
  fabric as a rail-optimized fat tree, leaves first, each tier's nodes per switch and its
  oversubscription (`cost_model.fabric`: what NCCL's calls across nodes get of their NICs).
- `library`: where the runtime leaves a collective to its library (gloo on CPU) and that library
  reaches another bandwidth than point-to-point transfers, its achieved link class; it serves the
  kinds in `library_kinds`. `ring_work_on_compute`: the runtime's rings do their local work on
  the rank's compute stream (CPU ranks: a reduce-scatter adds each received chunk, an all-gather
  copies its own chunk into the output) rather than inside the transfer (NCCL). `peer_reads`:
  the ranks share memory (comm=shm) and a fused all-reduce's kernel reads its peers' gradient
  chunks itself (`cost_model.workload`: memory traffic on each rank, no transfers), at the
  device's `stream_memory_gbps` (every rank streaming data beyond the caches at once; 0: the
  device's `memory_bandwidth_gbps` x `memory_efficiency`).
  `pipelined_chunks`: a link serves the waiting message of the lowest chunk first (NCCL's kernels
  loop over chunks); false: in the order messages were issued (the CPU runtime posts every chunk's
  first send at once). `algorithm`: force ring | tree | hierarchical (None: the tuner picks).
  `fused_collective` (GPU topologies): how the GPU runtime runs a fused all-reduce: `kernel`,
  one generated kernel with the chunk loop inside (CoCoNeT's; `cost_model.kernel_fused`), or
  `eager`, the per-chunk path (one NCCL call per chunk and piece, each with its launch).
- `nccl`: where NCCL runs the collectives (GPU topologies), the inputs of NCCL's own tuner
  (`cost_model.nccl`): the `arch` (volta | ampere | hopper | blackwell: which of NCCL's per-arch
  tables apply), the ring/tree graph's `channels` and per-channel bandwidths `bw_intra_gbps` (NVLink
  inside a node) and `bw_inter_gbps` (the node's NICs, across nodes), the `intra_link` class for the
  per-hop latencies (nvlink | pci), NVLink SHARP (`nvls`, with its graph's `nvls_channels` x
  `nvls_bw_gbps`), CollNet/SHARP in the network (`collnet`), the host's `net_overhead_us` per
  network step, and the two constants fitted to published measurements per system (one value
  each for the whole system, `nccl.time_us`): `fill_us`, the per-chunk cost of the fine-grained
  pipelines (LL128, tree, NVLS, CollNet), and `slice_us`, the per-slice cost of the Simple
  protocol's ring; `ll_bw_gbps` / `ll128_bw_gbps` (None: NCCL's tables): where fitted, the LL /
  LL128 rate a ring channel of the graph reaches, which the call runs at (NCCL's tuner still uses
  its tables). Absent: the DES's own algorithms
  (CPU ranks). `algo` / `proto`: force NCCL's algorithm / protocol (NCCL_ALGO / NCCL_PROTO), where
  the collective has it (else the tuner picks, as NCCL falls back).
- `step_overhead_us`: what one step of a program (its operations back to back on every rank,
  no barrier between them) costs beyond its operations timed one by one (CPU ranks: the
  library's threads and the processes handing the two cores to each other; charged to plans
  whose stages hold more than one rank, `cost_model.workload`); 0 on GPUs.
  `step_overhead_by_bytes` {bytes: us}, where calibrated: the same by the size of the step's
  largest transfer (it grows with it: 0.1-0.5 ms at 2 MiB, 1.7-7 ms at 32 MiB here), which
  `step_overhead_at(bytes)` interpolates as `efficiency` maps are; empty: `step_overhead_us`.
  `cores`: where calibrated, the cores the machine's ranks share. The step overhead is stated
  for at most one rank per core (calibration's, normalised where it ran more ranks than
  cores); a plan of more ranks than cores pays it x ranks / cores (`step_overhead_for`): its
  processes hand the cores to each other that many times as often. On the Intel VM (2 cores,
  calibrated at 2 ranks) pipeline_parallel's 4-rank steps were predicted 3-25% fast (each
  schedule's mean over eighteen stored runs, with `p2p_link`) with the overhead once, from 19%
  fast to 3% slow with it twice.
  None: the overhead as it is, at any number of ranks.
- `compute_slowdown` u: compute runs at (1 - u) of its speed while its rank communicates;
  `comm_slowdown` v: transfers run at (1 - v) of their speed while both ends compute, (1 - v/2)
  while one does (CPU ranks sharing cores with the library's threads).
- `wake_us`: a rank's thread that blocks on a chunk still to arrive while transfers of that rank
  are in flight runs again `wake_us` after the chunk has landed, or once the rank's transfers
  are over if that is sooner (CPU ranks: gloo's loop threads moving the other chunks hold the
  cores, and the woken thread waits for one; measured by calibration's `exchange_first`:
  the first of four chunks posted at once reached its waiter 3-6 ms after it landed, at 8-32 MiB,
  `cost_model.network`); 0: at once (GPU streams, and where not calibrated).
- `alone_scale`: a collective timed alone, in rounds of collectives only
  (`experiment=collectives`), takes `alone_scale` x the time the links predict, which are fitted
  to calibration's rounds, where every collective is timed among kernels, matmuls and steps (as
  inside a step); measured by calibration's `alone_<kind>` benchmarks
  (`experiments.calibration.fit.alone_scale`: 0.89-0.94 in its first five calibrations on the Intel
  VM, where the collectives' sweep ran at 0.81-1.02x, 0.90x in the median run, of the same run's
  calibration in fifteen paper runs before them); 1 where not measured (shipped figures,
  comm=shm).
- `p2p_link`: where calibrated, the link class of a one-way message between two ranks (a
  pipeline's P2P between stages on CPU ranks), fitted to calibration's `send` (rank 0 sends, rank
  1 receives, the others idle), where the ring's link (`intra.link`) is fitted to the ring's
  exchanges, reduce-scatters and all-gathers, every rank sending and receiving at once (on the
  Intel VM a lone 4 MiB send took 1.55-1.63 ms, where the ring's link put it at 1.88-1.90 ms).
  Messages of the runtime's rings and library calls keep their links (`network.hop`). None: the
  intra-node link (shipped figures, comm=shm's).

`efficiency` maps are {size in bytes: fraction}, interpolated linearly in log2(size) and clamped
at both ends; an empty map is 1.0. `Topology.from_dict(d)` validates a plain dict (unknown keys,
types, ranges: `cost_model.schema`) and raises `TopologyError` naming the field
(`topology.intra.link.bandwidth_gbps=-1: must be > 0`); `load_topology(name, nodes, path)` reads
`suite/conf/topology/<name>.yaml` or a file; `hydra_schema(cls)` (from `cost_model.schema`) mirrors a
schema class as the mutable dataclass Hydra composes against.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .schema import TopologyError, build, hydra_schema  # noqa: F401  (hydra_schema re-exported)

# the topology files the suite ships: its Hydra group `topology` (suite/conf/topology, package
# data of suite beside this package; cost_model imports nothing of suite)
CONF_TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "suite" / "conf" / "topology"
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
ALGORITHMS = ("ring", "tree", "hierarchical")
NCCL_ALGOS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain")
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")
RATE_BY = ("message", "transfer")
FUSED_COLLECTIVES = ("kernel", "eager")


def _positive(strict: bool = True) -> dict:
    return {"min": 0.0, "strict": strict}


@dataclass(frozen=True, kw_only=True)
class LinkClass:
    bandwidth_gbps: float = field(metadata=_positive())
    latency_us: float = field(metadata=_positive(False))
    efficiency: Dict[int, float] = field(default_factory=dict, metadata={"fraction": True})
    overhead_us: float = field(default=0.0, metadata=_positive(False))
    rate_by: str = field(default="message", metadata={"choices": RATE_BY})

    def eff(self, nbytes: float) -> float:
        return interpolate(self.efficiency, nbytes)

    def time_us(self, nbytes: float) -> float:
        """overhead + bytes / achieved bandwidth + latency: one uncontended message, in us."""
        return self.overhead_us + self.wire_us(nbytes) + self.latency_us

    def wire_us(self, nbytes: float, whole: Optional[float] = None) -> float:
        """nbytes on the wire at the efficiency of its own size, or with `rate_by: transfer`
        of the `whole` transfer it is a chunk of (where given)."""
        if nbytes <= 0:
            return 0.0
        at = whole if self.rate_by == "transfer" and whole else nbytes
        return nbytes / (self.bandwidth_gbps * 1e3 * self.eff(at))


@dataclass(frozen=True, kw_only=True)
class Device:
    name: str
    peak_tflops: Dict[str, float] = field(metadata={"positive_values": True})
    memory_bandwidth_gbps: float = field(metadata=_positive())
    launch_us: float = field(metadata=_positive(False))
    memory_efficiency: Dict[int, float] = field(default_factory=dict, metadata={"fraction": True})
    matmul_efficiency: float = field(default=0.7, metadata={"min": 0.0, "strict": True, "max": 1.0})
    matmul_efficiency_by_flops: Dict[int, float] = field(
        default_factory=dict, metadata={"fraction": True}
    )
    library_efficiency: Dict[int, float] = field(default_factory=dict, metadata={"fraction": True})
    library_steps_us: Dict[str, Dict[int, float]] = field(
        default_factory=dict, metadata={"curves": True}
    )
    write_allocate: bool = False
    stream_memory_gbps: float = field(default=0.0, metadata=_positive(False))
    inplace_write_weight: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0})
    sms: int = field(default=0, metadata={"min": 0})  # a GPU's streaming multiprocessors; 0: none

    def library_step_us(self, routine: str, nbytes: float) -> Optional[float]:
        """The library routine's time on nbytes (us), from `library_steps_us`; None without."""
        return curve_us(self.library_steps_us.get(routine), nbytes)

    def kernel_us(self, nbytes: float, flops: float, dtype: str) -> float:
        """Roofline time of a generated kernel: launch + max(flops / peak, bytes / memory bw)."""
        mem = (
            nbytes
            / (self.memory_bandwidth_gbps * 1e3 * interpolate(self.memory_efficiency, nbytes))
            if nbytes
            else 0.0
        )
        return self.launch_us + max(flops / (self.peak(dtype) * 1e6), mem)

    def step_kernel_us(self, nbytes: float, flops: float, dtype: str) -> float:
        """A generated kernel inside a step: launch + max(flops / peak, bytes / the streaming
        rate), or `kernel_us` where the device has no streaming rate."""
        if not self.stream_memory_gbps:
            return self.kernel_us(nbytes, flops, dtype)
        return self.launch_us + max(
            flops / (self.peak(dtype) * 1e6), nbytes / (self.stream_memory_gbps * 1e3)
        )

    def matmul_us(self, nbytes: float, flops: float, dtype: str) -> float:
        """A library matmul: launch + max(flops / (peak * efficiency), bytes / memory bw), the
        efficiency `matmul_efficiency` x `matmul_efficiency_by_flops` at its flops."""
        mem = (
            nbytes
            / (self.memory_bandwidth_gbps * 1e3 * interpolate(self.memory_efficiency, nbytes))
            if nbytes
            else 0.0
        )
        eff = self.matmul_efficiency * interpolate(self.matmul_efficiency_by_flops, flops)
        return self.launch_us + max(flops / (self.peak(dtype) * 1e6 * eff), mem)

    def elementwise_us(self, nbytes: float) -> float:
        """A library's own elementwise op (a ring's add, a copy) moving nbytes through memory:
        launch + bytes / (memory bandwidth x library_efficiency, else memory_efficiency)."""
        eff = self.library_efficiency or self.memory_efficiency
        return self.launch_us + (
            nbytes / (self.memory_bandwidth_gbps * 1e3 * interpolate(eff, nbytes))
            if nbytes
            else 0.0
        )

    def peak(self, dtype: str) -> float:
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype]
        raise TopologyError(
            f"device {self.name} has no peak_tflops for dtype {dtype} "
            f"(has {', '.join(sorted(self.peak_tflops))})"
        )


@dataclass(frozen=True, kw_only=True)
class IntraNode:
    kind: str = field(metadata={"choices": ("switch", "mesh", "bus")})
    link: LinkClass
    mesh: List[List[int]] = field(default_factory=list)
    fallback: Optional[LinkClass] = None
    copy_engine_gbps: Optional[float] = field(default=None, metadata=_positive())


@dataclass(frozen=True, kw_only=True)
class FabricTier:
    """One tier of a rail-optimized fat tree (`cost_model.fabric`): a switch of it joins `nodes`
    nodes on each rail, its downlinks carry `oversubscription` times what its uplinks do."""

    nodes: int = field(metadata={"min": 1})
    oversubscription: float = field(default=1.0, metadata={"min": 1.0})


@dataclass(frozen=True, kw_only=True)
class InterNode:
    nics: int = field(metadata={"min": 1})
    nic: LinkClass
    spine_oversubscription: float = field(default=1.0, metadata={"min": 1.0})
    tiers: List[FabricTier] = field(default_factory=list)  # leaves first (cost_model.fabric)


@dataclass(frozen=True, kw_only=True)
class Nccl:
    arch: str = field(metadata={"choices": ARCHS})
    channels: int = field(metadata={"min": 1})
    bw_intra_gbps: float = field(metadata=_positive())
    bw_inter_gbps: float = field(default=1.0, metadata=_positive())
    intra_link: str = field(default="nvlink", metadata={"choices": ("nvlink", "pci")})
    nvls: bool = False
    nvls_channels: int = field(default=16, metadata={"min": 1})
    nvls_bw_gbps: float = field(default=1.0, metadata=_positive())
    collnet: bool = False
    net_overhead_us: float = field(default=1.0, metadata=_positive(False))
    fill_us: float = field(default=0.0, metadata=_positive(False))
    slice_us: float = field(default=0.0, metadata=_positive(False))
    net_fill_us: Optional[float] = field(default=None, metadata=_positive(False))
    ll_bw_gbps: Optional[float] = field(default=None, metadata=_positive())
    ll128_bw_gbps: Optional[float] = field(default=None, metadata=_positive())
    version: str = "2.20.3"


@dataclass(frozen=True, kw_only=True)
class Topology:
    name: str
    nodes: int = field(metadata={"min": 1})
    devices_per_node: int = field(metadata={"min": 1})
    device: Device
    intra: IntraNode
    inter: Optional[InterNode] = None
    library: Optional[LinkClass] = None
    library_kinds: List[str] = field(default_factory=list, metadata={"items": KINDS})
    ring_work_on_compute: bool = False
    pipelined_chunks: bool = False
    peer_reads: bool = False
    algorithm: Optional[str] = field(default=None, metadata={"choices": ALGORITHMS})
    compute_slowdown: float = field(default=0.0, metadata={"min": 0.0, "max": 0.95})
    comm_slowdown: float = field(default=0.0, metadata={"min": 0.0, "max": 0.95})
    step_overhead_us: float = field(default=0.0, metadata=_positive(False))
    wake_us: float = field(default=0.0, metadata=_positive(False))
    step_overhead_by_bytes: Dict[int, float] = field(
        default_factory=dict, metadata={"by_size": True}
    )
    cores: Optional[int] = field(default=None, metadata={"min": 1})
    # calibration's measured library all-reduce, {ranks: {bytes: mean us}}: what a run's own
    # all-reduce is compared with to read the machine's communication rate at a point
    # (`experiments.predict.comm_scale`); {} where nothing was measured (shipped figures)
    all_reduce_us: Dict[int, Dict[int, float]] = field(
        default_factory=dict, metadata={"curves": True}
    )
    # a calibrated topology's links fitted at the medians of lone calls (`lone`)
    lone_link: Optional[LinkClass] = None
    lone_library: Optional[LinkClass] = None
    # a calibrated topology's link of one-way messages (`p2p_link`, see the module), at the
    # `send` benchmark's mean and (`lone_p2p_link`) median; None: the intra-node link
    p2p_link: Optional[LinkClass] = None
    lone_p2p_link: Optional[LinkClass] = None
    # a lone collective's time timed among collectives only over its time among calibration's
    # other benchmarks, which the links are fitted to (see the module); 1 where not measured
    alone_scale: float = field(default=1.0, metadata={"min": 0.25, "max": 4.0})
    nccl: Optional[Nccl] = None
    algo: Optional[str] = field(default=None, metadata={"choices": NCCL_ALGOS})
    proto: Optional[str] = field(default=None, metadata={"choices": PROTOCOLS})
    fused_collective: str = field(default="kernel", metadata={"choices": FUSED_COLLECTIVES})
    source: str = ""

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def rail_of(self, rank: int) -> int:
        """The NIC a device uses to leave its node."""
        nics = self.inter.nics if self.inter else 1
        return (rank % self.devices_per_node) * nics // self.devices_per_node

    def mesh_links(self, a: int, b: int) -> int:
        """NVLinks between local devices a and b of a mesh (0: none)."""
        a, b = a % self.devices_per_node, b % self.devices_per_node
        return sum(e[2] for e in self.intra.mesh if {e[0], e[1]} == {a, b})

    @classmethod
    def from_dict(cls, data: Dict[str, Any], where: str = "topology") -> "Topology":
        topo = build(cls, data, where)
        _check_consistency(topo, where)
        return topo

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def step_overhead_at(self, nbytes: float) -> float:
        """A step's overhead (us) for a step whose largest transfer is nbytes:
        `step_overhead_by_bytes` interpolated in log2(bytes), clamped at its ends; without it,
        `step_overhead_us`."""
        if not self.step_overhead_by_bytes:
            return self.step_overhead_us
        return interpolate(self.step_overhead_by_bytes, nbytes)

    def step_overhead_for(self, nbytes: float, ranks: int) -> float:
        """`step_overhead_at(nbytes)` for a plan of `ranks` ranks: x ranks / `cores` where it
        has more ranks than the machine's cores (where known)."""
        over = ranks / self.cores if self.cores else 1.0
        return self.step_overhead_at(nbytes) * max(1.0, over)

    def lone(self) -> "Topology":
        """The topology for a lone call's median time (`experiment=collectives`, a
        calibration's own check) rather than a step's: a calibrated topology's links are
        fitted at the communication benchmarks' means (`experiments.calibration.fit`), which a step
        of many heavy-tailed transfers pays, and `lone_link` / `lone_library` /
        `lone_p2p_link` at their medians; this topology with those in place, where it has them
        (unchanged otherwise)."""
        if self.lone_link is None and self.lone_library is None and self.lone_p2p_link is None:
            return self
        return dataclasses.replace(
            self,
            intra=dataclasses.replace(self.intra, link=self.lone_link or self.intra.link),
            library=self.lone_library or self.library,
            p2p_link=self.lone_p2p_link or self.p2p_link,
            lone_link=None,
            lone_library=None,
            lone_p2p_link=None,
        )

    def with_memory_scale(self, scale: float) -> "Topology":
        """This topology with its device's memory rates (`memory_bandwidth_gbps`,
        `stream_memory_gbps`) times `scale`: the same machine in another spell of its memory
        rate (a shared machine's moves by 1.5x for seconds to minutes, `experiments.predict`)."""
        if scale <= 0:
            raise ValueError(f"memory scale {scale}: must be > 0")
        d = self.device
        return dataclasses.replace(
            self,
            device=dataclasses.replace(
                d,
                memory_bandwidth_gbps=d.memory_bandwidth_gbps * scale,
                stream_memory_gbps=d.stream_memory_gbps * scale,
            ),
        )

    def with_comm_scale(self, scale: float) -> "Topology":
        """This topology with every link class's bandwidth times `scale` (the intra-node link
        and its fallback, the NICs, the library's, the one-way and the lone calls' links;
        latencies and overheads as they are): the same machine in another spell of its
        communication rate (`experiments.predict.comm_scale`). NCCL's own figures (`nccl`) are
        left as they are."""
        if scale <= 0:
            raise ValueError(f"communication scale {scale}: must be > 0")

        def link(c: Optional[LinkClass]) -> Optional[LinkClass]:
            return c and dataclasses.replace(c, bandwidth_gbps=c.bandwidth_gbps * scale)

        intra = dataclasses.replace(
            self.intra, link=link(self.intra.link), fallback=link(self.intra.fallback)
        )
        inter = self.inter and dataclasses.replace(self.inter, nic=link(self.inter.nic))
        return dataclasses.replace(
            self,
            intra=intra,
            inter=inter,
            library=link(self.library),
            lone_link=link(self.lone_link),
            lone_library=link(self.lone_library),
            p2p_link=link(self.p2p_link),
            lone_p2p_link=link(self.lone_p2p_link),
        )

    def with_devices_per_node(self, used: int) -> "Topology":
        """The same nodes with `used` of their devices in a job (nccl-tests' `2 nodes x 1 GPU`):
        a node's NICs are its devices' rails, so the job has `used / devices_per_node` of them
        (NICs, and NCCL's inter-node bandwidth, scaled alike; at least one NIC)."""
        if not 1 <= used <= self.devices_per_node:
            raise TopologyError(f"{used} devices per node: must be 1..{self.devices_per_node}")
        if used == self.devices_per_node:
            return self
        share = used / self.devices_per_node
        inter = self.inter and dataclasses.replace(
            self.inter, nics=max(1, round(self.inter.nics * share))
        )
        nc = self.nccl and dataclasses.replace(
            self.nccl, bw_inter_gbps=self.nccl.bw_inter_gbps * share
        )
        return dataclasses.replace(self, devices_per_node=used, inter=inter, nccl=nc)

    def with_nodes(self, nodes: int) -> "Topology":
        if nodes < 1:
            raise TopologyError(f"topology.nodes={nodes}: must be >= 1")
        return dataclasses.replace(self, nodes=nodes)


def curve_us(curve: Optional[Dict[int, float]], nbytes: float) -> Optional[float]:
    """A measured time curve {bytes: us} at nbytes: log-log between its sizes, its smallest
    size's time below them, per byte beyond its largest; None without a curve."""
    if not curve:
        return None
    keys = sorted(curve)
    if nbytes >= keys[-1]:
        return curve[keys[-1]] * nbytes / keys[-1]
    if nbytes <= keys[0]:
        return curve[keys[0]]
    lo, hi = max(k for k in keys if k <= nbytes), min(k for k in keys if k >= nbytes)
    if lo == hi:
        return curve[lo]
    t = (math.log2(nbytes) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return 2 ** (math.log2(curve[lo]) + t * (math.log2(curve[hi]) - math.log2(curve[lo])))


def interpolate(points: Dict[int, float], x: float) -> float:
    """Piecewise linear in log2(x) through sorted (size, value) points, clamped at the ends."""
    if not points:
        return 1.0
    keys = sorted(points)
    if x <= keys[0]:
        return points[keys[0]]
    if x >= keys[-1]:
        return points[keys[-1]]
    lx = math.log2(x)
    for lo, hi in zip(keys, keys[1:]):
        if lo <= x <= hi:
            t = (lx - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return points[lo] + t * (points[hi] - points[lo])
    return points[keys[-1]]  # pragma: no cover


# -- validation ---------------------------------------------------------------------------------
def _check_consistency(t: Topology, where: str) -> None:
    n = t.devices_per_node
    if t.intra.kind == "mesh":
        if not t.intra.mesh:
            raise TopologyError(f"{where}.intra.mesh: a mesh needs its links [[a, b, links], ...]")
        for i, e in enumerate(t.intra.mesh):
            if len(e) != 3 or not (0 <= e[0] < n and 0 <= e[1] < n) or e[0] == e[1] or e[2] < 1:
                raise TopologyError(
                    f"{where}.intra.mesh[{i}]={e}: must be [a, b, links] with "
                    f"a != b in 0..{n - 1} and links >= 1"
                )
    tiers = [tier.nodes for tier in t.inter.tiers] if t.inter else []
    if any(b <= a for a, b in zip(tiers, tiers[1:])):
        raise TopologyError(f"{where}.inter.tiers: nodes {tiers} must grow from the leaves up")
    if t.nodes > 1 and t.inter is None:
        raise TopologyError(f"{where}.nodes={t.nodes}: several nodes need an inter section (NICs)")
    if t.library_kinds and t.library is None:
        raise TopologyError(f"{where}.library_kinds: set, but no library link class is given")


# -- files and Hydra -----------------------------------------------------------------------------
def load_topology(
    name: str = "local", nodes: Optional[int] = None, path: Optional[Union[str, Path]] = None
) -> Topology:
    """The topology in `path` (a calibrated file) or suite/conf/topology/<name>.yaml; `nodes` overrides."""
    import yaml

    file = Path(path) if path else CONF_TOPOLOGY_DIR / f"{name}.yaml"
    if not file.is_file():
        known = ", ".join(sorted(p.stem for p in CONF_TOPOLOGY_DIR.glob("*.yaml")))
        raise TopologyError(
            f"topology file {file} not found" + ("" if path else f"; known: {known}")
        )
    data = yaml.safe_load(file.read_text()) or {}
    data.pop("path", None)
    topo = Topology.from_dict(data)
    return topo.with_nodes(nodes) if nodes is not None else topo


def dump_topology(topo: Topology, path: Union[str, Path], header: str = "") -> Path:
    """Write `topo` as YAML that `load_topology(path=...)` reads back."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comment + yaml.safe_dump(topo.to_dict(), sort_keys=False))
    return path
