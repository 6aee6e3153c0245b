"""The reproduction report of `experiment=paper`: one Markdown document over every run, from the
merged results table, the runs' directories and the environment (pure: nothing is re-run).

`reproduction_report(df, out_dir, names, checks, env) -> str`, sections in order:
- the question it answers and the one command that regenerates it;
- Summary: one row per experiment (`summary_rows`: checks verified, points measured, the best
  measured speedup, the local time and speedup errors with the machine's repeatability, the best predicted speedup per GPU topology);
- Repeatability: the same collective measured twice in the run (calibrate, then collectives),
  the noise floor under the local predictions' errors;
- Environment: CPU model, cores, memory, OS, Python, torch, compiler, world sizes, date, the git
  commit of the suite;
- one section per experiment: the measured table, the predicted speedup table per topology (local,
  the paper's, DGX A100, DGX H100), the paper-style figures, the predicted-vs-measured scatter
  with its error statistics, and the generated kernels (files in `<name>/kernels/`).

The experiment sections reuse `reports.sections.measured_section` and
`reports.predicted.predicted_section` on each run's own directory (figures land in
`<name>/figures/`); their headings move one level down and their links gain the `<name>/` prefix.
`checks` maps an experiment to (verified, total) verification checks.
"""

from __future__ import annotations

import re
from pathlib import Path

from .predicted import predicted_section
from .sections import measured_section
from .summary import experiment_summary, markdown_table

FIGURES = {
    "adam_fusion": "Fig. 10a",
    "lamb_fusion": "Fig. 10b",
    "model_parallel": "Fig. 11",
    "pipeline_parallel": "Fig. 12",
    "collectives": "nccl-tests bandwidth",
    "calibrate": "the cost model's local topology",
}
_LINK = re.compile(r"\]\((?!https?:|/)([^)]+)\)")


def summary_rows(df, names: list[str], checks: dict) -> tuple[list[str], list[list[str]]]:
    header = None
    rows = []
    for name in names:
        if name == "calibrate":
            continue
        h, (row,) = experiment_summary(df, name) if not df.empty else (None, [[name] + [""] * 6])
        header = header or h
        verified, total = checks.get(name, (0, 0))
        rows.append(row[:1] + [f"{verified}/{total}" if total else "-"] + row[1:])
    header = header or [
        "experiment",
        "measured points (verified)",
        "best measured speedup",
        "local time error (median, largest)",
        "local speedup error (median, largest)",
        "repeatability (time, speedup)",
        "best predicted speedup (GPUs)",
    ]
    return header[:1] + ["checks verified"] + header[1:], rows


def nest(markdown: str, prefix: str) -> str:
    """A run's section inside the report: headings one level down, relative links under prefix."""
    out = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = "#" + line
        out.append(_LINK.sub(lambda m: f"]({prefix}/{m.group(1)})", line))
    return "\n".join(out)


def kernels_list(run_dir: Path) -> str:
    files = sorted((run_dir / "kernels").glob("*")) if (run_dir / "kernels").is_dir() else []
    files = [f for f in files if f.is_file()]
    if not files:
        return "_no generated kernels (this experiment has no DSL program, or measured none)_\n"
    lines = [f"{len(files)} files in `{run_dir.name}/kernels/`:", ""]
    lines += [f"- `{f.name}` ({f.stat().st_size / 1024:.1f} KiB)" for f in files]
    return "\n".join(lines) + "\n"


def repeatability(df) -> str:
    """The machine's own repeatability: the same collective, same runtime call, measured twice in
    this run the same way (by `calibrate` first, in its rounds of collectives only,
    `alone_<kind>`, by `collectives` minutes later; each the median over interleaved rounds of a
    sample's median call, each call after a barrier), as |second / first - 1| per size: the
    floor under any prediction's error here. A calibration from before those rounds: its
    `<kind>`, timed among its kernels (which ran them slower)."""
    if df.empty:
        return ""
    meas = df[df.source == "measured"]
    lines = []
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        a = meas[(meas.experiment == "calibrate") & (meas.schedule == "alone_" + kind)]
        if a.empty:
            a = meas[(meas.experiment == "calibrate") & (meas.schedule == kind)]
        b = meas[(meas.experiment == "collectives") & (meas.schedule == kind)]
        if "comm" in b:  # comm=shm: calibrate measured gloo's; shared memory is not the same call
            b = b[b["comm"] != "shm"]
        both = a[["size", "time_ms"]].merge(b[["size", "time_ms"]], on="size")
        if both.empty:
            continue
        diff = (both.time_ms_y / both.time_ms_x - 1).abs()
        lines.append(
            f"| {kind} | {len(both)} | {100 * diff.median():.1f}% | {100 * diff.max():.1f}% |"
        )
    if not lines:
        return ""
    return (
        "\n".join(
            [
                "## Repeatability of this machine",
                "",
                "The same collective through the same runtime call, measured twice in this "
                "run the same way (by `calibrate`, in its rounds of collectives only, "
                "then by `collectives` minutes later: the median over "
                "interleaved rounds of a sample's median call, each call after a "
                "barrier), differs by |second/first - 1| (the sizes both "
                "measured, 4 KiB and up): no prediction of this machine can be trusted "
                "closer than this.",
                "",
                "| collective | sizes | median | largest |",
                "|---|---:|---:|---:|",
                *lines,
            ]
        )
        + "\n"
    )


def environment_section(env: dict) -> str:
    labels = [
        ("date", "date"),
        ("suite_commit", "suite commit"),
        ("command", "command"),
        ("cpu", "CPU"),
        ("cores", "cores"),
        ("memory_gib", "memory (GiB)"),
        ("os", "OS"),
        ("python", "Python"),
        ("torch", "torch"),
        ("compiler", "C++ compiler"),
        ("scale", "scale"),
        ("backend", "backend"),
        ("world_size", "ranks measured"),
        ("world_sizes_note", "world sizes"),
        ("verify_world_sizes", "verification world sizes"),
        ("predict_also", "also predicted on"),
        ("elapsed_s", "run time (s)"),
    ]
    lines = ["## Environment", ""]
    lines += [f"- {label}: `{env[key]}`" for key, label in labels if key in env]
    return "\n".join(lines) + "\n"


def experiment_section(df, out_dir: Path, name: str, checks: dict) -> str:
    run_dir = out_dir / name
    lines = [
        f"## {name}",
        "",
        f"Reproduces the paper's {FIGURES.get(name, name)}. The full run "
        f"(schedules, programs, verification table): `{name}/report.md`.",
        "",
    ]
    verified, total = checks.get(name, (0, 0))
    if total:
        lines += [
            f"{verified} of {total} checks verified the schedules against the unscheduled "
            "program (`dsl.interpret`).",
            "",
        ]
    rows = df[df.experiment == name] if not df.empty else df
    if rows.empty:
        return "\n".join(lines + ["_no results_", ""])
    measured = "" if name in ("collectives", "calibrate") else measured_section(df, name, run_dir)
    body = measured + "\n" + predicted_section(df, name, run_dir)
    lines += [nest(body, name), "", f"### Generated kernels ({name})", "", kernels_list(run_dir)]
    return "\n".join(lines) + "\n"


def reproduction_report(df, out_dir, names: list[str], checks: dict, env: dict) -> str:
    out_dir = Path(out_dir)
    header, rows = summary_rows(df, names, checks)
    text = [
        "# CoCoNeT reproduction report",
        "",
        "Does breaking the wall between computation and communication pay, here and on the "
        "clusters of the paper? Every schedule below was derived by the DSL's transformations,"
        " verified against the unscheduled program, generated as C++ and measured on local "
        "gloo ranks against the library it replaces; the cost model (SimPy) predicts the same "
        "schedules on this machine (calibrated in this run) and on GPU clusters.",
        "",
        f"Regenerate: `{env.get('command', 'python -m suite experiment=paper')}`",
        "",
        "## Summary",
        "",
        markdown_table(header, rows),
        repeatability(df),
        environment_section(env),
    ]
    ordered = [n for n in names if n != "calibrate"] + [n for n in names if n == "calibrate"]
    text += [experiment_section(df, out_dir, n, checks) for n in ordered]
    return "\n".join(text)
