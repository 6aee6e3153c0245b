"""The registry of experiments: the shipped ones and any a user registers.

    register(experiment) -> experiment      # a module calls it at import time (shipped or a user's)
    get(name) -> Experiment                 # KeyError naming the known ones
    unregister(name)                        # forget one (tests, a notebook's second draft)
    names() -> tuple[str, ...]              # in registration order
    load_module(spec) -> list[Experiment]   # import a user's module (dotted name) or file (.py)

The shipped experiments register when `experiments` is imported (`SHIPPED`). A user's module
registers its own by calling `register` at import time (`experiment.module=my_pkg.sgd_momentum`
or `experiment.module=path/to/sgd_momentum.py`); a module that calls nothing but defines
`EXPERIMENT` (an experiment of any kind) is registered for it. Registering a second, different experiment
under a name already taken is an error; registering the same one again (a module imported twice)
is not.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from .api import ExperimentKind

SHIPPED = (
    "adam_fusion",
    "lamb_fusion",
    "model_parallel",
    "pipeline_parallel",
    "tensor_parallel",
    "tp_attention",
    "fsdp_prefetch",
    "calibrate",
    "collectives",
    "validate",
    "autotune",
    "training",
)
MODULES = {"calibrate": "calibration"}  # a shipped experiment's module where not its name
_REGISTRY: dict[str, ExperimentKind] = {}
_SOURCES: dict[str, str] = {}  # name -> the user's module spec that registered it


class RegistryError(ValueError):
    """A name clash, or a module that cannot be loaded or registers nothing."""


def register(exp: ExperimentKind) -> ExperimentKind:
    if not isinstance(exp, ExperimentKind):
        raise RegistryError(
            f"register: {exp!r} is not an experiment (experiments.Experiment, "
            "MeasurementExperiment or DerivedExperiment)"
        )
    old = _REGISTRY.get(exp.name)
    if old is not None and old != exp and _origin(old) != _origin(exp):
        raise RegistryError(f"experiment {exp.name!r} is already registered (by {_origin(old)})")
    _REGISTRY[exp.name] = exp
    origin = _origin(exp)
    if not origin.startswith(f"{__package__}."):  # a user's: ranks import it by this name
        _SOURCES.setdefault(exp.name, origin)
    return exp


def unregister(name: str) -> None:
    """Forget a registered experiment (a test's, a notebook's second draft)."""
    _REGISTRY.pop(name, None)
    _SOURCES.pop(name, None)


def get(name: str) -> ExperimentKind:
    if name not in _REGISTRY:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def source_of(name: str) -> str | None:
    """The module spec a user's experiment was loaded from (None for a shipped one)."""
    return _SOURCES.get(name)


def resolve(name: str, source: str | None = None) -> ExperimentKind:
    """`get(name)`, loading `source` first when the name is not registered yet (a rank
    process resolving a user's experiment the parent loaded)."""
    if name not in _REGISTRY and source:
        load_module(source)
    return get(name)


def program_free() -> tuple[ExperimentKind, ...]:
    """The registered experiments without a DSL program (their own measure and predict)."""
    return tuple(e for e in _REGISTRY.values() if not e.has_program)


def program_experiments() -> tuple[ExperimentKind, ...]:
    """The registered experiments with a DSL program (schedules to verify, compile and run)."""
    return tuple(e for e in _REGISTRY.values() if e.has_program)


def load_module(spec: str) -> list[ExperimentKind]:
    """Import `spec` (a dotted module name on the Python path, or a .py file) and return the
    experiments it registered (or its `EXPERIMENT`); RegistryError when it cannot."""
    before = dict(_REGISTRY)
    try:
        module = _import_file(Path(spec)) if spec.endswith(".py") else importlib.import_module(spec)
    except (ImportError, OSError) as e:
        raise RegistryError(f"cannot import experiment module {spec!r}: {e}") from None
    found = getattr(module, "EXPERIMENT", None)
    if isinstance(found, ExperimentKind):
        register(found)
    new = [e for n, e in _REGISTRY.items() if before.get(n) is not e] or [
        e for e in _REGISTRY.values() if _origin(e) == module.__name__
    ]  # imported before
    for e in new:  # ranks (other processes) load the same module to find it
        _SOURCES[e.name] = str(Path(spec).resolve()) if spec.endswith(".py") else spec
    if not new and not isinstance(found, ExperimentKind):
        raise RegistryError(
            f"module {spec!r} registers no experiment (call experiments.register"
            " or define EXPERIMENT)"
        )
    return new or [found]


def _import_file(path: Path):
    if not path.is_file():
        raise OSError(f"no such file {path}")
    name = f"user_experiment_{path.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path.resolve()):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickled callables (rank processes) find their module
    spec.loader.exec_module(module)
    return module


def _origin(exp: ExperimentKind) -> str:
    """The module that made `exp`: where its program (or its own measure, predict, derive) is."""
    for field in ("program", "measure", "predict", "derive"):
        fn = vars(exp).get(field)  # a field's callable, not a kind's method
        if fn is not None:
            return getattr(fn, "__module__", "?")
    return "?"
