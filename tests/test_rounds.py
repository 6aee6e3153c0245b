"""Interleaved rounds (experiments.rounds): the bootstrap interval of a median, the pairing of
speedups per round, and the rank loop on 2 gloo ranks: the same random order on every rank and a
fresh one each round, a known speedup recovered, and the stop reasons (converged, budget)."""
import time

import numpy as np
import pytest

from codegen.runtime.backend import WallClock
from codegen.runtime.launch import launch
from experiments.rounds import Budget, bootstrap_median, converged, interleave, paired


def test_bootstrap_interval_holds_the_median_and_narrows_with_samples():
    rng = np.random.default_rng(1)
    few = bootstrap_median(1.0 + 0.1 * rng.standard_normal(20))
    many = bootstrap_median(1.0 + 0.1 * rng.standard_normal(2000))
    assert few.lo <= few.median <= few.hi and many.lo <= many.median <= many.hi
    assert many.halfwidth_pct < few.halfwidth_pct / 3
    assert abs(many.median - 1.0) < 0.01
    assert bootstrap_median([2.0]) == bootstrap_median([2.0])  # one sample: a point interval
    assert bootstrap_median([1, 2, 3, 4], key=(7,)) == bootstrap_median([1, 2, 3, 4], key=(7,))


def test_speedups_are_paired_per_round():
    base = [10.0, 20.0, 10.0, 20.0]  # the machine drifts by 2x between rounds ...
    fast = [5.0, 10.0, 5.0, 10.0]  # ... and the schedule with it: paired, exactly x2
    assert list(paired(base, fast)) == [2.0, 2.0, 2.0, 2.0]
    assert converged({"baseline": base, "fast": fast}, (0,), 2.5)
    assert not converged({"baseline": base, "fast": [5.0, 20.0, 5.0, 10.0]}, (0,), 2.5)


def _orders(rank, world):
    seen = []
    fns = {n: (lambda n=n: seen.append(n)) for n in ("baseline", "a", "b", "c")}
    r = interleave(fns, Budget(warmup=0, min_rounds=6, max_rounds=6, budget_s=60), key=(3, 1024),
                   clock=WallClock())
    return seen, r.rounds, r.calls


def test_every_rank_runs_the_same_fresh_order_each_round():
    (a, rounds, calls), (b, _, _) = launch(_orders, 2, timeout_s=120)
    assert a == b  # the same order on both ranks
    per_round = len(a[4:]) // rounds  # after one warm-up call each
    assert calls >= 1 and rounds == 6
    orders = {tuple(dict.fromkeys(a[4 + i * per_round:4 + (i + 1) * per_round]))
              for i in range(rounds)}
    assert len(orders) > 1  # not the same order every round


def _sleepy(rank, world, budget):
    fns = {"baseline": lambda: time.sleep(0.012), "half": lambda: time.sleep(0.006)}
    r = interleave(fns, budget, key=(0,), clock=WallClock())
    return r.speedup("half"), r.stopped, r.rounds


@pytest.mark.parametrize("budget,stopped", [
    (Budget(warmup=1, min_rounds=5, max_rounds=200, budget_s=30.0, ci_pct=10.0), "converged"),
    (Budget(warmup=1, min_rounds=5, max_rounds=10_000, budget_s=0.5, ci_pct=1e-9), "budget"),
])
def test_a_known_speedup_and_the_stop_reasons(budget, stopped):
    (x, how, rounds), (x1, how1, rounds1) = launch(_sleepy, 2, args=(budget,), timeout_s=120)
    assert (x, how, rounds) == (x1, how1, rounds1)  # every rank decided alike
    assert how == stopped and rounds >= 5
    assert 1.5 < x.median < 2.3 and x.lo <= x.median <= x.hi
