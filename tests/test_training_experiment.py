"""experiment=training: its pieces (the bootstrap interval, the predicted Table 1) and one short
measurement on 2 gloo ranks read back by its report section.

The measurement here is shortened (4 loss steps, 2 timed rounds of 1 step) to keep the test
quick; `python -m suite experiment=training scale=smoke` runs the full 50 steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from coconet.programs import PUBLISHED, SLICED
from cost_model.topology import load_topology
from experiments import MeasureSettings, training
from experiments.predict import paper_result_rows
from experiments.table1 import predict_table1
from reports.results import append_row
from reports.training import training_section


def test_median_ci_brackets_the_median_and_collapses_on_constant_data():
    assert training.median_ci([3.0] * 7) == (3.0, 3.0, 3.0)
    xs = np.random.default_rng(1).normal(10, 1, 40)
    med, lo, hi = training.median_ci(xs)
    assert lo < med < hi and hi - lo < 1.5


def test_predicted_table1_rows_for_the_report():
    """The rows the report renders (their content: tests/test_table1.py)."""
    rows = predict_table1(load_topology("dgx2", nodes=16), 256)
    assert {r["row_kind"] for r in rows} == {"table1"} and len(rows) == 3 * 2 * 2
    assert {r["schedule"] for r in rows} == {"baseline", PUBLISHED}


def test_the_papers_range_is_beside_it():
    (paper,) = paper_result_rows("training")
    assert (paper["speedup"], paper["speedup_max"]) == (1.22, 1.52)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("training")
    short = dataclasses.replace(training.SETTINGS["smoke"], steps=4, rounds=2, steps_per_round=1)
    training.SETTINGS["short"] = short
    try:
        rows = training.measure(
            MeasureSettings(
                scale="short",
                max_elements=0,
                world_size=2,
                warmup=0,
                repeats=1,
                csv_path=out / "results.csv",
                kernels_dir=out / "kernels",
                timeout_s=600,
            )
        )
    finally:
        del training.SETTINGS["short"]
    return out, rows


@pytest.mark.slow
def test_measured_rows_losses_memory_and_timing(measured):
    out, rows = measured
    df = pd.read_csv(out / "results.csv")
    df = df[df.source == "measured"]
    assert len(df) == len(rows)
    loss = df[df.row_kind == "loss"]
    assert len(loss) == 3 * 3 * 4  # optimizers (adam, adamw, lamb) x set-ups x steps
    steps = df[df.row_kind == "step"]
    assert set(steps.schedule) == {"baseline", "zero_redundancy", SLICED}
    assert steps.verified.all()  # losses agree within 1e-5 relative on every rank
    assert (steps.time_ms_lo <= steps.time_ms).all() and (steps.time_ms <= steps.time_ms_hi).all()
    mem = df[df.row_kind == "memory"].set_index(["optimizer", "schedule"])
    for opt in ("adam", "adamw", "lamb"):
        base, fused = mem.loc[(opt, "baseline")], mem.loc[(opt, SLICED)]
        assert base.state_bytes / 2 <= fused.state_bytes < base.state_bytes / 2 + 64 * 30
        assert fused.micro_batch > 0 and base.micro_batch > 0


def test_the_report_section_reads_the_table(measured):
    out, rows = measured
    for r in training.predict(None):  # as the suite appends them
        append_row(out / "results.csv", r)
    text = training_section(pd.read_csv(out / "results.csv"), out)
    for heading in (
        "## Loss curves",
        "## Step time and throughput",
        "## Memory per rank",
        "## Table 1 predicted",
        "x1.22 .. x1.52",
    ):
        assert heading in text
    assert (out / "figures" / "training_loss.png").stat().st_size > 0


@pytest.mark.slow
def test_the_optimizer_bound_setting_and_a_target_in_every_sequence():
    """experiment.model=wide: a wide encoder, one short sequence a rank (the optimizer step a large
    share of the step); its data predict at least one position a sequence, as BERT's do (with 16
    tokens and 15% masked, a sequence with none would make the loss NaN)."""
    from types import SimpleNamespace

    from experiments import bert, training

    s = training.setting_of(SimpleNamespace(model="wide", scale="default"))
    assert s.micro_batch == 1 and s.size.hidden == 512 and s.size.seq == 16
    assert s.size.parameters() > 10_000_000
    for step in range(50):
        _, targets = bert.batch(s.size, 0, step, 0, 4)
        assert ((targets != -100).sum(dim=1) >= 1).all()
