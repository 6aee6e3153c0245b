"""Calibration's microbenchmarks (`experiments.calibration.measure`), built on a rank: one `Bench` per
benchmark and size, its `sample(calls)` the ms per call of each of its kinds on this rank.

`communication` (exchange, exchange_chunked, exchange_first and exchange_last (`waited`), send,
all_reduce, reduce_scatter, all_gather, add, copy), `alone` (the collectives again, for rounds of
their own), `shm_collectives`, `kernels` (the kernel
sweep and `kernel_stream`), `matmuls`, `sequences` (a step's all-reduce then kernel, each alone,
and their paired difference), `library_steps` (the data-parallel baselines' optimizer steps)
and `overlap` build them;
`plain` samples a local operation's calls back to back after one barrier, `apart` a
communication's calls each after its own barrier (`experiments.rounds.sample_ms`).
What each kind measures and what the fit takes from it: `experiments.calibration.measure` and
`experiments.calibration.fit`. Sizes in bytes (f32 buffers), times in ms.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from codegen.runtime import comm
from codegen.runtime.backend import WallClock

from .rounds import sample_ms

KERNEL_BYTES_PER_ELEMENT = 28  # Adam: reads g, w, m, v; writes w, m, v (f32)
EXCHANGE_CHUNKS, CHUNKED_FROM = 16, 1 << 16
# `exchange_first` / `exchange_last` (`waited`): chunks, and the sizes in bytes measured (from a
# size where the first chunk's wait can end before the whole exchange does)
WAIT_CHUNKS, WAIT_SIZES = 4, (1 << 23, 1 << 26)
OVERLAP_CALLS = 3  # side-by-side calls of the overlap benchmark per sample, at least (`overlap`)
LIBRARY_CALLS = 5  # calls of a library step per sample, at least (`library_steps`)


def kernel_args(plan, step, n: int, runner) -> list:
    """The kernel's buffers for a loop of n elements: tensors of n elements where the plan's
    have the loop's size (the kernel's source does not depend on it), its scalars as they are.
    The tensors hold values in [0.1, 1), written page by page: zeros from calloc would leave
    read-only inputs on the kernel's shared zero page, which reads faster than a step's data
    (the Adam kernel 10-20% at 2^20 elements in a probe)."""
    loop = step.kernel.numel
    return [
        torch.empty(n, dtype=runner.bufs[i].dtype).uniform_(0.1, 1.0)
        if plan.buffer(i).numel == loop
        else runner.bufs[i]
        for i in step.kernel.args()
    ]


def exchange(comm, x, out, tag=0, chunks=1):
    me, world = dist.get_rank(), dist.get_world_size()
    right, left = (me + 1) % world, (me - 1) % world
    send = comm.P2P(x, None, me, right, chunks=chunks, tag=tag).start()
    recv = comm.P2P(None, out, left, me, chunks=chunks, tag=tag).start()
    return send, recv


@dataclass(frozen=True)
class Bench:
    """One benchmark: `sample(calls)` times `calls` back-to-back calls after a barrier and
    returns ms per call for each of `kinds` (this rank's); `repeatable`: a sample of a short one
    may hold several calls; `min_calls`: however long a call, at least that many per sample;
    `sizes`: {kind: nbytes} for the kinds whose size is not `nbytes`."""

    kinds: tuple[str, ...]
    nbytes: int
    sample: Callable[[int], tuple[float, ...]]
    extra: dict = field(default_factory=dict)
    repeatable: bool = True
    min_calls: int = 1
    sizes: dict = field(default_factory=dict)


def plain(kind: str, nbytes: int, fn: Callable[[], object], **extra) -> Bench:
    """A local operation: a sample times its calls back to back, after one barrier."""

    def sample(calls: int) -> tuple[float, ...]:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return ((time.perf_counter() - t0) * 1e3 / calls,)

    return Bench((kind,), nbytes, sample, extra)


def apart(kind: str, nbytes: int, fn: Callable[[], object], **extra) -> Bench:
    """A communication: `experiments.rounds.sample_ms`, each call after its own barrier (back to
    back, a 4 KiB exchange took 1.4 ms a call here against 0.15-0.25 ms after a barrier), with
    the statistic the experiments' rounds sample their steps with ("median"), so that the link
    the model is fitted to carries the share of gloo's 4 ms scheduler stalls the steps it
    predicts carry (fitted to the fastest of 3 calls instead, the model predicted every
    adam_fusion / lamb_fusion step 10-40% fast on a quiet VM: the all-reduce of 2^24 floats at
    30.0 ms against 36.6 ms inside the baseline); a size the stalls lift above larger ones is
    flattened by the fit (`cost_model.curves.monotone`)."""
    clock = WallClock()
    return Bench((kind,), nbytes, lambda calls: (sample_ms(fn, calls, clock),), extra)


def communication(rank, world, spec) -> list[Bench]:
    """Views of one pair of buffers of the largest size (every size's x, y from its start)."""
    top = max(spec["sizes"]) // 4
    X, Y = torch.randn(top), torch.randn(top)
    whole_, part_ = torch.randn(top), torch.empty(top // world + 1)
    out = []
    for b in spec["sizes"]:
        n = b // 4
        x, y = X[:n], Y[:n]
        out.append(apart("exchange", b, lambda x=x, y=y: [w.wait() for w in exchange(comm, x, y)]))
        if b >= CHUNKED_FROM:
            out.append(
                apart(
                    "exchange_chunked",
                    b,
                    lambda x=x, y=y: [
                        w.wait() for w in exchange(comm, x, y, chunks=EXCHANGE_CHUNKS)
                    ],
                    chunks=EXCHANGE_CHUNKS,
                )
            )
        if world > 1 and WAIT_SIZES[0] <= b <= WAIT_SIZES[1]:
            out.append(waited(b, x, y))
        if world > 1:

            def one_way(x=x, y=y):
                if rank == 0:
                    comm.p2p(x, None, 0, 1)
                elif rank == 1:
                    comm.p2p(None, y, 0, 1)

            out.append(apart("send", b, one_way))
        out.append(apart("all_reduce", b, lambda x=x: comm.all_reduce(x)))
        if n % world == 0:
            part, whole = part_[: n // world], whole_[:n]
            out.append(
                apart("reduce_scatter", b, lambda w=whole, p=part: comm.reduce_scatter(w, p))
            )
            out.append(apart("all_gather", b, lambda w=whole, p=part: comm.all_gather(p, w)))
        out.append(plain("add", b, lambda x=x, y=y: torch.add(x, y, out=x)))
        out.append(plain("copy", b, lambda x=x, y=y: y.copy_(x)))
    return out


def alone(world, spec) -> list[Bench]:
    """`alone_all_reduce`, `alone_reduce_scatter`, `alone_all_gather` of b bytes (the whole
    array) at `spec["alone_sizes"]`, as `experiment=collectives` times them: views of one pair of
    zeroed buffers of the largest size, every call after its own barrier; calibration times them
    in rounds of their own (`experiments.calibration.measure.rank_main`)."""
    sizes = [b for b in spec["alone_sizes"] if (b // 4) % world == 0]
    top = max(sizes, default=0) // 4
    full_, part_ = torch.zeros(top), torch.zeros(top // world)
    out = []
    for b in sizes:
        full, part = full_[: b // 4], part_[: b // 4 // world]
        out += [
            apart("alone_all_reduce", b, lambda x=full: comm.all_reduce(x)),
            apart("alone_reduce_scatter", b, lambda w=full, p=part: comm.reduce_scatter(w, p)),
            apart("alone_all_gather", b, lambda w=full, p=part: comm.all_gather(p, w)),
        ]
    return out


def waited(nbytes: int, x, y) -> Bench:
    """`exchange_first`, `exchange_last`: a ring exchange of nbytes in WAIT_CHUNKS chunks, every
    chunk's receive, then every chunk's send, posted at once (as a fused step posts its
    reduce-scatter's), then the time until this rank's wait for the first chunk returns, and
    until every chunk is done; each call after a barrier, a sample each kind's median over its
    calls. What the first chunk's wait takes beyond its landing is the topology's `wake_us`."""
    me, world = dist.get_rank(), dist.get_world_size()
    right, left = (me + 1) % world, (me - 1) % world

    def call() -> tuple[float, float]:
        dist.barrier()
        t0 = time.perf_counter()
        recv = comm.P2P(None, y, left, me, chunks=WAIT_CHUNKS, tag=3).start()
        send = comm.P2P(x, None, me, right, chunks=WAIT_CHUNKS, tag=3).start()
        recv.wait_chunk(0)
        first = time.perf_counter()
        recv.wait()
        send.wait()
        return (first - t0) * 1e3, (time.perf_counter() - t0) * 1e3

    def sample(calls: int) -> tuple[float, ...]:
        got = [call() for _ in range(calls)]
        return statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)

    return Bench(("exchange_first", "exchange_last"), nbytes, sample, {"chunks": WAIT_CHUNKS})


def shm_collectives(world, spec, c) -> list[Bench]:
    """comm=shm's all_reduce, reduce_scatter and all_gather of b bytes (the whole array)."""
    out = []
    for b in spec["sizes"]:
        n = b // 4
        if n % world:
            continue
        x, part = torch.randn(n), torch.empty(n // world)
        out += [
            apart("shm_all_reduce", b, lambda x=x: c.all_reduce(x, "sum")),
            apart("shm_reduce_scatter", b, lambda x=x, p=part: c.reduce_scatter(x, p, "sum")),
            apart("shm_all_gather", b, lambda x=x, p=part: c.all_gather(p, x)),
        ]
    return out


def kernels(plan, step, fn, runner, spec) -> list[Bench]:
    """The Adam kernel over n elements, on buffers of its own of n elements (`kernel_args`: one
    allocation each, one after another, as a runner allocates a step's buffers); `kernel_stream`
    on pieces of buffers of `stream_buffer` elements of their own.

    Not views of one set of the largest size: where a kernel's streams lie relative to each
    other changes its time on this machine (the CPU's caches and memory map addresses, not
    sizes, to sets and banks). Measured (2 ranks, interleaved rounds, the slowest rank; per call
    against torch's Adam at 2^22 elements in the same rounds): the kernel at 2^22 took 0.67x
    that step on buffers of its own, 0.83x on the first 2^22 elements of 2^25-element buffers,
    0.87x as pieces of those; the runs' AR-C kernel took 0.61-0.63x of their baseline's step at
    2^22 and 0.72-0.75x at 2^24 (runs 34-36), where calibrations on the views put it at ~0.9x
    and the model predicted every adam schedule slow."""
    loop = step.kernel.numel
    sized = [plan.buffer(i).numel == loop for i in step.kernel.args()]
    out = []
    for n in spec["kernel_elements"]:
        args = kernel_args(plan, step, n, runner)
        out.append(
            plain(
                "kernel",
                n * KERNEL_BYTES_PER_ELEMENT,
                lambda n=n, a=args: fn(0, n, 0, a),
                flops=step.flops * n / loop,
            )
        )
    if spec.get("stream_elements"):
        top = spec.get("stream_buffer", max(spec["kernel_elements"]))
        big = kernel_args(plan, step, top, runner)
        for n in spec["stream_elements"]:
            out.append(streaming(fn, big, sized, n, top, step.flops * n / loop))
    return out


def streaming(fn, big, sized, n: int, top: int, flops: float) -> Bench:
    """`kernel_stream`: the kernel over n elements, each call on the next n-element piece of
    buffers of `top` elements (cycling; beyond the caches), so each call's data comes from
    memory as a fused step's chunks come from its buffers; every rank at once after a barrier,
    the slowest rank's time (`interleaved`): the memory rate the ranks share."""
    pieces, at = max(1, top // n), [0]

    def call():
        i = at[0] % pieces
        at[0] += 1
        fn(0, n, 0, [t[i * n : (i + 1) * n] if s else t for t, s in zip(big, sized)])

    return plain("kernel_stream", n * KERNEL_BYTES_PER_ELEMENT, call, flops=flops)


def library_steps(rank, world, spec, backend) -> list[Bench]:
    """`library_<routine>` for each data-parallel baseline of `experiments.optimizers`
    LIBRARY_BASELINES (torch's fused Adam: `library_adam`) on n elements, b = 4n bytes of
    gradient: the baseline's own `local_step` (the gradient averaged, then the optimizer's
    update, what its `compute_ms` times in a run), built on this rank's inputs at N = n with no
    ranks around it; each call on the same buffers, as a run's baseline steps (beyond the caches
    from 2^22 elements: 64 MiB of w, m, v, g), its gradient scaled back untimed (`alone_step`).
    A sample is the median of LIBRARY_CALLS calls at least, each timed: a run's memory scale
    divides by this time, and in a quick calibration (6 rounds) one call a round left the time
    of the same step at 2^23 elements 0.83-1.15x of twice its time at 2^22 (five calibrations
    in a row)."""
    from dsl.equivalence import distribute, global_inputs

    from .api import BaselineContext, with_defaults
    from .optimizers import LIBRARY_BASELINES

    out = []
    for cls in LIBRARY_BASELINES:
        program = cls.program()
        for n in spec.get("library_elements", []):
            b = {"N": n}
            every = distribute(
                program,
                global_inputs(program, world, b, np.random.default_rng([rank, n])),
                world,
                b,
            )
            base = cls(
                BaselineContext(
                    rank=rank,
                    world_size=world,
                    P=world,
                    backend=backend,
                    groups=None,
                    inputs=with_defaults(program, every[rank]),
                    exact=False,
                )
            )

            def sample(calls: int, base=base) -> tuple[float, ...]:
                dist.barrier()
                times = []
                for _ in range(calls):
                    before = base.compute_ms
                    base.alone_step()
                    times.append(base.compute_ms - before)
                return (statistics.median(times),)

            out.append(Bench((f"library_{cls.routine}",), 4 * n, sample, min_calls=LIBRARY_CALLS))
    return out


def matmuls(spec) -> list[Bench]:
    """torch.matmul of [m, k] x [k, n] f32 into a preallocated output, as the runtime calls it,
    in `pieces` calls of m / pieces rows (b, flops and the time: one call's)."""
    out = []
    for m, k, n, pieces in spec["matmuls"]:
        a, w, o = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        rows = m // pieces

        def whole(a=a, w=w, o=o, rows=rows, pieces=pieces):
            for j in range(pieces):
                torch.matmul(a[j * rows : (j + 1) * rows], w, out=o[j * rows : (j + 1) * rows])

        bench = plain(
            "matmul",
            4 * (rows * k + k * n + rows * n),
            whole,
            flops=2 * rows * k * n,
            shape=f"{m}x{k}x{n}/{pieces}",
        )
        out.append(
            dataclasses.replace(
                bench, sample=lambda calls, s=bench.sample, p=pieces: tuple(t / p for t in s(calls))
            )
        )
    return out


def sequences(plan, step, fn, runner, spec) -> list[Bench]:
    """Per n, one bench of four kinds: all_reduce(4n bytes) then the kernel on n elements (no
    barrier between), each alone, and the three's paired difference: every call of a sample
    times the sequence, the all-reduce and the kernel one after another, each after a barrier,
    and `sequence_extra` is the median over the calls of sequence - comm - compute, so a slow
    spell that hits one call hits its three parts alike (the difference of three medians taken
    at different moments of a round swung by 1 ms from run to run)."""
    out = []
    for n in spec["sequence_elements"]:
        x, args = torch.randn(n), kernel_args(plan, step, n, runner)
        kernel = lambda n=n, a=args: fn(0, n, 0, a)  # noqa: E731
        comm_only = lambda x=x: comm.all_reduce(x)  # noqa: E731
        extra = {
            "kernel_bytes": n * KERNEL_BYTES_PER_ELEMENT,
            "flops": step.flops * n / step.kernel.numel,
        }

        def sample(calls: int, k=kernel, c=comm_only) -> tuple[float, ...]:
            runs = [(timed(lambda: (c(), k())), timed(c), timed(k)) for _ in range(max(1, calls))]
            return tuple(statistics.median(col) for col in zip(*runs)) + (
                statistics.median(s - a - b for s, a, b in runs),
            )

        out.append(
            Bench(
                ("sequence", "sequence_comm", "sequence_compute", "sequence_extra"),
                4 * n,
                sample,
                extra,
            )
        )
    return out


def timed(fn: Callable[[], object]) -> float:
    """ms of one call of `fn`, after a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def overlap(spec, runner, step) -> list[Bench]:
    """A kernel of K elements alone, an exchange of E bytes alone, and both started at once (the
    kernel runs while the exchange is in flight): the kernel's time inside, and the time until
    both are done. One bench, so the four are compared call by call: a sample of `calls` calls
    (at least `OVERLAP_CALLS`) runs the three side by side `calls` times, in an order that turns
    with the call (the same on every rank), and gives each kind's median over them. A sample
    of one call (a round's untimed one) runs them once. Their ratios give the model's overlap
    slowdowns (`experiments.calibration.fit`); each one's spread over rounds is as wide as the gain
    of overlapping, so more calls than a single sample of each."""
    E, K = spec["overlap_exchange"], spec["overlap_kernel"]
    x, y = torch.randn(E // 4), torch.randn(E // 4)
    extra = {"exchange_bytes": E, "kernel_bytes": K * KERNEL_BYTES_PER_ELEMENT}

    def kernel() -> tuple[float, ...]:
        return (timed(lambda: runner.compute(step, 0, K)),)

    def alone() -> tuple[float, ...]:
        return (timed(lambda: [w.wait() for w in exchange(comm, x, y, tag=1)]),)

    def both() -> tuple[float, ...]:
        dist.barrier()
        t0 = time.perf_counter()
        works = exchange(comm, x, y, tag=2)
        t1 = time.perf_counter()
        runner.compute(step, 0, K)
        inside = time.perf_counter() - t1
        for w in works:
            w.wait()
        return inside * 1e3, (time.perf_counter() - t0) * 1e3

    parts = {"k": kernel, "x": alone, "b": both}

    def sample(calls: int) -> tuple[float, ...]:
        got: dict[str, list[float]] = {key: [] for key in parts}
        for c in range(calls):
            for key in ("kxb", "xbk", "bkx")[c % 3]:
                got[key].append(parts[key]())
        med = lambda key, i=0: statistics.median(t[i] for t in got[key])  # noqa: E731
        return med("k"), med("x"), med("b", 0), med("b", 1)

    return [
        Bench(
            ("overlap_kernel", "overlap_exchange", "overlap_inside", "overlap_both"),
            K * KERNEL_BYTES_PER_ELEMENT,
            sample,
            extra,
            min_calls=OVERLAP_CALLS,
            sizes={"overlap_exchange": E},
        )
    ]
