"""The autotune report section (reports.autotune) from hand-made tables, and the suite's order of
steps for experiment=autotune on a measuring backend: calibrate, then rank on the calibrated
local topology, then measure."""

import pandas as pd
import pytest

import suite.resolve
import suite.run
from experiments.calibration.cache import Calibration
from reports.autotune import autotune_section
from suite import PROJECT_ROOT
from suite.cli import prevalidate
from suite.errors import SuiteError

SHAPE = "[4096]"


def _ranking(**extra):
    # predicted order: A (not named), B, C (named), D (named, rank 3: outside the top 2)
    rows = [
        ("A", False, 1.0),
        ("B", True, 2.0),
        ("C", True, 3.0),
        ("D", True, 4.0),
        ("X", False, 5.0),
    ]
    return pd.DataFrame(
        [
            {
                "experiment": "adam_fusion",
                "topology": "local",
                "world_size": 2,
                "size": 4096,
                "shape": SHAPE,
                "schedule": s,
                "named": named,
                "predicted_rank": k,
                "predicted_us": us * 1e3,
                "closed_us": us * 1e3,
                "found": 21,
                "candidates": 120,
                "search_s": 1.5,
                "closed_s": 0.012,
                "des_count": 6,
                "des_s": 0.4,
                "path": f"path of {s}",
                "program": f"program {s} {{}}" if s in "AX" else "",
                **extra,
            }
            for k, (s, named, us) in enumerate(rows)
        ]
    )


def _results(measured_ms: dict, wrong=()):
    rows = [
        {
            "experiment": "adam_fusion",
            "schedule": s,
            "source": "measured",
            "topology": "",
            "world_size": 2,
            "size": 4096,
            "shape": SHAPE,
            "time_ms": ms,
            "time_ms_lo": ms * 0.9,
            "time_ms_hi": ms * 1.1,
            "speedup": 10.0 / ms,
            "verified": s not in wrong,
        }
        for s, ms in measured_ms.items()
    ]
    rows += [
        {
            "experiment": "adam_fusion",
            "schedule": s,
            "source": "predicted",
            "topology": "local",
            "world_size": 2,
            "size": 4096,
            "shape": SHAPE,
            "time_ms": t,
            "speedup": 5.0 / t,
            "verified": None,
        }
        for s, t in (("baseline", 5.0), ("A", 1.0), ("D", 4.0))
    ]
    return pd.DataFrame(rows)


def test_the_measured_best_is_chosen_and_told_apart_from_the_predicted_best(tmp_path):
    results = _results(
        {"baseline": 10.0, "A": 6.0, "B": 5.5, "C": 7.0, "D": 5.0, "X": 1.0}, wrong=("X",)
    )
    text = autotune_section(results, _ranking(), tmp_path, top_m=2)
    chosen = pd.read_csv(tmp_path / "tables" / "autotune_chosen.csv").iloc[0]
    # D: the fastest measured (X is faster but its result was wrong); A: the predicted best
    assert chosen.chosen == "D" and chosen.predicted_best == "A" and chosen.runner_up == "B"
    assert chosen.gap_predicted_best == 6.0 / 5.0 - 1  # +20%
    assert chosen.top_best == "B" and abs(chosen.gap_top_best - 0.1) < 1e-12
    assert chosen.speedup_measured == 2.0 and chosen.speedup_predicted == 1.25
    assert "| [4096] | 21 | 120 | 120 in 0.012 s | 6 in 0.400 s | 1.50 s |" in text
    assert "| [4096] | A | D | 4.000 | 5.000 [4.500, 5.500] | B |" in text
    assert "+20.0%" in text and "B +10.0%" in text
    assert "NOT VERIFIED" in text and "[4096]: X" in text
    # A is predicted to beat every named schedule: its path and printed program are shown
    assert (
        "**A** ahead of every named schedule (0.500x" in text
        and "program A {}" in text
        and "**X**" not in text
    )
    assert (tmp_path / "figures" / "autotune.png").exists()


def test_unmeasured_points_choose_the_predicted_best(tmp_path):
    results = _results({})
    text = autotune_section(results, _ranking(), tmp_path, top_m=2)
    chosen = pd.read_csv(tmp_path / "tables" / "autotune_chosen.csv").iloc[0]
    assert chosen.chosen == chosen.predicted_best == "A" and chosen.runner_up == "B"
    assert "Nothing was measured" in text and "measured best" not in text.split("\n")[2]


@pytest.mark.slow
def test_autotune_ranks_on_the_calibrated_local_topology(tmp_path, monkeypatch):
    """backend=cpu: the calibration is found before the schedules are ranked (once), and the
    ranking's topology is the calibrated one, not suite/conf/topology/local.yaml's figures."""
    topo = tmp_path / "topology.yaml"
    text = (PROJECT_ROOT / "suite" / "conf" / "topology" / "local.yaml").read_text()
    topo.write_text(text.replace("name: local", "name: local_calibrated", 1))
    calls = []

    def found(cfg, exp, world_size):
        calls.append(exp.name)
        return Calibration("testkey", topo, "now", False)

    monkeypatch.setattr(suite.resolve, "local_calibration", found)
    out = tmp_path / "run"
    cfg = prevalidate(
        [
            "experiment=autotune",
            "target=adam_fusion",
            "backend=cpu",
            "scale=smoke",
            "experiment.sizes=[{N:4096}]",
            f"hydra.run.dir={out}",
        ]
    )
    outcome = suite.run.run_one(cfg, out)
    assert outcome.status == 0
    assert calls == ["autotune"]  # before the target was derived, and only once
    table = pd.read_csv(out / "autotune.csv")
    assert set(table.topology) == {"local_calibrated"}
    report = (out / "report.md").read_text()
    assert "testkey" in report and "## Autotune" in report
    measured = pd.read_csv(out / "results.csv").query("source == 'measured'")
    assert set(table[table.predicted_rank < 3].schedule) <= set(measured.schedule)


def test_bad_target_sizes_are_refused_before_any_work():
    """The target's sizes are checked by prevalidate, before the run calibrates or ranks."""
    with pytest.raises(SuiteError, match="bind exactly"):
        prevalidate(
            [
                "experiment=autotune",
                "target=adam_fusion",
                "backend=cpu",
                "experiment.sizes=[{X:1024}]",
            ]
        )
    with pytest.raises(SuiteError, match="does not fit schedule"):
        prevalidate(
            [
                "experiment=autotune",
                "target=adam_fusion",
                "backend=cpu",
                "experiment.sizes=[{N:1023}]",
            ]
        )
