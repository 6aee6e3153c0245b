"""The verify step: every schedule of an experiment checked against its unscheduled program.

`verify_schedules` runs `dsl.check_equivalent(reference, schedule, world_size, trials, bindings,
seed)` for each schedule x world size x size binding, prints one progress line per schedule x
world size (OK / FAILED, the largest absolute error over outputs, bindings and trials, seconds),
and returns one `Check` per call. A schedule whose outputs differ (`dsl.EquivalenceError`) is a
failed check; any other `dsl.DSLError` (a size not divisible by the world size, ...) means the
settings are impossible: it becomes a SuiteError naming the schedule, world size and bindings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import dsl
from reports.markdown import format_bindings, format_error

from .errors import SuiteError

Bindings = Optional[Mapping[str, int]]


@dataclass(frozen=True, kw_only=True)
class Check:
    schedule: str
    world_size: int
    bindings: Bindings
    max_abs_error: Optional[float]  # over outputs and trials; None when the check failed
    message: str = ""  # why it failed: the EquivalenceError's message
    time_s: float = 0.0

    @property
    def verified(self) -> bool:
        return not self.message


def check_one(
    reference: dsl.Program,
    schedule: str,
    program: dsl.Program,
    world_size: int,
    bindings: Bindings,
    *,
    trials: int,
    seed: int,
) -> Check:
    """One equivalence check; EquivalenceError becomes a failed Check, other DSLErrors raise."""
    start = time.perf_counter()
    try:
        errors = dsl.check_equivalent(
            reference,
            program,
            world_size,
            trials=trials,
            bindings=None if bindings is None else dict(bindings),
            seed=seed,
        )
    except dsl.EquivalenceError as e:
        return Check(
            schedule=schedule,
            world_size=world_size,
            bindings=bindings,
            max_abs_error=None,
            message=str(e) or type(e).__name__,
            time_s=time.perf_counter() - start,
        )
    except dsl.DSLError as e:
        where = f"schedule {schedule} at P={world_size}, {format_bindings(bindings)}"
        raise SuiteError(f"{where}: {e}") from e
    worst = max((float(v) for v in errors.values()), default=0.0)
    return Check(
        schedule=schedule,
        world_size=world_size,
        bindings=bindings,
        max_abs_error=worst,
        time_s=time.perf_counter() - start,
    )


def verify_schedules(
    reference: dsl.Program,
    schedules: Mapping[str, dsl.Program],
    world_sizes: Sequence[int],
    bindings: Sequence[Bindings],
    *,
    trials: int,
    seed: int,
    show: Callable[[str], None] = print,
) -> list[Check]:
    """Check every schedule at every world size and binding; one progress line per pair."""
    show(
        f"verifying {len(schedules)} schedules x world sizes {list(world_sizes)} x "
        f"{len(bindings)} size bindings, {trials} trials each"
    )
    width = max(map(len, schedules), default=0)
    checks: list[Check] = []
    for name, program in schedules.items():
        for ws in world_sizes:
            done = [
                check_one(reference, name, program, ws, b, trials=trials, seed=seed)
                for b in bindings
            ]
            checks += done
            failed = [c for c in done if not c.verified]
            worst = None if failed else max(c.max_abs_error or 0.0 for c in done)
            status = "FAILED" if failed else "OK"
            detail = f"  ({failed[0].message})" if failed else ""
            show(
                f"  {name:<{width}}  P={ws:<3} {status:<6} max abs error {format_error(worst)}"
                f"  {sum(c.time_s for c in done):.2f} s{detail}"
            )
    return checks
