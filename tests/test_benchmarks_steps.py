"""benchmarks.steps: its summary's statistics (pure), which Plan step each timed piece belongs
to, and small runs on 2 ranks (the segments and the model beside them too)."""

from pathlib import Path

import numpy as np
import pytest

import experiments
from benchmarks.steps import _owner, main, schedule_names, segments_table, step_of, summary
from codegen.lower import lower
from codegen.plan import label


def _res(parts, whole, kinds):
    return {
        "parts": {"s": parts},
        "whole": {"s": whole},
        "first": {"s": whole[:1]},
        "later": {"s": whole[1:]},
        "kinds": {"s": kinds},
    }


def test_the_sum_of_tailed_parts_lies_above_the_sum_of_their_medians():
    # four collectives each 1 ms, stalled by 4 ms in 30% of calls: the median of their sum
    # carries a stall, the sum of their medians none
    rng = np.random.default_rng(0)
    parts = [list(1.0 + 4.0 * (rng.random(400) < 0.3)) for _ in range(4)]
    whole = list(np.sum(parts, axis=0))
    line = summary(_res(parts, whole, ["Collective all_gather"] * 4), ["s"]).splitlines()[1]
    step, sum_of_parts, independent = (float(x) for x in line.split()[1:4])
    assert sum_of_parts == 4.0
    assert step == independent == 8.0
    assert "all_gather 0.3" in line  # each part's tail share, 0.28-0.32 here


@pytest.mark.slow
def test_a_small_run_on_two_ranks(capsys):
    main(["--schedules", "RS-C-AG,AR-C", "--size", "N=4K", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "adam_fusion at N=4K on 2 ranks, 2 rounds of 3 calls" in out
    rows = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert set(rows) == {"RS-C-AG", "AR-C"}
    assert "reduce_scatter" in rows["RS-C-AG"] and "all_gather" in rows["RS-C-AG"]
    assert "all_reduce" in rows["AR-C"]


def test_pieces_sum_their_medians():
    rng = np.random.default_rng(1)
    pieces = 1.0 + 4.0 * (rng.random((400, 4)) < 0.3)  # four pieces of one fused step
    whole = list(pieces.sum(axis=1))
    res = _res([whole], whole, ["FusedCollective fused"])
    res["pieces"] = {"s": pieces}
    res["labels"] = {"s": tuple(f"0:Collective reduce_scatter wait c{c}" for c in range(4))}
    line = summary(res, ["s"]).splitlines()[1]
    step, sum_of_parts, independent, sum_of_pieces = (float(x) for x in line.split()[1:5])
    assert sum_of_pieces == 4.0 and step == sum_of_parts == 8.0
    table = segments_table(res, "s")
    assert "reduce_scatter wait c3" in table and "400 calls" in table


def test_segments_belong_to_their_plan_step():
    plan = lower(
        experiments.get("lamb_fusion").schedules()["fuse(RS-C-AG)+as_slice"],
        {"N": 4096},
        2,
        fused_chunks=4,
    )
    owners = step_of(plan)
    assert _owner("0:Collective reduce_scatter wait c0", owners) == 0
    assert _owner(f"{label(plan.steps[0])}", owners) == 0
    assert _owner(f"{label(plan.steps[0].steps[4])} c3", owners) == 0
    with pytest.raises(ValueError, match="names no step"):
        _owner("99:Compute nothing c0", owners)


@pytest.mark.slow
def test_segments_and_the_model_on_two_ranks(capsys):
    topo = Path(__file__).resolve().parents[1] / "suite" / "conf" / "topology" / "local.yaml"
    main(
        [
            "--experiment",
            "lamb_fusion",
            "--schedules",
            "fuse(RS-C-AG)+as_slice,AR-C",
            "--size",
            "N=4K",
            "--rounds",
            "2",
            "--segments",
            "--topology",
            str(topo),
        ]
    )
    out = capsys.readouterr().out
    assert "model" in out.splitlines()[1]
    assert "model, fuse(RS-C-AG)+as_slice: on the lone links" in out
    assert "fuse(RS-C-AG)+as_slice: 6 calls" in out and "all_gather send c3" in out
    assert "AR-C: 6 calls" in out


def test_schedule_names_keep_commas_inside_parentheses():
    assert schedule_names("ol(RS,fuse(P2P-C-AG)), AR-C-P2P,") == [
        "ol(RS,fuse(P2P-C-AG))",
        "AR-C-P2P",
    ]
    assert schedule_names("ol(MM,fuse(RS-C-AG))") == ["ol(MM,fuse(RS-C-AG))"]


def test_an_unknown_schedule_is_refused_before_any_rank_starts(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--schedules", "AR-C,nope"])
    assert e.value.code == 2
    assert "adam_fusion has no schedule 'nope'" in capsys.readouterr().err
