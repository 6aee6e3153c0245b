"""Activation memory of a BERT-style encoder counted from its shapes, and the peak measured on the
CPU to check the count (for `experiments.table1`).

`Shapes(layers, hidden, heads, vocab, seq, itemsize, ...)` describes a model as it trains; bytes
are per sample (one sequence of `seq` tokens), `e` = itemsize (2: f16 under amp O2; 4: f32):
- `kept_bytes`: what autograd keeps for backward (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", section 4.1). Per layer, s = seq, h = hidden, a =
  heads: attention 5 e s h (the QKV projection's input; Q, K, V; the output projection's input),
  the attention probabilities e a s^2 (kept unless attention is fused: `flash`, which keeps its
  f32 log-sum-exp a s instead), with `dropout` its 1-byte mask a s^2 and its output e a s^2;
  MLP 9 e s h (the first linear's input, GELU's input 4 e s h, the second linear's input
  4 e s h); two LayerNorms' inputs 2 e s h and their f32 mean and rstd 16 s; with `dropout` two
  1-byte masks 2 s h. At e = 2 with dropout, no flash: s h (34 + 5 a s / h), Korthikanti's
  figure. Embedding: the int64 token indices (`index_tensors` of them), with `embedding_norm`
  its LayerNorm's input and stats (and a dropout mask). Head: with `head_transform` (BERT's MLM
  head: dense h x h, GELU) 2 e s h, then a LayerNorm's input and stats, the decoder's input
  e s h, the log-softmax's output over the vocabulary e s V and the int64 targets 8 s;
- `peak_bytes`: kept + the gradients of the log-softmax's output and of the logits, 2 e s V,
  alive together at the start of backward, where the peak falls (the s x V logits are large:
  V = 30522 for BERT, 15.6 MB per sample at f16, s = 128).

`measured_peak_bytes(module, inputs, targets)`: the peak of the bytes the CPU allocator holds,
above what it held before, during one forward and backward of `experiments.bert.loss_of`
(torch.profiler with profile_memory: every allocation and free in time order, summed; the live
total's maximum). The parameters' gradients are allocated late in backward, after the peak (the
total at the end is theirs). The per-sample figure to compare with `peak_bytes` is the
difference between two micro-batches, divided by theirs: it drops what does not grow with the
micro-batch. On torch 2.13's CPU the encoder's attention is fused (scaled_dot_product_attention's
flash kernel), so the check runs with `flash=True`, f32, no dropout, no head transform, as
`experiments.bert.Encoder` is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bert as B

INDEX_BYTES = 8  # int64 token indices and targets
STATS_BYTES = 8  # a LayerNorm's f32 mean and rstd, per position


@dataclass(frozen=True, kw_only=True)
class Shapes:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    itemsize: int = 2
    dropout: bool = True
    flash: bool = False
    head_transform: bool = True
    embedding_norm: bool = True
    index_tensors: int = 3  # BERT: token, position and token-type ids


def _layer_bytes(m: Shapes) -> float:
    e, s, h, a = m.itemsize, m.seq, m.hidden, m.heads
    attention = 5 * e * s * h
    if m.flash:
        attention += 4 * a * s  # the fused kernel's f32 log-sum-exp
    else:
        attention += e * a * s * s + (a * s * s + e * a * s * s) * m.dropout
    mlp = 9 * e * s * h
    norms = 2 * (e * s * h + STATS_BYTES * s)
    masks = 2 * s * h * m.dropout
    return attention + mlp + norms + masks


def _embedding_bytes(m: Shapes) -> float:
    e, s, h = m.itemsize, m.seq, m.hidden
    norm = (e * s * h + STATS_BYTES * s + s * h * m.dropout) if m.embedding_norm else 0
    return m.index_tensors * INDEX_BYTES * s + norm


def _head_bytes(m: Shapes) -> float:
    e, s, h = m.itemsize, m.seq, m.hidden
    transform = 2 * e * s * h if m.head_transform else 0
    norm = e * s * h + STATS_BYTES * s
    return transform + norm + e * s * h + e * s * m.vocab + INDEX_BYTES * s


def kept_bytes(m: Shapes) -> float:
    """Bytes per sample autograd keeps for backward."""
    return m.layers * _layer_bytes(m) + _embedding_bytes(m) + _head_bytes(m)


def logits_grad_bytes(m: Shapes) -> float:
    """The transient at the start of backward: the log-softmax output's and the logits' gradients."""
    return 2 * m.itemsize * m.seq * m.vocab


def peak_bytes(m: Shapes) -> float:
    """Bytes per sample at the peak of forward + backward (kept + the logits' gradients)."""
    return kept_bytes(m) + logits_grad_bytes(m)


def shapes_of(size: B.ModelSize) -> Shapes:
    """`experiments.bert.Encoder`'s shapes as it trains on the CPU: f32, dropout 0, attention
    fused, one index tensor, no embedding LayerNorm, a final LayerNorm and a linear head."""
    return Shapes(
        layers=size.layers,
        hidden=size.hidden,
        heads=size.heads,
        vocab=size.vocab,
        seq=size.seq,
        itemsize=4,
        dropout=False,
        flash=True,
        head_transform=False,
        embedding_norm=False,
        index_tensors=1,
    )


def measured_peak_bytes(module: torch.nn.Module, inputs, targets) -> int:
    """Peak bytes the CPU allocator held above its start during one forward + backward."""
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True) as prof:
        B.loss_of(module, inputs, targets).backward()
    module.zero_grad(set_to_none=True)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = top = 0
    for e in sorted(events, key=lambda e: e.start_ns()):  # stable: ties keep record order
        live += e.nbytes()
        top = max(top, live)
    return top


def measured_peak_per_sample(size: B.ModelSize, micro_batches=(4, 8), seed: int = 0) -> float:
    """(peak at the larger micro-batch - peak at the smaller) / their difference, bytes."""
    module = size.model(seed)
    lo, hi = micro_batches
    peaks = [measured_peak_bytes(module, *size.batch(seed, 0, 0, b)) for b in (lo, hi)]
    return (peaks[1] - peaks[0]) / (hi - lo)
