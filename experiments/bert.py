"""A small BERT-style encoder, its synthetic masked-token data, and the three data-parallel ways of
training it that experiment=training compares (all on one rank of a process group).

Model (`Encoder`): token + learned position embeddings, `torch.nn.TransformerEncoder` (post-norm,
GELU, 4H feed-forward, as BERT), a final LayerNorm and a linear masked-token head; random
initialisation from `seed`; dropout 0, so that two runs from the same initialisation and data
differ only by floating-point order. Sizes: `ModelSize(layers, hidden, heads, vocab, seq)`;
a size builds its model (`size.model(seed)`) and draws its data (`size.batch(seed, step, rank,
micro_batch)`), as `bert_hf.BertSize` does for BERT itself (`experiment.model=bert_base`); a
model names its embedding tables (`embeddings()`, for `param_groups`).

Data (`batch(size, seed, step, rank, micro_batch)`): synthetic sequences from a fixed random
first-order Markov chain over the vocabulary, skewed towards low token ids (learnable, so the
loss falls), 15% of positions (at least one a sequence, as BERT's pre-training data: a short
sequence would otherwise have nothing to predict, and its loss would be NaN)
replaced by the mask token 0 and predicted (cross-entropy over those positions only). Each rank
draws its own micro-batch of every step from (seed, step, rank): the same data for every config.

Configurations (`CONFIGS`), each `make(model, optimizer, hp, backend=None) -> (module, opt)`
(`backend`: the fused optimizers' `codegen.runtime.backend`, its transport; DDP uses gloo):
- `ddp`: torch DDP + `torch.optim.Adam(fused=True)` (or `LAMB`, below): DDP's bucketed
  all-reduce, the full optimizer state on every rank;
- `zero`: torch's `ZeroRedundancyOptimizer` over the same optimizer class, under DDP (the
  gradients all-reduced, the update of this rank's parameters, a broadcast of them);
- `fused`: the model unwrapped, `coconet.FusedAdam` / `coconet.FusedLAMB`;
- `fused_shm`: the same over shared memory (`comm=shm`), beside `fused` over gloo.
Optimizers: `adam`, `lamb`, and `adamw` (torch.optim.AdamW and `coconet.FusedAdamW`, with the
hp's weight decay and `amsgrad`).
`LAMB`: a torch optimizer (torch has none) with the update of `coconet.FusedLAMB`: per parameter
tensor, Adam's bias-corrected direction plus decoupled weight decay, times ||w|| / ||u||.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import coconet
from codegen.runtime.backend import CpuBackend

MASK = 0


@dataclass(frozen=True)
class ModelSize:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int

    def parameters(self) -> int:
        """Parameter count of `Encoder(self)` (without building it)."""
        h, v = self.hidden, self.vocab
        layer = 4 * h * h + 4 * h + 2 * (4 * h * h) + 4 * h + h + 4 * h  # attention, FFN, 2 norms
        return v * h + self.seq * h + self.layers * layer + 2 * h + h * v + v

    def model(self, seed: int) -> Encoder:
        return Encoder(self, seed)

    def batch(self, seed: int, step: int, rank: int, micro_batch: int):
        return batch(self, seed, step, rank, micro_batch)


class Encoder(nn.Module):
    def __init__(self, size: ModelSize, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        h = size.hidden
        self.tokens = nn.Embedding(size.vocab, h)
        self.positions = nn.Parameter(torch.randn(size.seq, h) * 0.02)
        layer = nn.TransformerEncoderLayer(
            h, size.heads, 4 * h, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, size.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(x)))

    def embeddings(self) -> list[nn.Parameter]:
        return [self.tokens.weight, self.positions]


def _chain(size: ModelSize, seed: int) -> torch.Tensor:
    """The Markov chain's transition matrix: each token has a few likely successors, and low
    token ids are likelier (a Zipf-like bias), so a model learns the frequencies within a few
    steps and the successors after that."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(size.vocab, size.vocab, generator=g) * 3.0
    logits -= 1.5 * torch.log(torch.arange(1, size.vocab + 1, dtype=torch.float32))
    return torch.softmax(logits, dim=1)


def batch(size: ModelSize, seed: int, step: int, rank: int, micro_batch: int):
    """(masked tokens [B, S], targets [B, S] with -100 where nothing is predicted)."""
    g = torch.Generator().manual_seed(hash((seed, step, rank)) & 0x7FFFFFFF)
    chain = _chain(size, seed)
    tok = torch.empty(micro_batch, size.seq, dtype=torch.long)
    tok[:, 0] = torch.randint(1, size.vocab, (micro_batch,), generator=g)
    for s in range(1, size.seq):
        tok[:, s] = torch.multinomial(chain[tok[:, s - 1]], 1, generator=g).squeeze(1)
    tok.clamp_(min=1)
    masked = torch.rand(micro_batch, size.seq, generator=g) < 0.15
    masked[:, 0] |= ~masked.any(dim=1)  # at least one position a sequence, as BERT's data
    inputs = tok.masked_fill(masked, MASK)
    targets = tok.masked_fill(~masked, -100)
    return inputs, targets


def loss_of(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = module(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_steps(
    module,
    opt,
    size: ModelSize,
    seed: int,
    rank: int,
    start: int,
    n: int,
    micro_batch: int,
    sched=None,
    clip: float | None = None,
) -> list[float]:
    """Steps start .. start+n-1 of this rank's synthetic batches (`size.batch`; dropout, where
    the model has it, from a seed of (seed, step, rank): the same masks for every set-up, the
    global generator left as it was): forward, backward, the
    gradients clipped to norm `clip` where given (the averaged gradient's norm, as DDP's training
    clips it: `FusedOptimizer.clip_grad_norm`, else torch's on DDP's averaged gradients), the
    optimizer's step (and the scheduler's); the losses, one a step."""
    losses = []
    for s in range(start, start + n):
        x, y = size.batch(seed, s, rank, micro_batch)
        opt.zero_grad()
        with torch.random.fork_rng(devices=[]):  # dropout's masks: those of (step, rank)
            torch.manual_seed(hash((seed, s, rank, 1)) & 0x7FFFFFFF)
            loss = loss_of(module, x, y)
            loss.backward()
        if clip is not None and isinstance(opt, coconet.FusedOptimizer):
            opt.clip_grad_norm(clip)
        elif clip is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


class LAMB(torch.optim.Optimizer):
    """LAMB in torch, per parameter tensor (the update `coconet.FusedLAMB` generates)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(
            params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                st = self.state[p]
                if not st:
                    st.update(
                        step=torch.tensor(0.0),
                        exp_avg=torch.zeros_like(p),
                        exp_avg_sq=torch.zeros_like(p),
                    )
                st["step"] += 1
                t = float(st["step"])
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                u = (m / (1 - b1**t)).div_((v / (1 - b2**t)).sqrt_().add_(group["eps"]))
                u.add_(p, alpha=group["weight_decay"])
                r_w = torch.linalg.vector_norm(p, dtype=torch.float64).float()
                r_u = torch.linalg.vector_norm(u, dtype=torch.float64).float()
                trust = torch.where((r_w > 0) & (r_u > 0), r_w / r_u, torch.ones(()))
                p.sub_(group["lr"] * trust * u)


def torch_optimizer(optimizer: str, params, hp: dict, **extra):
    if optimizer == "adam":
        return torch.optim.Adam(
            params, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], fused=True, **extra
        )
    if optimizer == "adamw":
        return torch.optim.AdamW(params, fused=True, **_adamw(hp), **extra)
    return LAMB(
        params,
        lr=hp["lr"],
        betas=hp["betas"],
        eps=hp["eps"],
        weight_decay=hp["weight_decay"],
        **extra,
    )


def _ddp(model, optimizer, hp, backend=None):
    return DDP(model), torch_optimizer(optimizer, param_groups(model, hp), hp)


def _zero(model, optimizer, hp, backend=None):
    from torch.distributed.optim import ZeroRedundancyOptimizer  # 0.6 s to import: when used

    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(optimizer, LAMB)
    kw = {
        "adam": {"fused": True},
        "adamw": {
            "fused": True,
            "weight_decay": hp["weight_decay"],
            "amsgrad": bool(hp.get("amsgrad")),
        },
    }.get(optimizer, {"weight_decay": hp["weight_decay"]})
    first, *rest = param_groups(model, hp)
    opt = ZeroRedundancyOptimizer(
        first["params"], optimizer_class=cls, lr=first["lr"], betas=hp["betas"], eps=hp["eps"], **kw
    )
    for g in rest:
        opt.add_param_group({**g, "lr": g.get("lr", hp["lr"])})
    return DDP(model), opt


def _adamw(hp: dict) -> dict:
    keys = ("lr", "betas", "eps", "weight_decay")
    return {**{k: hp[k] for k in keys}, "amsgrad": hp.get("amsgrad", False)}


def _fused(model, optimizer, hp, backend="cpu"):
    if optimizer == "adamw":
        opt = coconet.FusedAdamW(param_groups(model, hp), backend=backend or "cpu", **_adamw(hp))
        return model, opt
    cls = coconet.FusedAdam if optimizer == "adam" else coconet.FusedLAMB
    kw = {"backend": backend or "cpu"}
    if optimizer == "lamb":
        kw["weight_decay"] = hp["weight_decay"]
    return model, cls(param_groups(model, hp), lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], **kw)


def _fused_shm(model, optimizer, hp, backend=None):
    """`fused` over shared memory (ranks on one host), whatever transport the others use."""
    return _fused(model, optimizer, hp, backend=CpuBackend(comm="shm"))


CONFIGS = {"ddp": _ddp, "zero": _zero, "fused": _fused, "fused_shm": _fused_shm}


def param_groups(model: nn.Module, hp: dict) -> list[dict]:
    """Groups as BERT recipes make them: embeddings at `embedding_lr_scale` x lr, the rest; with
    `hp["no_decay"]`, the rest's biases and norms (1-d tensors) in a third group without weight
    decay (in `bert_hf.MaskedLM` the 1-d tensors are exactly the `bias` and `LayerNorm.weight`
    that BERT's recipes exclude). `model.embeddings()`: the embedding tables."""
    emb = model.embeddings()
    ids = {id(p) for p in emb}
    rest = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": emb, "lr": hp["lr"] * hp.get("embedding_lr_scale", 1.0)}]
    if not hp.get("no_decay"):
        return groups + [{"params": rest}]
    flat = [p for p in rest if p.dim() == 1]
    return groups + [
        {"params": [p for p in rest if p.dim() != 1]},
        {"params": flat, "weight_decay": 0.0},
    ]


def activation_bytes(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of one forward at this micro-batch: the distinct
    storages of the tensors saved for backward (`saved_tensors_hooks`), parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(module, inputs, targets)
    loss.backward()
    module.zero_grad(set_to_none=True)
    return sum(seen.values())


def memory_bytes(module: nn.Module, opt) -> dict[str, int]:
    """This rank's bytes besides activations, from tensor sizes: parameters, gradients, the
    communication buffers (DDP's gradient buckets: one copy of the gradients, torch's default
    gradient_as_bucket_view=False; the fused step's Plan buffers: its gradients are views of its
    buckets already) and the optimizer state (`state_bytes`)."""
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    comm = opt.buffer_bytes() if isinstance(opt, coconet.FusedOptimizer) else params
    return {"params": params, "grads": params, "comm": comm, "state": state_bytes(opt)}


def state_bytes(opt) -> int:
    """Optimizer-state bytes this rank holds (tensors in its state; for ZeRO its shard's)."""
    if isinstance(opt, coconet.FusedOptimizer):
        return opt.state_bytes()
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer: its shard's optimizer
    return sum(
        t.numel() * t.element_size()
        for st in inner.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
