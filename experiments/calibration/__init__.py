"""Calibration, in one package: measuring this machine, fitting the cost model's local topology
to it, and caching the result per machine.

    measure   experiment=calibrate (`MeasurementExperiment`): timed collectives, kernels and the
              library optimizer step on local ranks, in interleaved rounds; writes topology.yaml
    fit       Measurement rows -> a fitted `cost_model.Topology` (links, collectives' fixed
              costs and rates, the device's kernel and memory rates: `fit_device`)
    history   every calibration kept, and the fit pooled over the latest ones of a machine
    cache     a run's calibration: found in the cache per machine fingerprint, else measured
              first (a quick pass) and cached (`local_calibration`, `describe`)
    machine   what the fingerprint and the reports say of this machine (CPU, memory, compiler)

The cost model's primitives the fit solves with (`cost_model.curves`, `cost_model.microbench`)
stay in `cost_model`, which predicts from the fitted topology and knows nothing of this package.
"""

from . import cache, fit, history, machine, measure
from .cache import Calibration, CalibrationError, describe, history_dir, local_calibration

__all__ = [
    "Calibration",
    "CalibrationError",
    "cache",
    "describe",
    "fit",
    "history",
    "history_dir",
    "local_calibration",
    "machine",
    "measure",
]
