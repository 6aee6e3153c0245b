"""experiment=training's BERT (`experiment.model=bert_base`, experiments.bert_hf): the published
configuration and parameter count, the synthetic masked-token data, the parameter groups, and a
tiny BERT (2 layers, hidden 64) through the same path as BERT-base on 2 gloo ranks, whose loss
curves of DDP + AdamW, ZeRO and coconet.FusedAdamW agree.

BERT-base itself (109,514,298 parameters, ~3 s a step on this 2-core machine) is measured by
`python -m suite experiment=training experiment.model=bert_base` (docs: the training page), not
here.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from coconet.programs import SLICED
from experiments import MeasureSettings, training
from experiments import bert as B
from experiments import bert_hf as H
from suite.cli import prevalidate

transformers = pytest.importorskip("transformers")

TINY = H.BertSize(layers=2, hidden=64, heads=2, intermediate=256, seq=32, vocab=2048)
TINY_RTOL = 1e-5  # 8 steps of AdamW (float order only)


def test_the_published_configurations():
    # google-research/bert README / bert_config.json of uncased_L-12_H-768_A-12, -24_H-1024_A-16
    c = H.BERT_BASE.config()
    published = {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
    }
    assert {k: getattr(c, k) for k in published} == published
    large = H.BERT_LARGE.config()
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    assert large.intermediate_size == 4096
    assert H.BERT_BASE.parameters() == 109_514_298
    assert H.BERT_LARGE.parameters() == 335_174_458


@pytest.mark.parametrize("size", [TINY, dataclasses.replace(TINY, layers=3, hidden=96, heads=4)])
def test_the_parameter_count_is_the_models(size):
    model = size.model(0)
    assert sum(p.numel() for p in model.parameters()) == size.parameters()
    # the same weights from the same seed (every rank, every set-up)
    again = size.model(0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))


def test_no_weight_decay_on_biases_and_layer_norms_as_berts_recipe():
    model = TINY.model(0)
    groups = B.param_groups(model, training.HP_BERT["adamw"])
    emb, decayed, flat = groups
    assert flat["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    excluded = {n for n in names.values() if n.endswith("bias") or "LayerNorm.weight" in n}
    assert {names[id(p)] for p in flat["params"]} == excluded - {
        names[id(p)] for p in emb["params"]
    }
    assert {names[id(p)] for p in emb["params"]} == {
        "bert.bert.embeddings.word_embeddings.weight",  # tied to the decoder
        "bert.bert.embeddings.position_embeddings.weight",
        "bert.bert.embeddings.token_type_embeddings.weight",
    }
    counted = sum(len(g["params"]) for g in groups)
    assert counted == len(list(model.parameters()))


def test_masked_token_batches_as_berts_mlm():
    x, y = H.batch(TINY, 0, 3, 1, 64)
    x2, y2 = H.batch(TINY, 0, 3, 1, 64)
    assert torch.equal(x, x2) and torch.equal(y, y2)  # from (seed, step, rank) alone
    assert not torch.equal(H.batch(TINY, 0, 3, 0, 64)[0], x)
    assert x.shape == y.shape == (64, TINY.seq)
    assert (x[:, 0] == H.CLS).all() and (x[:, -1] == H.SEP).all()
    predicted = y != -100
    assert abs(predicted.float().mean().item() * TINY.seq / (TINY.seq - 2) - 0.15) < 0.02
    masked = x[predicted] == H.MASK
    kept = x[predicted] == y[predicted]
    assert abs(masked.float().mean().item() - 0.8) < 0.05
    assert abs(kept.float().mean().item() - 0.1) < 0.05  # (a random word may equal it)
    assert (x[~predicted] != H.MASK).all()
    assert ((y[predicted] >= H.FIRST_WORD) & (y[predicted] < TINY.vocab)).all()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_tiny_bert_trains_alike_under_ddp_zero_and_fused(tmp_path):
    training.MODELS["tiny"] = dataclasses.replace(
        training.MODELS["bert_base"],
        size=TINY,
        micro_batch=2,
        steps=8,
        rounds=1,
        cap_mb=64,
        hp={"adamw": {**training.HP_BERT["adamw"], "lr": 3e-3}},  # the loss falls in 8 steps
    )
    try:
        rows = training.measure(
            MeasureSettings(
                scale="smoke",
                model="tiny",
                max_elements=0,
                world_size=2,
                warmup=0,
                repeats=1,
                csv_path=tmp_path / "results.csv",
                kernels_dir=tmp_path / "kernels",
                timeout_s=300,
            )
        )
    finally:
        del training.MODELS["tiny"]
    df = pd.DataFrame(rows)
    loss = df[df.row_kind == "loss"].pivot(index="step", columns="schedule", values="loss")
    assert list(loss.columns.sort_values()) == sorted(["baseline", "zero_redundancy", SLICED])
    assert len(loss) == 8 and loss.baseline.iloc[-1] < loss.baseline.iloc[0]
    rel = (loss.sub(loss.baseline, axis=0).abs().div(loss.baseline, axis=0)).max().max()
    print(f"largest relative loss difference from DDP's: {rel:.1e}")
    assert rel <= TINY_RTOL
    steps = df[df.row_kind == "step"]
    assert set(steps.schedule) == set(loss.columns) and steps.verified.all()
    assert set(steps.micro_batch) == {2} and (df.optimizer == "adamw").all()
    assert set(df["size"]) == {TINY.parameters()}


def test_the_option_composes():
    assert prevalidate(["experiment=training"]).experiment.model is None
    cfg = prevalidate(["experiment=training", "experiment.model=bert_base"])
    assert cfg.experiment.model == "bert_base"
    assert set(training.MODELS) == {"bert_base", "bert_large", "wide"}


def test_an_unknown_model_is_named():
    with pytest.raises(ValueError, match="bert_base"):
        training.setting_of(
            MeasureSettings(
                scale="smoke",
                model="bert_huge",
                max_elements=0,
                world_size=2,
                warmup=0,
                repeats=1,
                csv_path=None,
                kernels_dir=None,
            )
        )
