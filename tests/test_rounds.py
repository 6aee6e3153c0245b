"""Interleaved rounds (experiments.rounds): the bootstrap interval of a median, the pairing of
speedups per round, and the rank loop on 2 gloo ranks: the same random order on every rank and a
fresh one each round, a known speedup recovered, and the stop reasons (converged, budget)."""

import statistics
import time
from types import SimpleNamespace

import numpy as np
import pytest

from codegen.runtime.backend import WallClock
from codegen.runtime.launch import launch
from experiments.harness import _per_call
from experiments.rounds import (
    LONG_CALL_MS,
    MIN_CALLS,
    Budget,
    bootstrap_median,
    converged,
    interleave,
    needs_untimed,
    out_of_time,
    paired,
    untimed_calls,
)


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
    # a function timed aside (a memory probe) is not held to the target
    noisy = {"baseline": base, "fast": fast, "probe": [5.0, 20.0, 5.0, 10.0]}
    assert not converged(noisy, (0,), 2.5)
    assert converged(noisy, (0,), 2.5, aside=("probe",))
    assert converged(noisy, (0,), 2.5, baseline=None, aside=("probe", "baseline", "fast"))


def _orders(rank, world):
    seen = []
    fns = {n: (lambda n=n: seen.append(n)) for n in ("baseline", "a", "b", "c")}
    r = interleave(
        fns,
        Budget(warmup=0, min_rounds=6, max_rounds=6, budget_s=60),
        key=(3, 1024),
        clock=WallClock(),
    )
    return seen, r.rounds, r.calls


@pytest.mark.slow
def test_every_rank_runs_the_same_fresh_order_each_round():
    (a, rounds, calls), (b, _, _) = launch(_orders, 2, timeout_s=120)
    assert a == b  # the same order on both ranks
    per_round = len(a[4:]) // rounds  # after one warm-up call each
    assert min(calls.values()) >= 1 and rounds == 6
    orders = {
        tuple(dict.fromkeys(a[4 + i * per_round : 4 + (i + 1) * per_round])) for i in range(rounds)
    }
    assert len(orders) > 1  # not the same order every round


def _sleepy(rank, world, budget):
    fns = {"baseline": lambda: time.sleep(0.012), "half": lambda: time.sleep(0.006)}
    r = interleave(fns, budget, key=(0,), clock=WallClock())
    return r.speedup("half"), r.stopped, r.rounds


@pytest.mark.parametrize(
    "budget,stopped",
    [
        (Budget(warmup=1, min_rounds=5, max_rounds=200, budget_s=30.0, ci_pct=10.0), "converged"),
        (Budget(warmup=1, min_rounds=5, max_rounds=10_000, budget_s=0.5, ci_pct=1e-9), "budget"),
    ],
)
@pytest.mark.slow
def test_a_known_speedup_and_the_stop_reasons(budget, stopped):
    (x, how, rounds), (x1, how1, rounds1) = launch(_sleepy, 2, args=(budget,), timeout_s=120)
    assert (x, how, rounds) == (x1, how1, rounds1)  # every rank decided alike
    assert how == stopped and rounds >= 5
    assert 1.5 < x.median < 2.3 and x.lo <= x.median <= x.hi


@pytest.mark.slow
def test_a_long_step_point_goes_on_past_the_budget_to_long_rounds():
    """Rounds of these two sleeps take 36 ms and more: 0.2 s holds at most 5, so the point goes
    on past budget_s until it has long_rounds (well inside long_budget_s)."""
    budget = Budget(
        warmup=1,
        min_rounds=2,
        max_rounds=10_000,
        budget_s=0.2,
        ci_pct=1e-9,
        long_rounds=20,
        long_budget_s=60.0,
    )
    (x, how, rounds), same = launch(_sleepy, 2, args=(budget,), timeout_s=120)
    assert (x, how, rounds) == same and how == "budget" and rounds == 20


def test_out_of_time_extends_the_budget_only_for_points_short_of_long_rounds():
    b = Budget(budget_s=15.0, long_rounds=40, long_budget_s=60.0)
    assert not out_of_time(14.0, 3, b)  # inside the budget: never
    assert out_of_time(16.0, 95, b)  # short steps: enough rounds by budget_s, stop there
    assert not out_of_time(16.0, 11, b) and not out_of_time(59.0, 39, b)  # long: go on ...
    assert out_of_time(55.0, 40, b) and out_of_time(61.0, 30, b)  # ... to 40 rounds or 60 s
    assert out_of_time(16.0, 11, Budget(budget_s=15.0))  # no extension by default


def test_calls_per_sample():
    from experiments.rounds import MAX_CALLS, MIN_CALLS, calls_for

    assert calls_for(12.0) == 1
    assert calls_for(4.0) == MIN_CALLS  # a statistic of several, not of 2
    assert calls_for(0.1) == 50 and calls_for(1e-4) == MAX_CALLS


def _stamped(rank, world):
    """Rank 1's calls take 20 ms, rank 0's 1 ms; every third call of rank 0 is 'stalled'."""
    from experiments.rounds import sample_ms

    spans, n = [], [0]

    def fn():
        t0 = time.monotonic()
        n[0] += 1
        time.sleep(0.020 if rank == 1 else (0.015 if n[0] % 3 == 0 else 0.001))
        spans.append((t0, time.monotonic()))

    got = sample_ms(fn, 6, WallClock())
    return got, spans


@pytest.mark.slow
def test_a_sample_times_each_call_alone_after_a_barrier():
    """Never back to back: each call of a sample starts after every rank ended the one before
    (a barrier between), is timed alone, and the sample is the median of those times."""
    (ms0, spans0), (_, spans1) = launch(_stamped, 2, timeout_s=120)
    assert len(spans0) == len(spans1) == 6
    for k in range(1, 6):  # rank 0's call k waited for rank 1's call k-1 to end
        assert spans0[k][0] >= spans1[k - 1][1] - 1e-3
    assert 1.0 <= ms0 < 8.0  # its own calls' time: 4 of 6 quick, 2 'stalled' (15 ms)


def _collectives_alone(rank, world):
    fns = {"a": lambda: time.sleep(0.002), "b": lambda: time.sleep(0.008)}
    r = interleave(
        fns,
        Budget(warmup=1, min_rounds=4, max_rounds=50, budget_s=30.0, ci_pct=20.0),
        key=(0,),
        clock=WallClock(),
        baseline=None,
    )
    return r.stopped, r.time("a").median, r.time("b").median, r.calls


@pytest.mark.slow
def test_times_without_a_baseline_converge_on_their_own_intervals():
    (stopped, a, b, calls), _ = launch(_collectives_alone, 2, timeout_s=120)
    assert stopped == "converged"
    assert 1.9 < a < 3.5 and 7.9 < b < 10.5
    # calls per sample, from one warm-up call: 8 ms is one; 2 ms is MIN_CALLS, or one where that
    # call overslept past MIN_SAMPLE_MS (a loaded VM's 4 ms tick: a 3-4 ms sleep once took 5 ms)
    assert calls["b"] == 1 and calls["a"] in (MIN_CALLS, 1)


def test_a_rows_compute_is_the_median_calls_not_the_mean():
    """experiments.harness counts each call's compute_ms: a call a busy machine preempted (here
    50 ms among 1 ms calls) moves a mean, not the median the row reports, as its time's."""
    obj = SimpleNamespace(compute_ms=0.0, library_ms=0.0)
    costs = iter([1.0, 1.0, 50.0, 1.0, 2.0])

    def step():
        c = next(costs)
        obj.compute_ms += c
        obj.library_ms += c / 2

    call, samples = _per_call(obj, step, library=True)
    for _ in range(5):
        call()
    assert samples["compute_ms"] == [1.0, 1.0, 50.0, 1.0, 2.0]
    assert statistics.median(samples["compute_ms"]) == 1.0
    assert statistics.median(samples["library_ms"]) == 0.5


def _first_call_slow(rank, world):
    """Two functions whose first call after the other one is slow (20 ms, else 2 ms: the slow one
    under LONG_CALL_MS; far apart, so that a loaded machine's delays cannot make one look like
    the other)."""
    last, calls = [None], {"baseline": 0, "other": 0}

    def make(name):
        def fn():
            time.sleep(0.020 if last[0] != name else 0.002)
            last[0] = name
            calls[name] += 1

        return fn

    r = interleave(
        {n: make(n) for n in calls},
        Budget(warmup=0, min_rounds=3, max_rounds=3, budget_s=60),
        key=(1,),
        clock=WallClock(),
    )
    return r.times_ms, r.calls, calls


@pytest.mark.slow
def test_a_sample_never_takes_the_first_call_after_another_function():
    """Each sample follows an untimed call of its own function: a step's first call after another
    schedule ran slower, and a one-call sample (a step of 5 ms and more) always took it."""
    (times, per_sample, calls), _ = launch(_first_call_slow, 2, timeout_s=120)
    assert per_sample == {"baseline": 1, "other": 1}  # 20 ms at the warm-up: one call a sample
    assert calls == {"baseline": 1 + 3 * 2, "other": 1 + 3 * 2}  # warm-up, (untimed + timed) x 3
    assert all(1.0 < t < 14.0 for ts in times.values() for t in ts)  # never the 20 ms call


def _long_calls(rank, world, short_s):
    """A function of 1.2 LONG_CALL_MS a call beside one of `short_s` seconds, 3 rounds: how often
    each is called."""
    calls = {"baseline": 0, "other": 0}

    def make(name, s):
        def fn():
            time.sleep(s)
            calls[name] += 1

        return fn

    r = interleave(
        {"baseline": make("baseline", short_s), "other": make("other", LONG_CALL_MS / 1e3 * 1.2)},
        Budget(warmup=1, min_rounds=3, max_rounds=3, budget_s=60),
        key=(2,),
        clock=WallClock(),
    )
    return r.calls, calls


@pytest.mark.slow
def test_a_point_of_long_calls_is_sampled_without_untimed_calls():
    """Calls of LONG_CALL_MS and more have no slow first call to leave out: where every function
    of a point is that long, samples follow no untimed call (half the time a round)."""
    per_sample, calls = launch(_long_calls, 2, args=(LONG_CALL_MS / 1e3 * 1.5,), timeout_s=120)[0]
    assert per_sample == {"baseline": 1, "other": 1}
    assert calls == {"baseline": 1 + 3, "other": 1 + 3}  # warm-up, then a sample a round
    assert needs_untimed(LONG_CALL_MS - 1) and not needs_untimed(LONG_CALL_MS)


@pytest.mark.slow
def test_a_point_with_a_short_call_keeps_the_untimed_calls_of_all_its_functions():
    """One rule for a point: a short function beside a long one, and both take an untimed call
    before each sample, so that their paired samples are taken alike."""
    per_sample, calls = launch(_long_calls, 2, args=(0.002,), timeout_s=120)[0]
    assert per_sample["other"] == 1
    assert calls == {"baseline": 1 + 3 * (1 + per_sample["baseline"]), "other": 1 + 3 * 2}


def test_an_aside_probe_follows_its_own_untimed_rule_not_the_points():
    """A probe timed aside (compared with calibration's benchmark, not paired) is sampled as
    calibration samples that benchmark, by its own warm-up; it does not give the compared
    functions of a long point untimed calls, nor take theirs."""
    long_, short = LONG_CALL_MS * 2, LONG_CALL_MS / 5
    names = ("baseline", "AR-C", "comm_probe")
    assert untimed_calls(names, (long_, long_, short), aside=("comm_probe",)) == {
        "baseline": False,
        "AR-C": False,
        "comm_probe": True,
    }
    assert untimed_calls(names, (long_, short, long_), aside=("comm_probe",)) == {
        "baseline": True,
        "AR-C": True,
        "comm_probe": False,
    }
    # not aside: one rule for all three
    assert set(untimed_calls(names, (long_, long_, short)).values()) == {True}
