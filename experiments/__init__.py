"""Experiments: one interface in three kinds (`Experiment`, `MeasurementExperiment`,
`DerivedExperiment`: `experiments.kinds`), a registry, a measurement harness, predictions.

    from experiments import Experiment, register, get, names
    exp = get("adam_fusion")                        # a registered Experiment
    rows = harness.measure(exp, MeasureSettings(...))  # measured rows on local ranks
    rows = predict.predictions(exp, PredictSettings(...))  # the cost model's rows

The shipped experiments (`registry.SHIPPED`: adam_fusion, lamb_fusion, model_parallel,
pipeline_parallel, calibrate, collectives, validate, autotune, training) register when this package is imported; a user's
experiment registers from its own module (`registry.load_module`, `experiment.module=...` on the
command line). See `experiments.api` for what an experiment fills in and `experiments.harness` for
how it is measured.
"""

from __future__ import annotations

import importlib

from codegen.runtime.rank import preload

from . import harness, predict, registry
from .api import (
    Baseline,
    BaselineContext,
    DeriveSettings,
    ExperimentKind,
    MeasureSettings,
    PaperSetting,
    PredictSettings,
)
from .kinds import DerivedExperiment, Experiment, MeasurementExperiment
from .registry import RegistryError, get, load_module, names, register

for _name in registry.SHIPPED:
    importlib.import_module(f"{__name__}.{registry.MODULES.get(_name, _name)}")
preload(__name__)  # the ranks' fork server imports the experiments once, not each rank

__all__ = [
    "Baseline",
    "BaselineContext",
    "DerivedExperiment",
    "DeriveSettings",
    "Experiment",
    "ExperimentKind",
    "MeasurementExperiment",
    "MeasureSettings",
    "PaperSetting",
    "PredictSettings",
    "RegistryError",
    "get",
    "harness",
    "load_module",
    "names",
    "predict",
    "register",
    "registry",
]
