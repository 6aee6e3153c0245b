"""`backend.comm=symm` on cuda: the fused all-reduce as ONE kernel over symmetric memory. GPU-ONLY.

Everything here but `SymmBackend.step_kernels` / `write_sources` needs a GPU; on a machine without
one, `cannot_run()` says why in one line and the run renders and compiles the kernels only.

Mechanism. The kernel (`codegen.render_symm`) takes raw addresses: a device table of one pointer
per member for every buffer it touches in another member's memory, and the members' signal pads.
Any mechanism that maps a peer GPU's memory into this process can fill it, and tests need none
(`VirtualRanks`: P members as P allocations on one GPU; `tests/cuda_emulation.py`: host memory).
On real ranks we use PyTorch's symmetric memory (`torch.distributed._symmetric_memory`: one
`empty` + `rendezvous` gives every member's address of one allocation, over CUDA IPC / the
driver's multicast objects where present, exchanged through the process group's store): it ships
with the torch the suite already uses, needs no second NCCL or a hand-written IPC handle exchange
(CUDA IPC through CuPy would do the same with more code), and works within one node, which is
what the kernel is for. NCCL's device API (2.28+, LSA windows, multimem for NVLink SHARP) is the
path across nodes and to in-switch reductions; its windows give the same raw addresses, so the
kernel would not change.

- `SymmBackend`: the cuda backend with `comm="symm"` (`codegen.runtime.backend.get` routes it
  here): collectives on NCCL as `comm=nccl`; `step_kernels(plan)` adds the plan's fused steps
  that one kernel can run (`codegen.symm_fuse.symm_steps`; the others, with why, are logged and
  run on NCCL), so `suite.generate` writes and compiles them with the plan's kernels.
- `SymmFused`: one fused step on real ranks: the symmetric slots (the gradient, the gathers'
  destinations) are staged in one symmetric allocation (copied in before the launch, the
  destinations copied out after: two local copies a step that a runner allocating those buffers
  symmetrically would not need), the pad after them, zeroed once.
- `run_virtual(plan, inputs)`: the kernel over P virtual ranks on this GPU, all in one launch
  (grid (B, P), B small enough for every block to be resident): outputs per member and the time
  of one launch, for `scripts/` checks against `dsl.interpret`.
Not done: the PlanRunner (`codegen.runtime.execute`) does not call `SymmFused` yet, so a measured
run with comm=symm is refused by `cannot_run()` on a GPU too, rather than timing NCCL under the
name symm.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional, Sequence

import cupy
import numpy as np
import torch
from torch.distributed import _symmetric_memory as symm_mem

from .. import build_cuda
from ..plan import Plan
from ..render_symm import PadLayout, symm_launch
from ..symm_fuse import SymmStep, symm_steps
from .backend import TORCH
from .cuda_backend import CudaBackend, gpu_count
from .symm_ranks import VirtualRanks, only_step

log = logging.getLogger(__name__)
NOT_WIRED = (
    "comm=symm: the PlanRunner does not launch the one-kernel fused step yet "
    "(codegen.runtime.symm.run_virtual runs it over virtual ranks)"
)


class SymmBackend(CudaBackend):
    def __init__(
        self,
        comm: str = "symm",
        archs: Sequence[str] = build_cuda.DEFAULT_ARCHS,
        device: Optional[int] = None,
    ):
        if comm != "symm":
            raise ValueError(f"cuda: SymmBackend takes comm='symm', not {comm!r}")
        super().__init__("nccl", archs, device)
        self.comm_kind = "symm"

    def step_kernels(self, plan: Plan) -> list[SymmStep]:
        steps, refused = symm_steps(plan)
        for why in refused.values():
            log.info("comm=symm runs it on NCCL: %s", why)
        return list(steps.values())

    def cannot_run(self) -> Optional[str]:
        return super().cannot_run() or NOT_WIRED


def _function(step: SymmStep, device: int):
    """The compiled kernel of `step` on GPU `device` (a cupy.RawKernel)."""
    source = build_cuda.module_source([step])
    arch = build_cuda.device_arch(device)
    build_cuda.compile_module(source, arch, step.name)
    with cupy.cuda.Device(device):
        return cupy.RawModule(path=str(build_cuda.cache_path(source, arch))).get_function(step.name)


def run_virtual(
    plan: Plan, inputs: Sequence[Mapping[str, np.ndarray]], device: int = 0, launches: int = 1
) -> tuple[list[dict[str, np.ndarray]], float]:
    """The plan's one fused step over plan.P virtual ranks on GPU `device`: (outputs per member,
    ms of the last launch). `launches` > 1 replays it (inputs reloaded before each)."""
    if not gpu_count():
        raise RuntimeError("run_virtual needs a CUDA GPU")
    step = only_step(plan)
    dev = torch.device("cuda", device)
    vr = VirtualRanks(plan, step, lambda shape, dt: torch.zeros(shape, dtype=dt, device=dev))
    fn, launch = _function(step, device), symm_launch(step)
    sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    blocks, table = launch.virtual_grid(step.n, sms), vr.table_on(dev)
    ms = 0.0
    for _ in range(launches):
        vr.load(inputs)
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with cupy.cuda.Device(device):
            start.record()
            fn((blocks, step.P), (launch.threads,), (np.int64(0), np.uint64(table.data_ptr())))
            end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
    return vr.outputs(), ms


class SymmFused:
    """One fused step of a rank among the GPUs of one node (see the module doc). Collective to
    construct: every member of `group` makes it, in the same order."""

    def __init__(self, step: SymmStep, plan: Plan, group, device: int):
        self.step, self.me = step, group.me
        self.offsets, total = {}, 0
        for b in step.symmetric:  # 256-byte aligned slots, then the pad
            self.offsets[b] = total
            total += -(-plan.buffer(b).nbytes // 256) * 256
        self.pad_offset = total
        total += PadLayout(step.P, len(step.chunks)).nbytes
        self.staging = symm_mem.empty(total, dtype=torch.uint8, device=torch.device("cuda", device))
        self.staging.zero_()
        self.handle = symm_mem.rendezvous(self.staging, group.pg)
        self.plan, self.fn, self.device = plan, _function(step, device), device
        self.launch = symm_launch(step)

    def view(self, b: int) -> torch.Tensor:
        buf = self.plan.buffer(b)
        raw = self.staging[self.offsets[b] : self.offsets[b] + buf.nbytes]
        return raw.view(TORCH[buf.dtype]).view(buf.shape)

    def table(self, bufs: Mapping[int, torch.Tensor]) -> torch.Tensor:
        P, ptrs = self.step.P, self.handle.buffer_ptrs
        rows = []
        for b in self.step.slots:
            if b in self.offsets:
                rows += [ptrs[j] + self.offsets[b] for j in range(P)]
            else:  # only this member's own is ever read
                rows += [bufs[b].data_ptr() if j == self.me else 0 for j in range(P)]
        rows += [ptrs[j] + self.pad_offset for j in range(P)]
        return torch.tensor(rows, dtype=torch.int64).to(torch.device("cuda", self.device))

    def __call__(self, bufs: Mapping[int, torch.Tensor], sms: int) -> None:
        """The step on CuPy's current stream (the runner's compute stream): stage in, one
        launch, stage the destinations out."""
        for b in self.step.symmetric:
            self.view(b).copy_(bufs[b])
        self._table = self.table(bufs)
        grid = self.launch.grid(self.step.n, sms)
        self.fn(
            (grid, 1),
            (self.launch.threads,),
            (np.int64(self.me), np.uint64(self._table.data_ptr())),
        )
        for p in self.step.pushes:
            bufs[p.dst].copy_(self.view(p.dst))


__all__ = ["SymmBackend", "SymmFused", "run_virtual"]
