"""The cost model's speed benchmarks at a small scale (`python -m benchmarks.simulator` runs the
issue's sizes: 256 GPUs at 2^28 elements under 10 s, 1,000 closed-form evaluations under 1 s).
Bounds here are generous: CI machines are shared."""

from benchmarks.simulator import closed_form_seconds, des_seconds


def test_des_of_a_fused_adam_step_on_two_dgx2_nodes():
    secs, ms, rows = des_seconds(nodes=2, elements=1 << 22)
    assert ms > 0 and rows > 100
    assert secs < 10.0


def test_closed_form_evaluations():
    secs, n = closed_form_seconds(nodes=2, evaluations=200)
    assert n == 200 and secs < 2.0
