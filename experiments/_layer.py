"""The Megatron layer's tail shared by the model- and pipeline-parallel programs.

Activations are laid out [S, B, H] (sequence first), as Megatron-LM lays them out. After a
row-parallel matmul every rank holds partial sums of the layer output; the layer all-reduces
them, adds the bias, applies dropout and adds the residual:
    out = dropout(all_reduce(partial) + bias, p) + residual
The split schedules reduce-scatter along the sequence (dim 0), as Megatron's sequence parallelism
does: micro-batch 1 (GPT-3) still slices, and each rank's slice is contiguous, so the runtime
chunks it as it chunks a flat tensor.
"""
from __future__ import annotations

from dsl import Builder, Program, Replicated, Tensor, sym

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
    import torch

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
    its mask (the hash replaces the random number generator Megatron-LM would call)."""
    import math

    import torch

    mask32 = 0xFFFFFFFF

    def mix32(x):
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & mask32  # int64 products wrap; the low 32 bits are exact
        x = x ^ (x >> 15)
        x = (x * 0x846CA68B) & mask32
        return x ^ (x >> 16)

    inner = int(mix32(torch.tensor(0 ^ int(mix32(torch.tensor(seed ^ 0x9E3779B9))))))
    idx = torch.arange(t.numel(), dtype=torch.int64)
    keep = (mix32((idx & mask32) ^ inner) >> 8) >= math.ceil(p * (1 << 24))
    return t.view(-1).mul_(keep.to(t.dtype) * (1.0 / (1.0 - p))).view(t.shape)
