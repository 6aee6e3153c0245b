"""conf/ against its schema (suite.config), composed in-process with Hydra's compose API.

Every option of every config group composes to a typed Config; typos, wrong types, unknown
options and impossible settings are SuiteErrors with one line naming the problem.
"""

from __future__ import annotations

import pytest

from suite import CONF_DIR
from suite.cli import prevalidate
from suite.config import Config
from suite.errors import SuiteError

GROUPS = ("experiment", "scale", "backend", "topology")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def test_every_group_has_options():
    assert {g for g, _ in OPTIONS} == set(GROUPS)
    assert {o for g, o in OPTIONS if g == "scale"} == {"smoke", "default", "paper"}
    assert {o for g, o in OPTIONS if g == "backend"} == {"cpu", "sim", "cuda"}
    assert {o for g, o in OPTIONS if g == "topology"} == {
        "local",
        "dgx2",
        "dgx_a100",
        "dgx_h100",
        "dgx_b200",
        "dgx1_v100",
        "dgx_h100_fattree",
        "aws_p4de",
        "aws_p5",
        "abci_v100",
        "abci_a100",
        "oci_h100_roce",
        "dgx_b200_roce",
    }


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_option_composes(group, option):
    cfg = prevalidate([f"{group}={option}"])
    assert isinstance(cfg, Config)
    assert getattr(cfg, group).name == option


def test_defaults():
    cfg = prevalidate([])
    assert (cfg.experiment.name, cfg.scale.name, cfg.backend.name, cfg.topology.name) == (
        "adam_fusion",
        "default",
        "cpu",
        "local",
    )
    assert cfg.verify.world_sizes == [2, 4] and cfg.world_size == 2 and cfg.seed == 0
    assert cfg.experiment.schedules is None and cfg.experiment.sizes is None


def test_trials_follow_scale_unless_overridden():
    assert prevalidate(["scale=smoke"]).verify.trials == 1
    assert prevalidate(["scale=paper"]).verify.trials == 5
    assert prevalidate(["scale=smoke", "verify.trials=7"]).verify.trials == 7


def test_typed_overrides():
    cfg = prevalidate(
        [
            "experiment=model_parallel",
            "experiment.sizes=[{B: 8, S: 1024, H: 3072, K: 3072}]",
            "experiment.schedules=[MM-AR-C]",
            "verify.world_sizes=[2,4,8]",
        ]
    )
    assert cfg.experiment.sizes == [{"B": 8, "S": 1024, "H": 3072, "K": 3072}]
    assert cfg.experiment.schedules == ["MM-AR-C"] and cfg.verify.world_sizes == [2, 4, 8]


def test_experiment_files_match_the_shipped_experiments():
    from experiments import names, registry

    # plus `paper`, which runs all of them (suite/paper.py), in the order its file lists
    assert sorted(o for g, o in OPTIONS if g == "experiment") == sorted(
        registry.SHIPPED + ("paper",)
    )
    assert set(registry.SHIPPED) <= set(names())
    runs = [r.name for r in prevalidate(["experiment=paper"]).experiment.runs]
    assert set(runs) <= set(registry.SHIPPED) and runs[0] == "calibrate" and len(runs) >= 6


BAD = [
    (
        ["experiment=nope"],
        "unknown experiment 'nope'; known: adam_fusion, autotune, calibrate, collectives, "
        "fsdp_prefetch, lamb_fusion, model_parallel, paper, pipeline_parallel, tensor_parallel, tp_attention",
    ),
    (
        ["experiment=training", "experiment.model=nope"],
        "experiment.model=nope is not a model of experiment=training",
    ),
    (["experiment=paper", "predict_also=[{name: dgx9}]"], "bad predict_also entry 'dgx9'"),
    (["predict_also=[{name: dgx2, nodes: 0}]"], "bad predict_also entry 'dgx2'"),
    (["scale=huge"], "unknown scale 'huge'; known: default, paper, smoke"),
    (["backend=tpu"], "unknown backend 'tpu'"),
    (["verify.trials=abc"], "verify.trials=abc"),
    (["world_size=two"], "world_size=two"),
    (["verify.world_sizes=[2,x]"], "'x'"),
    (["nonexistent_key=1"], "nonexistent_key"),
    (["+nonexistent_key=1"], "nonexistent_key"),
    (["experiment.typo=1"], "typo"),
    (["experiment.name=3"], "unknown experiment '3'"),
    (["scale.name=huge"], "unknown scale 'huge'"),
    (["experiment.sizes=[{N: big}]"], "big"),
    (["a=("], "bad override"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["world_size=0"], "world size 0 is impossible"),
    (["verify.world_sizes=[2,-1]"], "world size -1 is impossible"),
    (["verify.world_sizes=[]"], "verify.world_sizes is empty"),
    (["verify.trials=0"], "verify.trials=0"),
    (["-m", "experiment=adam_fusion,nope"], "unknown experiment 'nope'"),
    (["-m", "world_size=2,0"], "world size 0 is impossible"),
]


@pytest.mark.parametrize("argv,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line(argv, expected):
    with pytest.raises(SuiteError) as info:
        prevalidate(argv)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_sweeps_compose_every_job():
    cfg = prevalidate(["-m", "experiment=adam_fusion,lamb_fusion", "scale=smoke,paper"])
    assert cfg.experiment.name == "adam_fusion" and cfg.scale.name == "smoke"


@pytest.mark.parametrize("flag", ["--help", "--hydra-help", "--info", "--info=searchpath"])
def test_information_flags_are_left_to_hydra(flag):
    assert prevalidate([flag]) is None
