"""A user's own experiment, kept outside the project's packages (tests/fixtures/user_experiments/),
runs through `python -m suite` as a shipped one does: verification, measured rows against its own
torch baseline (torch.optim.RMSprop; the tutorial's SGD with momentum in test_tutorials),
predictions over that baseline, and a report. The three kinds of experiment and the protocol
the orchestration calls."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
from test_suite_cli import assert_one_line_error, suite_cmd

import dsl
import experiments
from suite import PROJECT_ROOT

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "user_experiments"
SGD = FIXTURES / "sgd_momentum.py"
RMSPROP = FIXTURES / "rmsprop.py"  # written from the manual alone (no code read)
SCHEDULES = ["AR-C", "RS-C-AG", "RS-C-AG+as_slice", "fuse(RS-C-AG)", "fuse(RS-C-AG)+as_slice"]


@pytest.mark.slow
@pytest.mark.parametrize("name, module", [("rmsprop", RMSPROP)])
def test_a_users_experiment_runs_through_the_suite(name, module, tmp_path):
    """rmsprop was written by a reader of the manual alone; the tutorial's sgd_momentum runs in
    tests/test_tutorials.py (own-experiment.md, the same file)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            f"experiment={name}",
            f"experiment.module={module}",
            "scale=smoke",
            "verify.world_sizes=[2]",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=PROJECT_ROOT,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith(f"# {name}\n") and "## Verification" in report
    for schedule in SCHEDULES:
        assert f"| `{schedule}` | 2 |" in report  # verified against the unscheduled program
    df = pd.read_csv(tmp_path / "results.csv")
    measured = df[df.source == "measured"]
    assert set(measured.schedule) == {"baseline", *SCHEDULES}
    assert set(measured["size"]) == {1 << 12, 1 << 14, 1 << 16}
    assert measured.verified.all()
    predicted = df[(df.source == "predicted") & (df.topology == "local")]
    assert set(predicted.schedule) == {"baseline", *SCHEDULES}
    # the baseline's predicted computation is the time its own torch optimizer's step took
    for _, row in measured[measured.schedule == "baseline"].iterrows():
        pred = predicted[(predicted.schedule == "baseline") & (predicted["size"] == row["size"])]
        assert pred.compute_ms.iloc[0] == pytest.approx(row.compute_ms, rel=1e-3, abs=1e-3)
    assert (tmp_path / "figures" / f"{name}.png").exists()


def test_a_dotted_module_on_the_python_path_registers_too(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    (exp,) = experiments.load_module("sgd_momentum")
    try:
        assert exp.name == "sgd_momentum" and list(exp.schedules()) == SCHEDULES
        assert experiments.get("sgd_momentum") is exp
    finally:
        experiments.registry.unregister("sgd_momentum")
    assert "sgd_momentum" not in experiments.names()


@pytest.mark.slow
def test_a_module_that_cannot_load_is_one_line(tmp_path):
    proc = suite_cmd(
        "experiment=sgd_momentum", "experiment.module=no_such_module", f"hydra.run.dir={tmp_path}"
    )
    assert_one_line_error(proc, "cannot import experiment module 'no_such_module'")
    proc = suite_cmd("experiment=other", f"experiment.module={SGD}", f"hydra.run.dir={tmp_path}")
    assert_one_line_error(proc, "unknown experiment 'other'", "sgd_momentum")


# -- the three kinds -------------------------------------------------------------------------------
KIND_OF = {
    "adam_fusion": experiments.Experiment,
    "lamb_fusion": experiments.Experiment,
    "model_parallel": experiments.Experiment,
    "pipeline_parallel": experiments.Experiment,
    "calibrate": experiments.MeasurementExperiment,
    "collectives": experiments.MeasurementExperiment,
    "training": experiments.MeasurementExperiment,
    "validate": experiments.MeasurementExperiment,
    "autotune": experiments.DerivedExperiment,
}


@pytest.mark.parametrize("name", list(KIND_OF))
def test_every_shipped_experiment_is_one_kind_with_the_protocols_methods(name):
    exp = experiments.get(name)
    assert type(exp) is KIND_OF[name]
    for method in ("measure", "predict", "summary", "section"):
        assert callable(getattr(exp, method)), method
    assert exp.has_program is isinstance(exp, experiments.Experiment)
    assert exp.section(pd.DataFrame(), PROJECT_ROOT) == "" or name == "autotune"


def test_a_kind_takes_only_its_own_fields():
    def program(dtype=None):
        raise AssertionError("not called")

    with pytest.raises(TypeError, match="measure"):
        experiments.Experiment(name="x", figure="", program=program, schedules=dict, measure=list)
    with pytest.raises(TypeError, match="schedules"):
        experiments.Experiment(name="x", figure="", program=program)
    with pytest.raises(TypeError, match="baseline"):
        experiments.MeasurementExperiment(name="x", figure="", predict=list, baseline=object)
    with pytest.raises(experiments.RegistryError, match="not an experiment"):
        experiments.register(object())


def test_a_measurement_experiments_own_methods_are_what_a_run_calls():
    """The orchestration calls the kind's methods: its own summary replaces the speedup table;
    without a measure it is not measured; its section is empty."""
    from suite.run import prediction_summary

    rows = [{"source": "predicted", "topology": "t", "world_size": 2, "speedup": 1.5}]
    exp = experiments.MeasurementExperiment(
        name="mine", figure="", predict=lambda s: rows, summary=lambda m, p: f"{len(p)} rows"
    )
    assert not exp.measurable and exp.predict(None) is rows
    assert prediction_summary(exp, rows) == "1 rows"
    plain = experiments.MeasurementExperiment(name="mine", figure="", predict=lambda s: rows)
    assert plain.summary([], rows) is None and plain.section(pd.DataFrame(), PROJECT_ROOT) == ""


def test_the_manuals_rmsprop_verifies_and_a_nan_reference_is_refused():
    """Every schedule of the reader's RMSprop verifies; drawn from "normal" instead of
    "positive", its second moment makes sqrt NaN, and the check says so rather than passing."""
    (exp,) = experiments.load_module(str(RMSPROP))
    try:
        reference = exp.program()
        for schedule in exp.schedules().values():
            dsl.check_equivalent(reference, schedule, 2, trials=1, bindings={"N": 48})
        # the same program, v drawn from N(0, 1)
        normal = reference.with_(inputs=tuple(replace(i, init="normal") for i in reference.inputs))
        with pytest.raises(dsl.EquivalenceError, match=r"output [wv] of rmsprop is NaN at"):
            dsl.check_equivalent(normal, normal, 2, trials=1, bindings={"N": 48})
    finally:
        experiments.registry.unregister("rmsprop")
