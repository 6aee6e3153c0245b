"""A matmul beside an independent collective on one GPU: when overlap wins and when it loses.

Contract: `overlap_pair(topo, (M, N, K), dtype, kind, nbytes, ranks, mode)` -> `Overlap`, the time
one rank takes for an (M, K) @ (K, N) matmul and an independent collective `kind` of `nbytes`
(nccl-tests' size, as `cost_model.nccl`: the whole output of an all_gather) over the first `ranks`
ranks of `topo`, run in one of `MODES`:

- `sequential`: one after the other: the matmul alone, then NCCL's call alone.
- `sm`: at once, NCCL's kernel on a stream of its own. NCCL runs one CTA per channel, each holding
  an SM for the whole call; `sms_taken` is the channels NCCL's tuner gives the call
  (`cost_model.nccl.used`: 24 for a large ring all_gather on dgx_h100, twice its graph's 12, as
  the 24-CTA ring all_gather grid seen on an 8 x H20 NVSwitch node with NCCL 2.29.7 in
  Tencent-Hunyuan/UniRL PR 467). A cuBLAS CTA needs most of an SM's shared memory, so it cannot
  share an SM with an NCCL CTA: while the collective runs, the matmul computes on (sms - c) of the
  device's SMs, at (sms - c) / sms of its speed (a fluid share: its waves are not modelled).
- `copy_engine`: at once, the collective on the copy engines (NCCL's zero-CTA policy,
  NCCL_CTA_POLICY_ZERO with symmetric buffers: all_gather and all_to_all inside one node). It takes
  no SM; the bytes a rank receives move at the topology's `intra.copy_engine_gbps`.

Both concurrent modes share the HBM. The matmul needs its operands and result once (bytes over its
time), the collective 3 x the bytes a rank receives through NCCL (landed in a FIFO by the peer,
read back by the CTA, written out) or 2 x through the copy engines (written here, read once at
the sender, which sends as much as it receives). Where the two demands pass the device's memory
bandwidth (x `memory_efficiency` at the larger size), both slow by the same factor. The two start
together; while both run each goes at its rate; the one left finishes at full speed (`two_tasks`).
Units: microseconds, bytes, FLOPs, GB/s (1e9 B/s).

Not modelled: L2 pollution and clocks lowered under the power limit while both run, which
published figures put at 30-40% of an overlapped matmul's speed with NCCL on 8 x H100 (pytorch/
pytorch PR 179937) where the SM share alone gives 18%. So the predictions below are optimistic, and
in the `sm` mode two tasks sharing SMs and HBM never take longer than one after the other: there
overlap can only win, by less than it seems to. Overlap loses where the alternative is slower than
what it hides: a copy-engine collective far slower than NCCL's against a short matmul.

Validation (tests/test_contention.py): pytorch/pytorch PR 172714 (kwen2501, January 2026,
benchmarks/distributed/bench_overlapped_matmul_allgather.py): 8 x H100, an fp16 8192^3 `a @ b` on
the default stream and `dist.all_gather_into_tensor` of a 64 MiB input per rank (`--ag-mb`:
"All-gather input size in MiB", so a 512 MiB output, 448 MiB received a rank) on a stream of its
own, the mean of 200 iterations timed with CUDA events (global max over ranks);
`--nccl-cta-policy-zero` for the copy engines (symmetric-memory buffers). The PR states no NCCL or
cuBLAS version and no channel count (copy-engine collectives need NCCL 2.28 or later). Measured
2.96 / 2.02 / 1.77 ms; predicted on dgx_h100 2.95 / 1.84 / 1.59 ms (-0.4%, -9.0%, -10.0%), from:
`matmul_efficiency` 0.7 (the topology's, assumed; a published fp16 8192^3 figure on H100 80GB HBM3,
736 TFLOP/s (zzc0721/torch-performance-test-data issue 79), is 0.744 and would give -3.6%, -13.7%,
-15.3%), 132 SMs, NCCL's tuner with the topology's fitted `fill_us` / `slice_us` (fitted to
nccl-tests curves, not to these points), and `copy_engine_gbps` 380 (NVIDIA/nccl issue 1264).
Nothing is fitted to the three points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from . import nccl
from .collectives import ITEMSIZE
from .topology import Topology, interpolate

MODES = ("sequential", "sm", "copy_engine")
CE_KINDS = ("all_gather", "all_to_all")  # NCCL's copy-engine collectives without a reduction
# HBM bytes a rank's memory moves per byte it receives: NCCL's FIFO (written, read, written out)
# against a copy engine's direct write (and the sender's read of as much again)
HBM_PER_RECEIVED = {"sm": 3.0, "copy_engine": 2.0}


@dataclass(frozen=True)
class Overlap:
    """One rank's time for the pair, and why: each task alone, the SMs the collective held, and
    each task's rate (a fraction of its speed alone) while both ran, for `both_us`."""

    mode: str
    total_us: float
    matmul_us: float  # the matmul alone, on every SM
    collective_us: float  # the collective alone (NCCL's call, or the copy engines')
    collective: str  # how it ran: NCCL's algorithm/protocol, or copy_engine
    sms_taken: int
    matmul_rate: float
    collective_rate: float
    both_us: float

    @property
    def hidden_us(self) -> float:
        """What running them at once saved against the same two one after the other."""
        return self.matmul_us + self.collective_us - self.total_us

    @property
    def matmul_slowdown(self) -> float:
        return 1.0 / self.matmul_rate


def matmul_parts(topo: Topology, mnk: Tuple[int, int, int], dtype: str) -> Tuple[float, float, int]:
    """(compute us on every SM, memory us, bytes) of the matmul: FLOPs 2MNK over peak x
    `matmul_efficiency` (x `matmul_efficiency_by_flops`), its operands and result once over
    the memory bandwidth x `memory_efficiency` at their size."""
    m, n, k = mnk
    dev = topo.device
    flops = 2.0 * m * n * k
    nbytes = ITEMSIZE[dtype] * (m * k + k * n + m * n)
    eff = dev.matmul_efficiency * interpolate(dev.matmul_efficiency_by_flops, flops)
    compute = flops / (dev.peak(dtype) * 1e6 * eff)
    memory = nbytes / (dev.memory_bandwidth_gbps * 1e3 * interpolate(dev.memory_efficiency, nbytes))
    return compute, memory, nbytes


def received_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """The bytes one rank receives in the collective (ring / direct: what its port carries in)."""
    share = (ranks - 1) / ranks
    return nbytes * {"all_reduce": 2 * share, "broadcast": 1.0, "reduce": 1.0}.get(kind, share)


def collective_alone(
    topo: Topology, kind: str, nbytes: float, ranks: int, copy_engine: bool
) -> Tuple[float, int, str]:
    """(us, SMs held, how) of the collective alone: NCCL's call at the tuner's pick, holding an
    SM per channel it uses, or the copy engines' transfer of what a rank receives (no SM)."""
    if copy_engine:
        rate = min(topo.intra.copy_engine_gbps, topo.intra.link.bandwidth_gbps)
        wire = received_bytes(kind, nbytes, ranks) / (rate * 1e3)
        return topo.device.launch_us + wire, 0, "copy_engine"
    made = nccl.call(kind, nbytes, range(ranks), topo)
    if made.algo == "none":  # one rank: nothing to do
        return 0.0, 0, made.label
    channels = nccl.used(kind, made.algo, made.proto, nbytes, ranks, topo.nccl)[0]
    return made.time_us, min(channels, topo.device.sms - 1), made.label


def two_tasks(a_us: float, b_us: float, a_rate: float, b_rate: float) -> Tuple[float, float]:
    """(total us, us both ran) of two tasks started together, each at its rate (a fraction of
    its speed alone) while both run and at full speed once the other has ended."""
    both = min(a_us / a_rate, b_us / b_rate)
    left = max(a_us - both * a_rate, b_us - both * b_rate, 0.0)
    return both + left, both


def overlap_pair(
    topo: Topology,
    matmul: Tuple[int, int, int],
    dtype: str,
    collective: str,
    nbytes: float,
    ranks: int,
    mode: str,
) -> Overlap:
    """One rank's time for the matmul and the independent collective, run as `mode` says (see
    the module); the breakdown says what each cost alone and how each was slowed."""
    _check(topo, matmul, collective, nbytes, ranks, mode)
    compute, memory, mm_bytes = matmul_parts(topo, matmul, dtype)
    launch = topo.device.launch_us
    mm_us = launch + max(compute, memory)
    ce = mode == "copy_engine"
    coll_us, sms, how = collective_alone(topo, collective, nbytes, ranks, ce)
    if mode == "sequential" or coll_us == 0.0:
        return Overlap(mode, mm_us + coll_us, mm_us, coll_us, how, 0, 1.0, 1.0, 0.0)
    # while both run: the matmul on the SMs left, then both on a share of the HBM
    share = (topo.device.sms - sms) / topo.device.sms
    mm_shared_us = launch + max(compute / share, memory)
    demand = mm_bytes / mm_shared_us
    demand += HBM_PER_RECEIVED[mode] * received_bytes(collective, nbytes, ranks) / coll_us
    dev = topo.device
    big = max(mm_bytes, nbytes)
    hbm = dev.memory_bandwidth_gbps * 1e3 * interpolate(dev.memory_efficiency, big)
    memory_share = min(1.0, hbm / demand)
    mm_rate = mm_us / mm_shared_us * memory_share
    total, both = two_tasks(mm_us, coll_us, mm_rate, memory_share)
    return Overlap(mode, total, mm_us, coll_us, how, sms, mm_rate, memory_share, both)


def _check(topo: Topology, matmul, collective: str, nbytes: float, ranks: int, mode: str) -> None:
    """Clear ValueErrors for what the model cannot take."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: must be one of {', '.join(MODES)}")
    if len(matmul) != 3 or any(int(d) != d or d <= 0 for d in matmul):
        raise ValueError(f"matmul {tuple(matmul)!r}: must be three positive integers (M, N, K)")
    if collective not in nccl.KINDS:
        raise ValueError(f"collective {collective!r}: must be one of {', '.join(nccl.KINDS)}")
    if not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes}: must be >= 0")
    if not 1 <= ranks <= topo.devices:
        raise ValueError(f"ranks={ranks}: must be in 1..{topo.devices} on {topo.name}")
    if topo.nccl is None or topo.device.sms < 2:
        raise ValueError(f"{topo.name}: no GPU with NCCL (nccl section, device.sms) to share")
    if mode == "copy_engine":
        if topo.intra.copy_engine_gbps is None:
            raise ValueError(f"{topo.name}: no intra.copy_engine_gbps (copy engines not modelled)")
        if collective not in CE_KINDS:
            raise ValueError(f"copy_engine: {collective} has no copy-engine form ({CE_KINDS})")
        if ranks > topo.devices_per_node:
            raise ValueError(f"copy_engine: ranks={ranks} span nodes; copy engines stay in one")
