"""Predicted against measured, from a small results table (pure)."""
import pandas as pd

from reports.predicted import accuracy, accuracy_figure, predicted_section, summary


def table():
    rows = []
    for sched, meas, lo, hi, pred in (("baseline", 10.0, 9.0, 11.0, 11.0),
                                      ("fast", 5.0, 4.5, 5.5, 4.0),
                                      ("same", 10.5, 9.5, 12.0, 9.0)):
        common = {"experiment": "x", "schedule": sched, "world_size": 2, "size": 64,
                  "shape": "[64]", "dtype": "f32"}
        rows.append({**common, "source": "measured", "backend": "cpu", "topology": "local",
                     "time_ms": meas, "time_ms_min": lo, "time_ms_max": hi, "speedup": 1.0})
        rows.append({**common, "source": "predicted", "backend": "sim", "topology": "local",
                     "time_ms": pred, "speedup": 1.0})
    return pd.DataFrame(rows)


def test_accuracy_and_ordering():
    acc = accuracy(table(), "x")
    assert sorted(acc.error.round(3)) == [-0.2, -0.143, 0.1]
    s = summary(acc)
    assert s["points"] == 3 and abs(s["median_abs_error"] - 0.143) < 1e-3
    # fast vs baseline and fast vs same differ beyond their spreads; both ordered right
    assert (s["ordered_pairs"], s["ordered_agree"]) == (2, 2)


def test_section_and_figure(tmp_path):
    text = predicted_section(table(), "x", tmp_path)
    assert "## Predicted vs measured" in text and "+10.0%" in text
    assert (tmp_path / "figures" / "predicted_vs_measured.png").exists()
    assert accuracy_figure(accuracy(table(), "x"), tmp_path / "a.png").exists()
