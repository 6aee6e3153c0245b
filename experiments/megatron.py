"""The Megatron layer's tail shared by the model- and pipeline-parallel programs.

Activations are laid out [S, B, H] (sequence first), as Megatron-LM lays them out. After a
row-parallel matmul every rank holds partial sums of the layer output; the layer all-reduces
them, adds the bias, applies dropout and adds the residual:
    out = dropout(all_reduce(partial) + bias, p) + residual
The split schedules reduce-scatter along the sequence (dim 0), as Megatron's sequence parallelism
does: micro-batch 1 (GPT-3) still slices, and each rank's slice is contiguous, so the runtime
chunks it as it chunks a flat tensor.

`MegatronBaseline` (an `experiments.api.Baseline`) is the layer's tail as Megatron-LM writes it
(torch matmul where the program has one, the library all-reduce, bias + dropout + residual in
torch ops), and for a program of 2 stages the pipeline boundary (stage 0 computes and sends with
a library send, stage 1 receives); library calls through the backend's communicator on the
caller's stream (gloo's on the CPU, NCCL's on GPUs); `compute_ms` is the time in its matmul and
tail, `library_ms` in its tail alone (`experiments.api.Baseline`). Timed (`exact=False`) it uses
torch's own dropout; checked
(`exact=True`) it computes the DSL's hash mask instead (`torch_dropout_`), the only difference.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from codegen.runtime.backend import NO_STREAMS
from dsl import Builder, Program, Replicated, Tensor, sym

from .api import BaselineContext, TimedCalls

B, S, H = sym("B"), sym("S"), sym("H")
DROPOUT_P = 0.1
DROPOUT_SEED = 1234
SCATTER_DIM = 0


def bias_dropout_residual(b: Builder, partial: Tensor, dtype, stage=None) -> Tensor:
    bias = b.input("bias", dtype, [H], Replicated())
    residual = b.input("residual", dtype, [S, B, H], Replicated())
    total = b.all_reduce(partial, name="y.sum")
    return b.dropout(total + bias, p=DROPOUT_P, seed=DROPOUT_SEED) + residual


def torch_bias_dropout_add(y, bias, residual, out) -> None:
    """The tail as Megatron-LM runs it in torch ops (the baselines' library computation):
    out = dropout(y + bias) + residual, with torch's own dropout (Philox random numbers)."""
    torch.add(y, bias, out=out)
    torch.nn.functional.dropout(out, DROPOUT_P, training=True, inplace=True)
    out.add_(residual)


def value_of(p: Program, op: str):
    """The only statement of kind `op` in p (its out value), for naming transform targets."""
    found = [s.out for s in p.body if s.op == op and s.out.type.rank > 0]
    if len(found) != 1:
        raise LookupError(f"{p.name} has {len(found)} statements of kind {op}")
    return found[0]


def torch_dropout_(t, seed: int, p: float):
    """In place: the DSL's deterministic dropout (`dsl.interpret.dropout_keep`) on a full tensor
    whose global element index is its flat index, in torch integer ops, as a baseline computes
    its mask (the hash replaces the random number generator Megatron-LM would call), on the
    tensor's own device (a CUDA baseline's mask is computed on its GPU)."""
    mask32 = 0xFFFFFFFF

    def mix32(x):
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & mask32  # int64 products wrap; the low 32 bits are exact
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & mask32
        return x ^ (x >> 16)

    inner = int(mix32(torch.tensor(0 ^ int(mix32(torch.tensor(seed ^ 0x9E3779B9))))))
    idx = torch.arange(t.numel(), dtype=torch.int64, device=t.device)
    keep = (mix32((idx & mask32) ^ inner) >> 8) >= math.ceil(p * (1 << 24))
    return t.view(-1).mul_(keep.to(t.dtype) * (1.0 / (1.0 - p))).view(t.shape)


class MegatronBaseline(TimedCalls):
    """See the module doc. Inputs: x and weight (a matmul's operands) or y (partial sums), bias,
    residual; the output `out` on the ranks that hold it (every rank, or stage 1's)."""

    def __init__(self, ctx: BaselineContext):
        self.t = ctx.tensors()
        self.exact, self.rank, self.P = ctx.exact, ctx.rank, ctx.P
        self.comm = ctx.backend.communicator(ctx.group, NO_STREAMS)
        self.world = ctx.backend.communicator(ctx.groups.world, NO_STREAMS)
        self.stages = ctx.world_size // ctx.P
        self.stage = ctx.stage
        self.compute_ms = self.library_ms = 0.0
        self.out = torch.empty_like(self.t["residual"])
        self.y = self.t["y"].clone() if "y" in self.t else torch.empty_like(self.out)

    def step(self) -> None:
        peer = (self.rank + self.P) % (self.stages * self.P)
        if self.stages > 1 and self.stage == 1:
            self.world.p2p(None, self.out.view(-1), peer, self.rank, 1).start().wait()
            return
        if "x" in self.t:
            self.timed(lambda: torch.matmul(self.t["x"], self.t["weight"], out=self.y), False)
        else:
            self.y.copy_(self.t["y"])
        self.comm.all_reduce(self.y.view(-1), "sum")
        self.timed(self._tail)
        if self.stages > 1:
            self.world.p2p(self.out.view(-1), None, self.rank, peer, 1).start().wait()

    def _tail(self) -> None:
        if not self.exact:  # what Megatron-LM runs: torch's own dropout
            torch_bias_dropout_add(self.y, self.t["bias"], self.t["residual"], self.out)
            return
        torch.add(self.y, self.t["bias"], out=self.out)  # the DSL's mask, to compare outputs
        torch_dropout_(self.out, DROPOUT_SEED, DROPOUT_P)
        self.out.add_(self.t["residual"])

    def outputs(self) -> dict[str, np.ndarray]:
        holds = self.stages == 1 or self.stage == 1
        return {"out": self.out.cpu().numpy().copy()} if holds else {}
