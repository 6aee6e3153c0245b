"""BERT itself for experiment=training (`experiment.model=bert_base`): Hugging Face's
`transformers.BertForMaskedLM` built from BERT's published configuration, randomly initialised
(nothing is downloaded), and synthetic masked-token batches as BERT's pre-training makes them.

Configurations (`BertSize`; google-research/bert, README.md and the `bert_config.json` of
`uncased_L-12_H-768_A-12` / `uncased_L-24_H-1024_A-16`): vocabulary 30522, 512 positions, 2 token
types, GELU, dropout 0.1 (hidden and attention), layer-norm epsilon 1e-12, initializer range 0.02;
- `BERT_BASE`: 12 layers, hidden 768, 12 heads, intermediate 3072 (109,514,298 parameters with
  the masked-LM head, its decoder tied to the word embeddings; no pooler);
- `BERT_LARGE`: 24 layers, hidden 1024, 16 heads, intermediate 4096 (335,174,458): a
  configuration only, too large to train on a 2-core machine.
`seq` is the training sequence length (<= 512; 128 as BERT's phase-1 pre-training).

`BertSize.model(seed)` -> `MaskedLM` (an `nn.Module`: int64 tokens [B, S] -> logits [B, S, V]):
the same weights on every rank and for every set-up from `seed`. `transformers` is imported
there, so only a run that chooses this model needs it (`pip install '.[bert]'`).

`BertSize.batch(seed, step, rank, micro_batch)` -> (inputs [B, S], targets [B, S]): `[CLS]`,
S - 2 word-piece ids, `[SEP]`; the words follow a fixed random rule (a Zipf-distributed first
word; each next word is, with probability 3/4, one of two successors of the previous one that the
rule fixes, else a fresh Zipf draw), so the loss falls. BERT's masking: 15% of the non-special
positions are predicted (targets: the original id there, -100 elsewhere), and of those 80% become
`[MASK]`, 10% a random word, 10% stay. Drawn from (seed, step, rank) alone: every set-up sees the
same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103  # the uncased vocabulary's special ids
FIRST_WORD = 999  # ids below are [unused*] and special tokens; words are FIRST_WORD .. vocab-1
MASK_RATE, FOLLOW_RATE = 0.15, 0.75


@dataclass(frozen=True)
class BertSize:
    """BERT's architecture numbers (`BertConfig`'s names) and the training sequence length."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    seq: int = 128
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12

    def parameters(self) -> int:
        """Parameter count of `BertForMaskedLM` at this size (the decoder weight tied)."""
        h, i, v = self.hidden, self.intermediate, self.vocab
        embeddings = (v + self.max_positions + self.type_vocab) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + 2 * h * i + i + h + 2 * h  # attention, FFN, 2 norms
        head = h * h + h + 2 * h + v  # transform, its norm, the decoder's bias
        return embeddings + self.layers * layer + head

    def config(self):
        from transformers import BertConfig  # the optional dependency: only where chosen

        return BertConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            intermediate_size=self.intermediate,
            hidden_act="gelu",
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.dropout,
            max_position_embeddings=self.max_positions,
            type_vocab_size=self.type_vocab,
            initializer_range=0.02,
            layer_norm_eps=self.layer_norm_eps,
            pad_token_id=PAD,
        )

    def model(self, seed: int) -> MaskedLM:
        return MaskedLM(self, seed)

    def batch(self, seed: int, step: int, rank: int, micro_batch: int):
        return batch(self, seed, step, rank, micro_batch)


BERT_BASE = BertSize(layers=12, hidden=768, heads=12, intermediate=3072)
BERT_LARGE = BertSize(layers=24, hidden=1024, heads=16, intermediate=4096)


class MaskedLM(nn.Module):
    """`BertForMaskedLM` from `size.config()`, initialised from `seed`; tokens -> logits."""

    def __init__(self, size: BertSize, seed: int):
        super().__init__()
        from transformers import BertForMaskedLM

        torch.manual_seed(seed)
        self.bert = BertForMaskedLM(size.config())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=tokens).logits

    def embeddings(self) -> list[nn.Parameter]:
        """The word (tied to the decoder), position and token-type embeddings."""
        e = self.bert.bert.embeddings
        return [
            e.word_embeddings.weight,
            e.position_embeddings.weight,
            e.token_type_embeddings.weight,
        ]


def _words(size: BertSize, n: int, g: torch.Generator) -> torch.Tensor:
    """n Zipf-distributed word ids (rank r of the words drawn with weight 1 / r)."""
    words = size.vocab - FIRST_WORD
    u = torch.rand(n, generator=g)
    return FIRST_WORD + (torch.exp(u * torch.log(torch.tensor(float(words)))) - 1).long()


def _successor(size: BertSize, tok: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """One of the two successors the rule fixes for each word (which: 0 or 1)."""
    words = size.vocab - FIRST_WORD
    a = torch.where(which == 0, 7919, 104729)
    return FIRST_WORD + ((tok - FIRST_WORD) * a + 17) % words


def batch(size: BertSize, seed: int, step: int, rank: int, micro_batch: int):
    """(inputs [B, S], targets [B, S] with -100 where nothing is predicted); see the module doc."""
    g = torch.Generator().manual_seed(hash((seed, step, rank)) & 0x7FFFFFFF)
    b, s = micro_batch, size.seq
    tok = torch.empty(b, s, dtype=torch.long)
    tok[:, 0], tok[:, -1] = CLS, SEP
    tok[:, 1] = _words(size, b, g)
    for i in range(2, s - 1):
        follow = torch.rand(b, generator=g) < FOLLOW_RATE
        which = torch.randint(0, 2, (b,), generator=g)
        tok[:, i] = torch.where(follow, _successor(size, tok[:, i - 1], which), _words(size, b, g))
    special = (tok == CLS) | (tok == SEP)
    predicted = (torch.rand(b, s, generator=g) < MASK_RATE) & ~special
    how = torch.rand(b, s, generator=g)
    random_words = torch.randint(FIRST_WORD, size.vocab, (b, s), generator=g)
    inputs = torch.where(predicted & (how < 0.8), MASK, tok)
    inputs = torch.where(predicted & (how >= 0.8) & (how < 0.9), random_words, inputs)
    targets = tok.masked_fill(~predicted, -100)
    return inputs, targets
