"""The generate step: every schedule's kernels, rendered and checked by the run's backend, into
`out_dir/kernels/`, before anything is measured.

    generate(cfg, exp, schedules, backend, out_dir)     # called by suite.run for every backend

Every schedule is lowered at the experiment's verification bindings (`exp.verify_bindings(scale)`,
at each `verify.world_sizes`) and measurement sizes (`experiment.sizes`, else `exp.points(scale,
max_elements)` where N is the only size, at `world_size`); its kernels are written by `backend.write_sources`
as one module `<experiment>_<schedule>` (cpu: the C++ source; cuda: the CUDA source and PTX
compiled by NVRTC for every `backend.archs`, which needs no GPU; with comm=symm the fused steps'
one-kernel forms too, `backend.step_kernels`), one progress line per schedule.
A kernel that does not render or compile is a `codegen.build.BuildError`: the run failed (exit
status 3, `suite.run`).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Optional

import dsl
from codegen.lower import lower
from codegen.plan import Plan
from dsl.equivalence import default_bindings
from experiments import Experiment

log = logging.getLogger(__name__)


def generate(
    cfg, exp: Experiment, schedules: dict[str, dsl.Program], backend, out_dir: Path
) -> list[Path]:
    """See the module doc; returns the paths written."""
    folder = Path(out_dir) / "kernels"
    log.info(
        f"generate: {len(schedules)} schedules' kernels for backend {backend.name} into {folder}"
    )
    written = []
    for name, program in schedules.items():
        start = time.perf_counter()
        plans = lower_all(cfg, exp, program)
        kernels = list(
            {
                k.name: k
                for _, _, plan in plans
                for k in plan.kernels() + backend.step_kernels(plan)
            }.values()
        )
        paths = backend.write_sources(kernels, folder, f"{exp.name}_{file_name(name)}")
        written += paths
        log.info(
            f"  {name}: {len(kernels)} kernels -> {', '.join(p.name for p in paths)} "
            f"({time.perf_counter() - start:.2f} s)"
        )
    return written


def file_name(schedule: str) -> str:
    """A schedule name as a file name: `fuse(RS-C-AG)+as_slice` -> `fuse_RS-C-AG_as_slice`."""
    return re.sub(r"_+", "_", re.sub(r"[^\w.-]", "_", schedule)).strip("_")


def measure_bindings(cfg, exp: Experiment, program: dsl.Program) -> list[dict[str, int]]:
    """experiment.sizes, else the data-parallel sweep `exp.points` where N is the only size."""
    if cfg.experiment.sizes:
        return [dict(b) for b in cfg.experiment.sizes]
    symbols = set(default_bindings(program, 1)) - {"P"}
    if symbols == {"N"}:
        return [dict(b) for b in exp.points(cfg.scale.name, cfg.scale.max_elements)]
    return []


def lower_all(cfg, exp: Experiment, program: dsl.Program) -> list[tuple[dict, int, Plan]]:
    """(bindings, world size, plan) at every verification and measurement point."""
    points = [(b, w) for w in cfg.verify.world_sizes for b in _verify_bindings(cfg, exp)]
    points += [(b, cfg.world_size) for b in measure_bindings(cfg, exp, program)]
    out, seen = [], set()
    for b, w in points:
        key = (tuple(sorted((b or {}).items())), w)
        if w % program.stages or key in seen:
            continue
        seen.add(key)
        out.append((b, w, lower(program, b or default_bindings(program, w // program.stages), w)))
    return out


def _verify_bindings(cfg, exp: Experiment) -> list[Optional[dict]]:
    return [dict(b) for b in exp.verify_bindings(cfg.scale.name)] or [None]
