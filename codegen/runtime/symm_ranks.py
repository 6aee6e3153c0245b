"""P virtual ranks of a comm=symm fused step on ONE device: buffers, signal pads, pointer table.

    vr = VirtualRanks(plan, step, alloc)     # alloc(shape, torch dtype) -> zeroed tensor
    vr.load([inputs of member 0, .., member P-1])   # {input name: array} each, as PlanRunner.load
    launch(vr.table_on(device))              # the kernel over grid (B, P): every member at once
    vr.outputs()                             # [{output name: array}] per member

Each member's buffers (`SymmStep.slots`: its gradient, its gathers' destinations, the operands and
hyper-parameters its kernel reads) are separate allocations made by `alloc`, so one device holds
all P members as `codegen.render_symm`'s kernel sees P GPUs: by address only. The table is
`codegen.render_symm`'s (`table[s*P + j]`: member j's slot s, then the P signal pads), built on the
host as int64 addresses; the pads are zeroed once and never reset between launches (the kernel
counts its epochs), so `load` and a new launch replay the step.

Runs on whatever device `alloc` allocates on: CUDA memory for the GPU launcher
(`codegen.runtime.symm.run_virtual`), host memory for the CPU emulation of the kernel
(`tests/cuda_emulation.py`). No CuPy here. Units: elements; pads in bytes.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..plan import FusedCollective, Plan
from ..render_symm import PadLayout
from ..symm_fuse import SymmStep, symm_step
from .backend import TORCH


def only_step(plan: Plan) -> SymmStep:
    """The SymmStep of a plan that is one fused all-reduce and nothing else (ValueError if not;
    `codegen.symm_fuse.SymmError` if the kernel cannot run it)."""
    if len(plan.steps) != 1 or not isinstance(plan.steps[0], FusedCollective):
        raise ValueError(
            f"{plan.name} [{plan.schedule}]: virtual ranks run a plan of one fused "
            f"step; it has {len(plan.steps)} steps"
        )
    return symm_step(plan, plan.steps[0])


class VirtualRanks:
    def __init__(
        self, plan: Plan, step: SymmStep, alloc: Callable[[tuple, torch.dtype], torch.Tensor]
    ):
        self.plan, self.step, P = plan, step, step.P
        for b in step.slots:
            if plan.buffer(b).alias is not None:
                raise ValueError(
                    f"{plan.name}: buffer {plan.buffer(b).name} aliases another; "
                    "virtual ranks allocate every slot on its own"
                )
        self.bufs = [
            {b: alloc(plan.buffer(b).shape, TORCH[plan.buffer(b).dtype]) for b in step.slots}
            for _ in range(P)
        ]
        self.pads = [alloc((PadLayout(P, len(step.chunks)).nbytes,), torch.uint8) for _ in range(P)]
        addrs = [self.bufs[j][b].data_ptr() for b in step.slots for j in range(P)]
        self.table = torch.tensor(addrs + [p.data_ptr() for p in self.pads], dtype=torch.int64)
        ids = dict(plan.inputs)
        for name, value in plan.defaults:
            if ids[name] in step.slots:
                for bufs in self.bufs:
                    bufs[ids[name]].fill_(value)

    def table_on(self, device) -> torch.Tensor:
        """The pointer table where the kernel reads it (kept alive by this object)."""
        self._table_dev = self.table.to(device)
        return self._table_dev

    def load(self, inputs: Sequence[Mapping[str, np.ndarray]]) -> None:
        """Member j's inputs into its buffers (inputs the kernel never reads are skipped)."""
        ids = dict(self.plan.inputs)
        for bufs, given in zip(self.bufs, inputs, strict=True):
            for name, arr in given.items():
                if ids[name] in bufs:
                    t = bufs[ids[name]]
                    t.copy_(torch.from_numpy(np.array(arr, order="C")).reshape(t.shape))

    def outputs(self) -> list[dict[str, np.ndarray]]:
        out = []
        for bufs in self.bufs:
            got = {}
            for name, bid in self.plan.outputs:
                t = bufs[bid]
                got[name] = (t.float() if t.dtype is torch.bfloat16 else t).cpu().numpy().copy()
            out.append(got)
        return out

    def epochs(self) -> list[int]:
        """Each member's pad epoch: the launches it has completed."""
        return [int(p[:4].view(torch.int32).cpu().item()) & 0xFFFFFFFF for p in self.pads]


__all__ = ["VirtualRanks", "only_step"]
