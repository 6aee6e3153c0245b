"""report.md for a run: a pure function of what the run produced (no computation here).

Sections: the experiment and the paper figure it reproduces, what is compared (`compared`: the
measured and the predicted baseline on the run's backend and topology, and what its scale can
show), the settings, each schedule's printed
program in a code block, and the verification table (schedule, world size, bindings, max abs error,
verified), followed by the messages of failed checks, then `results`: the measured and predicted
sections `suite.run` builds with `reports/` from the results table alone. A check is any
object with the fields of `suite.verification.Check` (`CheckLike`); reports imports no suite code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Protocol, Sequence


class CheckLike(Protocol):
    """One verification check, as `suite.verification.Check` records it."""

    schedule: str
    world_size: int
    bindings: Mapping[str, int]
    max_abs_error: Optional[float]
    verified: bool
    message: str


def format_bindings(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in bindings.items()) if bindings else "(defaults)"


def format_error(error: Optional[float]) -> str:
    return "-" if error is None else f"{error:.2e}"


MEASURED_BASELINE = {
    "cpu": (
        "the library code a practitioner writes today, run on the same ranks: "
        "torch.distributed's collective on gloo, then torch's own computation (e.g. "
        "torch.optim.Adam){shm}"
    ),
    "cuda": "the same library code on the GPU: torch.distributed's collective on NCCL, then torch's "
    "own CUDA computation",
}
PREDICTED_BASELINE = {
    "local": (
        "On the local topology the predicted `baseline` is the library's collective at "
        "the calibrated rate, then the computation at the time the measured baseline's "
        "library call took at that point."
    ),
    "gpu": (
        "On a GPU topology nothing was measured: the predicted `baseline` is NCCL's "
        "all-reduce (as NCCL's tuner picks it), then the generated kernel, so it equals the "
        "unscheduled schedule (AR-C x1.00 by construction)."
    ),
}
SCALE_SHOWS = {
    "smoke": "Scale smoke checks that every step runs: its figures mean nothing.",
    "default": (
        "Scale default measures sizes up to this machine's memory and time budget: "
        "speedups within their printed 95% intervals, on this machine only."
    ),
    "paper": (
        "Scale paper measures the paper's sizes where this machine holds them: "
        "speedups within their printed 95% intervals, on this machine only."
    ),
}


def compared(backend: str, comm: str, scale: str, measures: bool, gpu_topologies: bool) -> str:
    """What the report compares, in a paragraph: the measured baseline on `backend` (none where
    the run `measures` nothing), the predicted baseline on the local and (`gpu_topologies`) GPU
    topologies, and what `scale` can show."""
    parts = []
    if measures and backend in MEASURED_BASELINE:
        shm = (
            " (comm=shm: also `baseline(gloo)`, the same on gloo's transport)"
            if comm == "shm"
            else ""
        )
        parts.append(
            f"On backend {backend} the measured `baseline` is "
            + MEASURED_BASELINE[backend].format(shm=shm)
            + "; every speedup is "
            "over it, at the same point."
        )
    else:
        parts.append(f"Nothing is measured on backend {backend}: every figure is predicted.")
    if backend != "sim":
        parts.append(PREDICTED_BASELINE["local"])
    if gpu_topologies or backend == "sim":
        parts.append(PREDICTED_BASELINE["gpu"])
    parts.append(SCALE_SHOWS.get(scale, f"Scale {scale}: the user's own."))
    return " ".join(parts)


def render_report(
    *,
    experiment: str,
    figure: str,
    settings: Mapping[str, object],
    programs: Mapping[str, str],
    checks: Sequence[CheckLike],
    results: str = "",
    comparison: str = "",
) -> str:
    lines = [f"# {experiment}", "", f"Reproduces the paper's {figure}.", ""]
    if comparison:
        lines += ["## What is compared", "", comparison, ""]
    lines += ["## Settings", ""]
    lines += [f"- {key}: `{value}`" for key, value in settings.items()]
    lines += ["", "## Schedules", ""]
    for name, text in programs.items():
        lines += [f"### {name}", "", "```", text.rstrip("\n"), "```", ""]
    lines += ["## Verification", ""]
    verified = sum(c.verified for c in checks)
    lines += [f"{verified} of {len(checks)} checks verified against the unscheduled program.", ""]
    lines += [
        "| schedule | world size | bindings | max abs error | verified |",
        "|---|---:|---|---:|---|",
    ]
    for c in checks:
        lines.append(
            f"| `{c.schedule}` | {c.world_size} | {format_bindings(c.bindings)} | "
            f"{format_error(c.max_abs_error)} | {'yes' if c.verified else 'no'} |"
        )
    failed = [c for c in checks if not c.verified]
    if failed:
        lines += ["", "### Failures", ""]
        lines += [
            f"- `{c.schedule}` at P={c.world_size}, {format_bindings(c.bindings)}: {c.message}"
            for c in failed
        ]
    if results:
        lines += ["", results.rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, text: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.md"
    path.write_text(text)
    return path
