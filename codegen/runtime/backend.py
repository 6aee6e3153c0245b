"""The Backend interface: everything that differs between the targets a Plan runs on.

    backend = backends.get("cpu")              # or "cuda"; in a rank, after torch.distributed is up
    kernels = backend.build(plan.kernels())    # {name: Kernel}
    groups = backend.groups(plan.stages)              # collective: every rank, in the same order
    runner = PlanRunner(plan, rank, kernels, groups, backend)   (codegen.runtime.execute)

A Backend offers, and the one `PlanRunner` uses nothing else that differs between targets:
- `renderer`, `build(kernels, name) -> {name: Kernel}` and `write_sources(kernels, folder, name)
  -> [paths]`: the generated source and whatever the target checks of it without running it
  (CUDA: PTX per `archs`), written to a run's `kernels/` folder; `step_kernels(plan)`: whole
  steps the backend generates as kernels besides the plan's (cuda, comm=symm);
  `precompile(kernels)`: what the launching process compiles once so that the ranks load it
  from the cache (CPU: the module).
- `buffer(shape, torch_dtype) -> torch.Tensor`: a zeroed buffer on the backend's device.
- `groups(stages=1) -> Groups`: the process groups of a layout of `stages` pipeline stages (a
  Plan's or a Program's `stages`), made by every rank in the same order; `communicator(group,
  streams) -> Communicator` (`codegen.runtime.communicator`): collectives and point-to-point
  transfers, whole or chunk by chunk with per-chunk completion.
- `streams() -> Streams`: where compute and communication are issued (`NO_STREAMS` on the CPU,
  where every call completes before it returns).
- `clock() -> Clock`: `settle()` (finish queued work), `start()`, then `stop() -> elapsed ms` of
  the work issued in between (`codegen.runtime.measure.time_ranks` times every backend with it).
- `cannot_run() -> str | None`: why this machine cannot run the backend ('' never), None when it can.
- `graph_reason(plan) -> str | None`: why a step of `plan` cannot be captured into a CUDA graph
  and replayed (`codegen.runtime.graph`), None when it can (the CPU: "no CUDA graphs on the CPU").

A Kernel is called `kernel(begin, end, rank, bufs, workspace=None)`: elements [begin, end) of its
loop, this rank's index in its tensor-parallel group, one tensor per buffer of `kernel.args()`;
`kernel.workspace_bytes` (0 on the CPU) is the zeroed scratch its sums need, one per Compute step.
On a backend with streams it is issued on the current stream.

Backends: `cpu` (C++/OpenMP kernels, gloo; `CpuBackend(comm="library")` swaps the chunked rings
for gloo's own calls issued chunk by chunk, the path the CUDA backend takes with NCCL;
`comm="shm"` for shared memory between the ranks of one host) and `cuda`
(`codegen.runtime.cuda_backend`: CUDA kernels through CuPy, NCCL through torch.distributed;
`comm="symm"`: `codegen.runtime.symm`, fused steps as one kernel over symmetric memory),
loaded by name so that a CPU-only install never imports CuPy.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .. import build as cpu_build
from ..plan import Kernel
from ..render_cpp import CppRenderer
from . import comm
from .communicator import LibraryComm, RingComm
from .shm_comm import ShmComm

TORCH = cpu_build.TORCH_DTYPE  # DType -> torch dtype
BACKENDS = {
    "cpu": "codegen.runtime.backend:CpuBackend",
    "cuda": "codegen.runtime.cuda_backend:CudaBackend",
}
# (backend, comm) -> the class that runs that transport where it is not the backend's own
VARIANTS = {("cuda", "symm"): "codegen.runtime.symm:SymmBackend"}
CUDA_COMMS = ("nccl", "symm")


def get(name: str, **options) -> "Backend":
    """The backend called `name` (ValueError naming the known ones). Options, as `backend.*` of
    the run's config: `comm` (the transport: cpu `ring` | `library` | `shm`, cuda `nccl` |
    `symm`) and `archs` (the GPU architectures `write_sources` compiles for without a device;
    the CPU builds for this machine and writes C++ only)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    comm_kind = options.get("comm")
    if name == "cuda" and comm_kind is not None and comm_kind not in CUDA_COMMS:
        raise ValueError(f"cuda: unknown comm {comm_kind!r}; known: {', '.join(CUDA_COMMS)}")
    module, cls = VARIANTS.get((name, comm_kind), BACKENDS[name]).split(":")
    return getattr(importlib.import_module(module), cls)(**options)


@dataclass(frozen=True)
class Groups:
    """Every rank (P2P between stages) and each pipeline stage's tensor-parallel group."""

    world: comm.Group
    stages: tuple[comm.Group, ...]


def stage_ranks(stages: int) -> list[range]:
    """The global ranks of each pipeline stage's tensor-parallel group (the world in `stages`)."""
    P = dist.get_world_size() // stages
    return [range(s * P, (s + 1) * P) for s in range(stages)]


class Streams:
    """A compute and a comm stream and events between them; with None streams (the CPU) every
    call is a no-op, since every operation has completed when it returns."""

    def __init__(self, compute=None, comm=None):
        self.compute, self.comm = compute, comm

    def use(self, stream):
        """A context issuing the enclosed work on `stream`."""
        return contextlib.nullcontext()

    def record(self, stream):
        """An event completing when the work issued on `stream` so far has."""
        return None

    def wait(self, stream, event) -> None:
        """Make later work on `stream` wait for `event` (None: nothing to wait for)."""

    def fork(self) -> None:
        """Both streams wait for the work already on the caller's current stream."""

    def join(self) -> None:
        """The caller's current stream waits for the work issued on both streams."""

    def other(self, stream):
        return self.comm if stream is self.compute else self.compute

    def after_other(self, stream) -> None:
        """Later work on `stream` waits for all the work issued so far on the other stream."""
        self.wait(stream, self.record(self.other(stream)))

    def on(self, stream):
        """Issue the enclosed work on `stream`, after all the work so far on the other one."""
        self.after_other(stream)
        return self.use(stream)


NO_STREAMS = Streams()


class WallClock:
    """Host wall-clock time: what a CPU rank spent between start() and stop(), in ms."""

    def settle(self) -> None:
        """Nothing queued on the CPU: every call has finished when it returns."""

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        return (time.perf_counter() - self._t0) * 1e3


class Backend:
    """The interface (see the module doc); subclasses fill it in."""

    name: str
    device: torch.device

    def build(self, kernels: Sequence[Kernel], name: Optional[str] = None) -> dict:
        raise NotImplementedError

    def write_sources(self, kernels: Sequence[Kernel], folder, name: str) -> list[Path]:
        raise NotImplementedError

    def step_kernels(self, plan) -> list:
        """Kernels of whole steps this backend generates besides `plan.kernels()` (cuda with
        comm=symm: its fused steps as one kernel each, `codegen.symm_fuse.SymmStep`), which
        `write_sources` and `build` take among the kernels."""
        return []

    def precompile(self, kernels: Sequence[Kernel]) -> None:
        """Compile in the launching process what the ranks' `build` then loads from the cache."""

    def buffer(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def groups(self, stages: int = 1) -> Groups:
        raise NotImplementedError

    def communicator(self, group: comm.Group, streams: Streams):
        raise NotImplementedError

    def streams(self) -> Streams:
        return NO_STREAMS

    def clock(self):
        return WallClock()

    def cannot_run(self) -> Optional[str]:
        return None

    def graph_reason(self, plan) -> Optional[str]:
        return f"no CUDA graphs on the {self.name} backend"


class CpuKernel:
    """A compiled C++ kernel in the Kernel calling convention (no workspace on the CPU)."""

    workspace_bytes = 0

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, begin: int, end: int, rank: int, bufs, workspace=None) -> None:
        self.fn(begin, end, rank, bufs)


class CpuBackend(Backend):
    """C++/OpenMP kernels (`codegen.build`), buffers in host memory, torch.distributed with gloo:
    `comm="ring"` (default) the chunked rings of `codegen.runtime.comm`, `comm="library"` gloo's
    own collectives chunk by chunk (the CUDA backend's path, for tests without a GPU),
    `comm="shm"` POSIX shared memory between the ranks of one host (`codegen.runtime.shm_comm`)."""

    name = "cpu"
    renderer = CppRenderer()
    COMMS = {"ring": RingComm, "library": LibraryComm, "shm": ShmComm}

    def __init__(self, comm: str = "ring", archs: Sequence[str] = ()):
        if comm not in self.COMMS:
            raise ValueError(f"cpu: unknown comm {comm!r}; known: {', '.join(self.COMMS)}")
        self.comm_kind, self.archs, self.device = comm, tuple(archs), torch.device("cpu")

    def build(self, kernels, name=None) -> dict:
        return {n: CpuKernel(fn) for n, fn in cpu_build.build(kernels, name).items()}

    def write_sources(self, kernels, folder, name) -> list[Path]:
        return [cpu_build.write_sources(kernels, folder, name)]

    def precompile(self, kernels) -> None:
        cpu_build.build(kernels)

    def groups(self, stages: int = 1) -> Groups:
        world = comm.Group.world()
        if stages == 1:
            return Groups(world, (world,))
        return Groups(world, tuple(comm.Group.new(ranks) for ranks in stage_ranks(stages)))

    def communicator(self, group: comm.Group, streams: Streams):
        return self.COMMS[self.comm_kind](group, streams)

    def graph_reason(self, plan) -> Optional[str]:
        return "no CUDA graphs on the CPU"
