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


def value_of(p: Program, op: str):
    """The only statement of kind `op` in p (its out value), for naming transform targets."""
    found = [s.out for s in p.body if s.op == op and s.out.type.rank > 0]
    if len(found) != 1:
        raise LookupError(f"{p.name} has {len(found)} statements of kind {op}")
    return found[0]
