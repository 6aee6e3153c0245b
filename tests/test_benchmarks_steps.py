"""benchmarks.steps: its summary's statistics (pure), and one small run on 2 ranks."""
import numpy as np

from benchmarks.steps import main, summary


def _res(parts, whole, kinds):
    return {"parts": {"s": parts}, "whole": {"s": whole}, "first": {"s": whole[:1]},
            "later": {"s": whole[1:]}, "kinds": {"s": kinds}}


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


def test_a_small_run_on_two_ranks(capsys):
    main(["--schedules", "RS-C-AG,AR-C", "--size", "N=4K", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "adam_fusion at N=4K on 2 ranks, 2 rounds of 3 calls" in out
    rows = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert set(rows) == {"RS-C-AG", "AR-C"}
    assert "reduce_scatter" in rows["RS-C-AG"] and "all_gather" in rows["RS-C-AG"]
    assert "all_reduce" in rows["AR-C"]
