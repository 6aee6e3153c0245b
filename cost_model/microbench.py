"""The calibration's microbenchmarks as data: a `Measurement` (one benchmark at one size: `kind`,
`nbytes`, the median `time_ms` over rounds, its min/max and mean (`time_ms_mean`), `world_size`
P, `flops`, and for some kinds the bytes of their parts or their chunks), the kinds' prefixes
(`library_<routine>`, `shm_<collective>`), `predict_ms(topo, m)`: the cost model's time for
each, which the fit (`experiments.calibration.fit`) inverts and the calibration's own
predicted-vs-measured table shows, and `pool(calibrations)`: several calibrations of one machine
as one set of measurements, which the fit reads as it reads one.
What each kind measures: `experiments.calibration.measure`. Units: `time_ms` in ms, `nbytes` in bytes,
topology fields as named (`_us`, `_gbps`).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from .closed_collectives import collective_us
from .collectives import CollSpec
from .network import Sim
from .topology import Topology

LIBRARY = "library_"  # kinds library_<routine>: a library routine's time by bytes
# the calibration's generated kernel (`kernel`, `kernel_stream`: the Adam program's AR-C kernel),
# bytes per element: read (g, w, m, v) and written in place (w, m, v); its nbytes are their sum
CALIBRATION_KERNEL = (16, 12)
SHM = "shm_"  # kinds shm_<collective>: comm=shm's collectives (`calibration.fit_shm`)
# kinds alone_<collective>: in rounds of collectives only (`calibration.alone_scale`)
ALONE = "alone_"


@dataclass(frozen=True)
class Measurement:
    kind: str
    nbytes: int
    time_ms: float
    world_size: int
    time_ms_min: Optional[float] = None
    time_ms_max: Optional[float] = None
    time_ms_mean: Optional[float] = None
    flops: float = 0.0
    exchange_bytes: int = 0
    kernel_bytes: int = 0
    chunks: int = 1

    @classmethod
    def of(cls, d: dict) -> "Measurement":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# what makes two calibrations' measurements the same benchmark (besides their values)
IDENTITY = ("kind", "nbytes", "world_size", "flops", "exchange_bytes", "kernel_bytes", "chunks")


def pool(calibrations: Sequence[Sequence[dict]]) -> list[dict]:
    """Several calibrations (each a calibration.json's list of measurement dicts) as one: per
    benchmark (`IDENTITY`), the median over the calibrations that measured it of `time_ms` and
    of `time_ms_mean`, the least `time_ms_min`, the greatest `time_ms_max`, the `rounds` summed,
    and `calibrations` = how many measured it; in the order of the first calibration that has
    each. On a shared machine one calibration's medians move by about 10% from one calibration
    to the next; the median of several moves less (experiments.calibration.history)."""
    groups: dict[tuple, list[dict]] = {}
    for cal in calibrations:
        for m in cal:
            groups.setdefault(tuple(m.get(k) for k in IDENTITY), []).append(m)
    out = []
    for ms in groups.values():
        m = dict(ms[0])
        for key, how in (
            ("time_ms", statistics.median),
            ("time_ms_mean", statistics.median),
            ("time_ms_min", min),
            ("time_ms_max", max),
            ("rounds", sum),
        ):
            values = [x[key] for x in ms if x.get(key) is not None]
            if values:
                m[key] = how(values)
        m["calibrations"] = len(ms)
        out.append(m)
    return out


# -- the model's time for each microbenchmark -----------------------------------------------------
def predict_ms(topo: Topology, m: Measurement) -> float:
    P, b, dev = m.world_size, m.nbytes, topo.device
    group = tuple(range(P))
    if m.kind in ("exchange", "send", "overlap_exchange", "exchange_chunked"):
        pairs = [(r, (r + 1) % P) for r in range(P)] if m.kind != "send" else [(0, 1)]
        C = m.chunks
        return (
            _des(
                topo,
                P,
                [(s, d, b / C, b) for s, d in pairs for _ in range(C)],
                [],
                p2p=m.kind == "send",
            )
            / 1e3
        )
    if m.kind in ("exchange_first", "exchange_last"):
        first, last = waited_us(topo, P, b, m.chunks)
        return (first if m.kind == "exchange_first" else last) / 1e3
    if m.kind.startswith(SHM):  # topo: fit_shm's
        return predict_ms(topo, dataclasses.replace(m, kind=m.kind[len(SHM) :]))
    if m.kind.startswith(ALONE):
        return topo.alone_scale * predict_ms(
            topo, dataclasses.replace(m, kind=m.kind[len(ALONE) :])
        )
    if m.kind in ("all_reduce", "reduce_scatter", "all_gather"):
        spec = CollSpec(m.kind, b, group, 1, m.kind in topo.library_kinds)
        return collective_us(spec, "ring", topo) / 1e3
    if m.kind.startswith(LIBRARY):
        return dev.library_step_us(m.kind[len(LIBRARY) :], b) / 1e3
    if m.kind in ("sequence", "sequence_comm"):
        spec = CollSpec("all_reduce", b, group, 1, "all_reduce" in topo.library_kinds)
        ar = collective_us(spec, "ring", topo)
        if m.kind == "sequence_comm":
            return ar / 1e3
        return (
            ar + dev.kernel_us(m.kernel_bytes, m.flops, "f32") + topo.step_overhead_for(b, P)
        ) / 1e3
    if m.kind == "sequence_compute":
        return dev.kernel_us(m.kernel_bytes, m.flops, "f32") / 1e3
    if m.kind == "sequence_extra":
        return topo.step_overhead_for(b, P) / 1e3
    if m.kind == "kernel_stream":
        return dev.step_kernel_us(b, m.flops, "f32") / 1e3
    if m.kind in ("kernel", "overlap_kernel"):
        return dev.kernel_us(b, m.flops, "f32") / 1e3
    if m.kind == "add":
        return dev.elementwise_us(3 * b) / 1e3
    if m.kind == "copy":
        return dev.elementwise_us(2 * b) / 1e3
    if m.kind == "matmul":
        return dev.matmul_us(b, m.flops, "f32") / 1e3
    if m.kind in ("overlap_inside", "overlap_both"):
        E, K = m.exchange_bytes, m.kernel_bytes
        pairs = [(r, (r + 1) % P, E, E) for r in range(P)]
        inside, both = _des(topo, P, pairs, [dev.kernel_us(K, 0, "f32")] * P, inside=True)
        return (inside if m.kind == "overlap_inside" else both) / 1e3
    raise ValueError(f"no prediction for benchmark kind {m.kind!r}")


def _des(topo: Topology, P: int, transfers, kernels_us, inside: bool = False, p2p: bool = False):
    """Transfers (src, dst, bytes, of a transfer of whole bytes; `p2p`: one-way messages, on the
    topology's `p2p_link`) and kernels (one per rank) started together: the makespan in us (and,
    with `inside`, (the kernels' longest time, the makespan))."""
    sim = Sim(topo, P)
    for s, d, b, whole in transfers:
        sim.transfer(s, d, b, "calibration", "exchange", whole=whole, p2p=p2p)
    for r, us in enumerate(kernels_us):
        sim.compute(r, us, "calibration", "kernel")
    end = sim.run()
    if not inside:
        return end
    df = sim.frame()
    k = df[df.stream == "compute"]
    return float((k.end - k.start).max()) if len(k) else 0.0, end


def waited_us(topo: Topology, P: int, nbytes: float, chunks: int) -> tuple[float, float]:
    """A ring exchange of nbytes in `chunks` chunks, every chunk posted at once, each rank's
    thread then waiting for its first incoming chunk: (when the slowest rank's thread has it,
    when everything is done), us (`exchange_first`, `exchange_last`)."""
    sim = Sim(topo, P)
    first = {}  # rank -> its first incoming chunk
    for r in range(P):
        sends = [
            sim.transfer(r, (r + 1) % P, nbytes / chunks, "calibration", "exchange", whole=nbytes)
            for _ in range(chunks)
        ]
        first[(r + 1) % P] = sends[0]
    for r in range(P):
        sim.compute(r, 0.0, "calibration", "wait", [first[r]])
    end = sim.run()
    df = sim.frame()
    waits = df[(df.stream == "compute") & (df.task == "wait")]
    return float(waits.start.max()), end
