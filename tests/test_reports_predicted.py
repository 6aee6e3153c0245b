"""Predicted against measured, from a small results table (pure)."""

import pandas as pd

from reports.predicted import (
    accuracy,
    accuracy_figure,
    accuracy_table,
    predicted_section,
    summary,
    summary_line,
)


def table():
    rows = []
    for sched, meas, lo, hi, pred, x, xp in (
        ("baseline", 10.0, 9.0, 11.0, 11.0, 1.0, 1.0),
        ("fast", 5.0, 4.5, 5.5, 4.0, 2.0, 2.75),
        ("same", 10.5, 9.5, 12.0, 9.0, 0.95, 11 / 9),
    ):
        common = {
            "experiment": "x",
            "schedule": sched,
            "world_size": 2,
            "size": 64,
            "shape": "[64]",
            "dtype": "f32",
        }
        rows.append(
            {
                **common,
                "source": "measured",
                "backend": "cpu",
                "topology": "local",
                "time_ms": meas,
                "time_ms_min": lo,
                "time_ms_max": hi,
                "speedup": x,
                "time_ms_lo": meas * 0.98,
                "time_ms_hi": meas * 1.01,
                "speedup_lo": x * 0.97,
                "speedup_hi": x * 1.02,
            }
        )
        rows.append(
            {
                **common,
                "source": "predicted",
                "backend": "sim",
                "topology": "local",
                "time_ms": pred,
                "speedup": xp,
            }
        )
    return pd.DataFrame(rows)


def test_accuracy_and_ordering():
    acc = accuracy(table(), "x")
    assert sorted(acc.error.round(3)) == [-0.2, -0.143, 0.1]
    s = summary(acc)
    assert s["points"] == 3 and abs(s["median_abs_error"] - 0.143) < 1e-3
    # fast vs baseline and fast vs same differ beyond their spreads; both ordered right
    assert (s["ordered_pairs"], s["ordered_agree"]) == (2, 2)
    # the speedup error, two points (not the baseline): 2.75/2 - 1 = +37.5%, (11/9)/0.95 - 1
    assert sorted(acc.speedup_error.dropna().round(4)) == [0.2865, 0.375]
    assert s["speedup_points"] == 2 and abs(s["max_abs_speedup_error"] - 0.375) < 1e-9
    assert abs(s["time_repeatability_pct"] - 2.0) < 1e-9  # the larger side: 2% of the median
    assert abs(s["speedup_repeatability_pct"] - 3.0) < 1e-9
    line = summary_line(s)
    assert "time error median 14.3%" in line and "speedup error" in line and "largest 37.5%" in line
    assert "repeatability" in line and "+-2.0%" in line and "+-3.0%" in line


def test_section_and_figure(tmp_path):
    text = predicted_section(table(), "x", tmp_path)
    assert "## Predicted vs measured" in text and "+10.0%" in text
    assert (tmp_path / "figures" / "predicted_vs_measured.png").exists()
    assert accuracy_figure(accuracy(table(), "x"), tmp_path / "a.png").exists()


def test_the_speedup_over_the_gloo_baseline_is_compared_too():
    """comm=shm: rows with `speedup_gloo` on both sides get its error, in the summary line and
    the table; the gloo baseline's own (x1 by definition) and a table without it have none."""
    df = table()
    gloo = {"baseline": (1.5, 1.2), "fast": (3.0, 3.3), "same": (1.4, 1.4)}
    df["speedup_gloo"] = [gloo[s][df.source[i] == "predicted"] for i, s in enumerate(df.schedule)]
    extra = {
        "experiment": "x",
        "schedule": "baseline(gloo)",
        "world_size": 2,
        "size": 64,
        "shape": "[64]",
        "dtype": "f32",
        "topology": "local",
        "speedup_gloo": 1.0,
    }
    df = pd.concat(
        [
            df,
            pd.DataFrame(
                [
                    {
                        **extra,
                        "source": "measured",
                        "time_ms": 15.0,
                        "time_ms_min": 14.0,
                        "time_ms_max": 16.0,
                        "speedup": 0.67,
                    },
                    {**extra, "source": "predicted", "time_ms": 13.2, "speedup": 11 / 13.2},
                ]
            ),
        ]
    )
    acc = accuracy(df, "x")
    errors = dict(zip(acc.schedule, acc.speedup_gloo_error.round(4)))
    assert errors["fast"] == 0.1 and errors["same"] == 0.0 and errors["baseline"] == -0.2
    assert errors["baseline(gloo)"] != errors["baseline(gloo)"]  # NaN: x1 by definition
    s = summary(acc)
    assert s["speedup_gloo_points"] == 3
    assert abs(s["median_abs_speedup_gloo_error"] - 0.1) < 1e-9
    assert abs(s["max_abs_speedup_gloo_error"] - 0.2) < 1e-9
    assert "over the gloo baseline median 10.0%, largest 20.0%" in summary_line(s)
    text = accuracy_table(acc)
    assert "over gloo" in text and "x3.000 / x3.300 | +10.0% |" in text
    assert "over gloo" not in accuracy_table(accuracy(table(), "x"))
    assert "over the gloo baseline" not in summary_line(summary(accuracy(table(), "x")))
    # a gloo run's table read back from results.csv has the column, empty: no "xnan" column
    empty = table().assign(speedup_gloo=float("nan"))
    assert "over gloo" not in accuracy_table(accuracy(empty, "x"))
    assert "nan" not in accuracy_table(accuracy(empty, "x"))
    # nor a speedup column of xnan where there are no speedups (calibrate's benchmarks)
    assert "nan" not in accuracy_table(accuracy(table().assign(speedup=float("nan")), "x"))


def test_rows_of_two_transports_pair_with_their_own_prediction(tmp_path):
    """collectives with comm=shm: gloo and shm measured at the same size, each predicted on its
    own transport's topology; each measured row is compared with its own (before: both with
    whichever came first, a shm prediction for gloo's row)."""
    rows = []
    for comm, meas, pred in (("gloo", 10.0, 9.0), ("shm", 2.0, 2.2)):
        common = {
            "experiment": "collectives",
            "schedule": "all_reduce",
            "world_size": 2,
            "size": 1 << 20,
            "shape": "[262144]",
            "dtype": "f32",
            "topology": "local",
            "comm": comm,
            "speedup": float("nan"),
        }  # no speedup: as read back
        rows.append(
            {
                **common,
                "source": "measured",
                "time_ms": meas,
                "time_ms_min": meas,
                "time_ms_max": meas,
            }
        )
        rows.append({**common, "source": "predicted", "time_ms": pred})
    acc = accuracy(pd.DataFrame(rows), "collectives")
    assert len(acc) == 2
    assert dict(zip(acc["comm"], acc.error.round(3))) == {"gloo": -0.1, "shm": 0.1}
    figure = tmp_path / "busbw.png"
    from reports.predicted import busbw_figure

    assert busbw_figure(pd.DataFrame(rows).assign(busbw_gbps=1.0), figure).exists()
