"""The CUDA backend: generated CUDA kernels through CuPy, CuPy memory, streams and events, NCCL
through torch.distributed. One rank per GPU: rank r uses GPU LOCAL_RANK % (GPUs here).

- build: `codegen.build_cuda` (NVRTC through `cupy.cuda.nvrtc`, loaded with `cupy.RawModule`);
  `write_sources` writes `<name>.cu` and PTX for every `archs` (no GPU needed).
- buffers: CuPy allocations (CuPy's memory pool), seen by the runner as torch tensors through
  DLPack (no copy; bf16 and bool as a view of the bytes, which CuPy has no dtype for).
- streams: two CuPy streams, compute and comm, and CuPy events between them; torch work
  (matmuls, copies, NCCL calls) is issued on them through `torch.cuda.ExternalStream`, and the
  kernels through CuPy's current stream, so everything a step issues follows one order.
- communicator: `LibraryComm` on NCCL process groups: torch.distributed's collectives, one call per
  chunk; with `async_op=False` a call is ordered after the current stream's work and the current
  stream waits for it, so the event recorded after it completes with the chunk.
- clock: CuPy events on the caller's current stream; `settle()` synchronises the device.
- graphs: a step can be captured into a CUDA graph (`codegen.runtime.graph`) where NCCL can be
  captured (>= 2.9.6; `graph_reason` says why not otherwise): the events between the streams
  are made without timing (what a capture records as dependencies, and cheaper to record).
Without a GPU (a CPU build of torch, no driver, no device) `cannot_run()` says why in one line;
everything but `write_sources` needs a GPU.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Optional, Sequence

import cupy
import torch
import torch.distributed as dist

from .. import build_cuda
from ..plan import Kernel
from . import comm
from .backend import Backend, Groups, Streams, stage_ranks
from .communicator import LibraryComm

NCCL_GRAPHS = (2, 9, 6)  # the first NCCL whose collectives and P2P calls a CUDA graph captures


def local_device() -> int:
    """This rank's GPU: LOCAL_RANK (as torchrun and `launch` set it) modulo the GPUs here."""
    return int(os.environ.get("LOCAL_RANK", "0")) % cupy.cuda.runtime.getDeviceCount()


def gpu_count() -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


def caller_stream() -> cupy.cuda.ExternalStream:
    """torch's current stream, for CuPy (the stream the caller's own work and clock are on)."""
    s = torch.cuda.current_stream()
    return cupy.cuda.ExternalStream(s.cuda_stream, s.device.index)


class CudaStreams(Streams):
    def __init__(self, device: int):
        with cupy.cuda.Device(device):
            super().__init__(
                cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
            )
        self._torch = {
            id(s): torch.cuda.ExternalStream(s.ptr, device=torch.device("cuda", device))
            for s in (self.compute, self.comm)
        }

    @contextlib.contextmanager
    def use(self, stream):
        with stream, torch.cuda.stream(self._torch[id(stream)]):
            yield

    def record(self, stream):
        return stream.record(_event())

    def wait(self, stream, event) -> None:
        if event is not None:
            stream.wait_event(event)

    def fork(self) -> None:
        ready = caller_stream().record(_event())
        self.compute.wait_event(ready)
        self.comm.wait_event(ready)

    def join(self) -> None:
        caller = caller_stream()
        caller.wait_event(self.compute.record(_event()))
        caller.wait_event(self.comm.record(_event()))


def _event() -> cupy.cuda.Event:
    """An event ordering streams (no timing: cheaper, and what a graph capture records)."""
    return cupy.cuda.Event(disable_timing=True)


class CudaClock:
    """Elapsed time on the GPU between start() and stop(), from CuPy events (ms)."""

    def settle(self) -> None:
        cupy.cuda.Device().synchronize()

    def start(self) -> None:
        self._start = caller_stream().record()

    def stop(self) -> float:
        end = caller_stream().record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(self._start, end)


class CudaBackend(Backend):
    name = "cuda"
    renderer = build_cuda.RENDERER

    def __init__(
        self,
        comm: str = "nccl",
        archs: Sequence[str] = build_cuda.DEFAULT_ARCHS,
        device: Optional[int] = None,
    ):
        if comm != "nccl":
            raise ValueError(f"cuda: unknown comm {comm!r}; known: nccl")
        self.archs, self._device = build_cuda.check_archs(archs), device
        self._groups: dict[tuple[int, int], Groups] = {}

    @property
    def device(self) -> torch.device:
        """This rank's GPU, made current for torch and CuPy on first use."""
        if self._device is None:
            self._device = local_device()
            torch.cuda.set_device(self._device)
            cupy.cuda.Device(self._device).use()
        return torch.device("cuda", self._device)

    def cannot_run(self) -> Optional[str]:
        if torch.version.cuda is None:
            return f"torch {torch.__version__} is a CPU build (NCCL and CUDA tensors need a CUDA build)"
        if not gpu_count():
            return f"CuPy {cupy.__version__} sees no CUDA device"
        return None

    def graph_reason(self, plan) -> Optional[str]:
        """Why a step cannot be captured here: no GPU, or an NCCL older than 2.9.6."""
        why = self.cannot_run()
        if why:
            return why
        nccl = tuple(torch.cuda.nccl.version()[:3])
        if nccl < NCCL_GRAPHS:
            return (
                f"NCCL {'.'.join(map(str, nccl))} cannot be captured in a CUDA graph "
                f"(needs {'.'.join(map(str, NCCL_GRAPHS))})"
            )
        return None

    def build(self, kernels: Sequence[Kernel], name: Optional[str] = None) -> dict:
        return build_cuda.build(kernels, name, device=self.device.index)

    def write_sources(self, kernels, folder, name) -> list[Path]:
        return build_cuda.write_sources(kernels, folder, name, self.archs)

    def buffer(self, shape, dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        with cupy.cuda.Device(self.device.index):
            raw = torch.from_dlpack(cupy.zeros(max(nbytes, 1), dtype=cupy.uint8))
        return raw[:nbytes].view(dtype).view(shape)

    def groups(self, stages: int = 1) -> Groups:
        """NCCL groups of the layout, made once per process and layout (collective)."""
        world = dist.get_world_size()
        key = (world, stages)
        if key not in self._groups:
            self.device  # noqa: B018 - NCCL needs the rank's device set first
            ranks = tuple(range(world))
            every = comm.Group.of(dist.new_group(list(ranks), backend="nccl"), ranks)
            tp = (
                (every,)
                if stages == 1
                else tuple(
                    comm.Group.of(dist.new_group(list(r), backend="nccl"), r)
                    for r in stage_ranks(stages)
                )
            )
            self._groups[key] = Groups(every, tp)
        return self._groups[key]

    def communicator(self, group: comm.Group, streams: Streams) -> LibraryComm:
        return LibraryComm(group, streams)

    def streams(self) -> CudaStreams:
        return CudaStreams(self.device.index)

    def clock(self) -> CudaClock:
        return CudaClock()
