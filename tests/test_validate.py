"""Published measurements as data (cost_model/data) and experiment=validate: the data's sources,
the constants fitted per system reproducible from it, the predictions against it, and the
report (pure: no ranks)."""

from __future__ import annotations

import dataclasses

import pytest

from cost_model import validation
from cost_model.topology import load_topology
from experiments import validate
from reports.results import read_table
from reports.validation import LARGE_FROM, LIMIT_LARGE, LIMIT_MEDIAN, validation_section


def test_every_published_point_names_its_source_and_a_known_system():
    points = validation.published()
    assert len(points) >= 20
    for p in points:
        assert p.source.startswith("https://"), p
        load_topology(p.system)  # a topology of the project
    assert {p.system for p in points} >= {"dgx_a100", "dgx_h100"}


def test_bad_data_names_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    lines = (validation.DATA_DIR / "published_collectives.csv").read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace(",36.22,", ",oops,")]) + "\n")
    with pytest.raises(ValueError, match="bad.csv line 2"):
        validation.published(bad)


@pytest.mark.parametrize("system", ["dgx_a100", "dgx_h100", "aws_p4de", "aws_p5", "dgx1_v100"])
def test_the_fitted_constants_are_the_ones_the_topology_states(system):
    """Fitted per system, never per point: refitting from the data gives the file's values."""
    nc = load_topology(system).nccl
    assert validation.fit_pipeline(system) == {k: getattr(nc, k) for k in validation.FITTED}


@pytest.mark.slow
def test_predictions_against_the_published_points():
    rows = validate.predict(None)
    points = [r for r in rows if r["source"] == "predicted" and r["row_kind"] == "point"]
    assert len(points) == len(validation.published())
    by = {(r["topology"], r["schedule"], r["size"]): r for r in points}
    nvls = by[("dgx_h100", "all_reduce (8 GPUs)", 8 << 30)]
    assert nvls["algo"] == "nvls" and nvls["error_pct"] == pytest.approx(0, abs=3)
    ring = by[("dgx_h100", "all_reduce (8 GPUs, ring forced)", 4 << 30)]
    assert ring["algo"] == "ring" and abs(ring["error_pct"]) <= 5
    summary = {s["system"]: s for s in validate.summary(rows)}
    for system in MEETS:  # on the check split, which no fit saw
        assert summary[system]["check"]["ok"], summary[system]
        assert summary[system]["check"]["median_pct"] <= LIMIT_MEDIAN
        assert summary[system]["check"]["max_large_pct"] <= LIMIT_LARGE
    plateau = [
        r
        for r in points
        if r["topology"] == "dgx_a100"
        and r["size"] >= 256 << 20
        and r["schedule"] == "all_reduce (8 GPUs) [Azure ND A100 v4]"
    ]
    assert len(plateau) >= 3
    assert all(abs(r["error_pct"]) <= 5 for r in plateau)
    curves = [r for r in rows if r.get("row_kind") == "curve"]
    assert {r["proto"] for r in curves if r["topology"] == "dgx_a100" and r["proto"]} == {
        "LL",
        "LL128",
        "Simple",
    }


MEETS = ("dgx1_v100", "oci_h100_roce")  # the systems whose check split holds the thresholds today


def test_the_check_split_was_drawn_by_its_rule_and_holds_a_third_of_every_system():
    points = validation.published()
    assert [p.split for p in points] == validation.check_split(points)
    for system in {p.system for p in points}:
        mine = [p for p in points if p.system == system]
        assert 3 * sum(p.split == "check" for p in mine) >= len(mine), system
    multi = [p for p in points if p.nodes > 1]
    assert {"fit", "check"} <= {p.split for p in multi if p.system == "dgx_h100"}


@pytest.mark.slow
def test_a_fit_never_sees_the_check_split():
    """Moving every check point's busbw changes no fitted constant; moving a fit point does."""
    import dataclasses

    points = validation.published()
    moved = [
        dataclasses.replace(p, busbw_gbps=p.busbw_gbps * 3) if p.split == "check" else p
        for p in points
    ]
    assert validation.fit_pipeline("dgx_h100", moved) == validation.fit_pipeline("dgx_h100")
    assert all(p.split == "fit" for p in validation.training_points("dgx_h100"))
    first_fit = next(
        i
        for i, p in enumerate(points)
        if p.system == "dgx_h100" and p.split == "fit" and p.bytes >= 1 << 28
    )
    nudged = list(points)
    nudged[first_fit] = dataclasses.replace(
        points[first_fit], busbw_gbps=points[first_fit].busbw_gbps * 0.2
    )
    assert validation.fit_pipeline("dgx_h100", nudged) != validation.fit_pipeline("dgx_h100")


def test_a_forced_algorithm_is_what_the_published_run_forced():
    p = next(p for p in validation.published() if p.algo == "ring")
    assert validation.predict_point(p).algo == "ring"
    free = dataclasses.replace(p, algo="")
    assert validation.predict_point(free).algo == "nvls"


@pytest.mark.slow
def test_the_report_section_tables_figures_and_misses(tmp_path):
    from reports.results import append_row
    from reports.validation import _size

    for r in validate.predict(None):
        append_row(tmp_path / "results.csv", r)
    text = validation_section(read_table(tmp_path / "results.csv"), tmp_path)
    check = sum(p.system == "dgx_h100" and p.split == "check" for p in validation.published())
    fit = sum(p.system == "dgx_h100" and p.split == "fit" for p in validation.published())
    assert f"| dgx_h100 | {check} |" in text and f"| {fit} |" in text and "### Per point" in text
    assert "| dgx_h100 | 27 | 3.1% | 15.2% | 52 | 3.4% | 9.4% | not met |" in text
    assert "| dgx_h100 | all_reduce (4 nodes x 8) | 345 |" in text  # across nodes, predicted
    assert (tmp_path / "figures" / "nodes_dgx_b200_roce.png").stat().st_size > 0
    for system in ("dgx_a100", "dgx_h100", "dgx_b200", "aws_p5", "dgx1_v100"):
        assert (tmp_path / "figures" / f"validate_{system}.png").stat().st_size > 0
    # every check point outside the thresholds is named; fit points are not held to them
    outside = [
        r
        for r in validate.predict(None)
        if r.get("error_pct") is not None
        and r["size"] >= LARGE_FROM
        and abs(r["error_pct"]) > LIMIT_LARGE
    ]
    for r in outside:
        named = f"{r['topology']}, {r['schedule']} at {_size(int(r['size']))}:" in text
        assert named == (r["split"] == "check"), r
    assert any(r["split"] == "check" for r in outside)


def test_the_paper_results_are_data_with_source_and_caveat():
    rows = validation.paper_results()
    assert {r["experiment"] for r in rows} >= {"model_parallel", "pipeline_parallel"}
    for r in rows:
        assert r["caveat"] and r["where"] and 1.0 <= r["speedup_min"] <= r["speedup_max"]


@pytest.mark.slow
def test_python_m_suite_experiment_validate(tmp_path):
    """As users run it: a run directory with report.md (per-system errors), results.csv and one
    figure per system."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "experiment=validate", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=root,
        env=env,
        text=True,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dgx_h100" in proc.stdout and "median" in proc.stdout
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Validation against published measurements" in report
    assert (tmp_path / "run" / "figures" / "validate_dgx_h100.png").exists()
    df = read_table(tmp_path / "run" / "results.csv")
    assert set(df.source) == {"published", "predicted"}
