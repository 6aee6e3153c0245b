"""The progress bar's estimate of the time left, and the run summaries (pure functions of the
results table)."""

import pandas as pd
import pytest

from reports.predicted import busbw_table
from reports.progress import Progress, clock_text
from reports.reproduction import kernels_list, nest, summary_rows
from reports.summary import experiment_summary, markdown_table, schedule_summary, text_table


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_estimates_time_left_from_weights():
    clock = Clock()
    bar = Progress([1, 1, 2], label="x", clock=clock)
    assert bar.left_s() is None and "?" in bar.line()
    clock.t = 10.0
    line = bar.step("first")
    # a quarter of the weight in 10 s: 30 s left
    assert bar.left_s() == pytest.approx(30.0)
    assert "1/3" in line and "25%" in line and "0:10 elapsed" in line and "~0:30 left" in line
    assert line.endswith("first")
    clock.t = 20.0
    bar.step()
    clock.t = 40.0
    line = bar.step()
    assert bar.left_s() == 0 and "3/3" in line and "100%" in line and "#" * 20 in line
    bar.step()  # past the end stays at the end
    assert bar.done == 3


def test_progress_rejects_empty_work_and_formats_clock():
    with pytest.raises(ValueError):
        Progress([])
    with pytest.raises(ValueError):
        Progress([0, 0])
    assert clock_text(42) == "0:42" and clock_text(185) == "3:05" and clock_text(3729) == "1:02:09"


def _df():
    rows = []
    for source, topo, ws in (
        ("measured", "local", 2),
        ("predicted", "local", 2),
        ("predicted", "dgx2", 256),
    ):
        for n in (1 << 20, 1 << 22):
            for sched, t in (("baseline", 10.0), ("AR-C", 8.0), ("fuse(RS-C-AG)", 5.0)):
                t = t * (1.1 if source == "predicted" else 1.0) * (2 if ws == 256 else 1)
                rows.append(
                    {
                        "experiment": "adam_fusion",
                        "schedule": sched,
                        "source": source,
                        "topology": topo,
                        "world_size": ws,
                        "size": n,
                        "shape": f"[{n}]",
                        "time_ms": t,
                        "time_ms_min": t * 0.95,
                        "time_ms_max": t * 1.05,
                        "speedup": 10.0
                        / (t / (1.1 if source == "predicted" else 1.0) / (2 if ws == 256 else 1)),
                        "verified": True if source == "measured" else None,
                    }
                )
    return pd.DataFrame(rows)


def test_schedule_summary_at_the_largest_point():
    header, rows = schedule_summary(_df(), "adam_fusion")
    assert header == ["schedule", "measured 2^22", "predicted local 2^22", "dgx2 (256) 2^22"]
    assert rows == [
        ["AR-C", "x1.25", "x1.25", "x1.25"],
        ["fuse(RS-C-AG)", "x2.00", "x2.00", "x2.00"],
    ]
    text = text_table(header, rows)
    assert text.splitlines()[0].startswith("schedule") and "x2.00" in text


def test_experiment_summary_and_paper_rows():
    header, rows = experiment_summary(_df(), "adam_fusion")
    assert rows[0][0] == "adam_fusion"
    assert rows[0][1] == "4 (4)"  # four measured schedule points, all verified
    assert rows[0][2].startswith("x2.00 fuse(RS-C-AG) @ 2^")
    assert rows[0][3] == "10.0%, 10.0%"  # every prediction 10% high
    assert rows[0][4] == "0.0%, 0.0%"  # ... so every predicted speedup is the measured one
    assert rows[0][5] == "+-n/a, +-n/a"  # these rows carry no 95% intervals
    assert rows[0][6] == "dgx2: x2.00 fuse(RS-C-AG)"
    header, rows = summary_rows(_df(), ["calibrate", "adam_fusion"], {"adam_fusion": (9, 10)})
    assert header[1] == "checks verified" and len(rows) == 1 and rows[0][1] == "9/10"
    md = markdown_table(header, rows)
    assert md.count("\n") == 3 and md.startswith("| experiment | checks verified |")


def test_nest_moves_headings_down_and_links_under_the_run():
    text = "## Measured\n![a](figures/a.png) and [b](http://x/y)\n### t"
    assert (
        nest(text, "adam") == "### Measured\n![a](adam/figures/a.png) and [b](http://x/y)\n#### t"
    )


def test_kernels_list(tmp_path):
    assert "no generated kernels" in kernels_list(tmp_path)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k1.cpp").write_text("x" * 2048)
    assert "`k1.cpp` (2.0 KiB)" in kernels_list(tmp_path)


def test_busbw_table_sides_by_side():
    df = pd.DataFrame(
        [
            {
                "experiment": "collectives",
                "schedule": "all_reduce",
                "source": s,
                "topology": t,
                "world_size": w,
                "size": 1 << 20,
                "busbw_gbps": b,
            }
            for s, t, w, b in (
                ("measured", "local", 2, 1.5),
                ("predicted", "local", 2, 1.6),
                ("predicted", "dgx_a100", 8, 100.0),
            )
        ]
    )
    text = busbw_table(df)
    assert "### all_reduce" in text and "| 1 MiB | 1.5 | 1.6 | 100 |" in text


def test_repeatability_compares_the_same_collective_measured_twice():
    from reports.reproduction import repeatability

    rows = [
        {"experiment": e, "schedule": "all_reduce", "source": "measured", "size": n, "time_ms": t}
        for e, n, t in (
            ("calibrate", 4096, 1.0),
            ("calibrate", 8192, 2.0),
            ("collectives", 4096, 1.5),
            ("collectives", 8192, 2.0),
        )
    ]
    text = repeatability(pd.DataFrame(rows))
    assert "| all_reduce | 2 | 25.0% | 50.0% |" in text
    assert repeatability(pd.DataFrame(rows[:2])) == ""
    # comm=shm: collectives' shared-memory rows are not gloo's call measured again
    shm = [{**r, "time_ms": 0.1, "comm": "shm"} for r in rows[2:]]
    both = pd.DataFrame(rows[:2] + [{**r, "comm": "gloo"} for r in rows[2:]] + shm)
    assert "| all_reduce | 2 | 25.0% | 50.0% |" in repeatability(both)
    # a calibration that also timed them among collectives only: those are the first time
    alone = [{**r, "schedule": "alone_all_reduce", "time_ms": t} for r, t in zip(rows, (1.5, 1.6))]
    assert "| all_reduce | 2 | 12.5% | 25.0% |" in repeatability(pd.DataFrame(rows + alone))


def test_collectives_of_two_transports_get_a_summary_row_each():
    """comm=shm measures gloo and shared memory side by side: one row per (collective, comm),
    each with its own measured and predicted busbw."""
    rows = []
    for comm, meas, pred in (("gloo", 1.8, 1.7), ("shm", 5.7, 5.4)):
        common = {
            "experiment": "collectives",
            "schedule": "all_reduce",
            "world_size": 2,
            "size": 1 << 27,
            "shape": "[33554432]",
            "topology": "local",
            "comm": comm,
        }
        rows += [
            {**common, "source": "measured", "busbw_gbps": meas},
            {**common, "source": "predicted", "busbw_gbps": pred},
        ]
    header, table = schedule_summary(pd.DataFrame(rows), "collectives")
    assert [r[0] for r in table] == ["all_reduce (gloo)", "all_reduce (shm)"]
    assert [r[1:] for r in table] == [["1.80", "1.70"], ["5.70", "5.40"]]


def test_busbw_table_keeps_the_transports_apart():
    """comm=shm: gloo's and shm's rows at one size are two columns (a pivot averaged them)."""
    df = pd.DataFrame(
        [
            {
                "experiment": "collectives",
                "schedule": "all_reduce",
                "source": s,
                "topology": "local",
                "world_size": 2,
                "size": 1 << 20,
                "comm": c,
                "busbw_gbps": b,
            }
            for s, c, b in (
                ("measured", "gloo", 1.5),
                ("measured", "shm", 6.0),
                ("predicted", "gloo", 1.6),
                ("predicted", "shm", 5.0),
            )
        ]
    )
    text = busbw_table(df)
    assert "measured gloo local (2)" in text and "measured shm local (2)" in text
    assert "| 1 MiB | 1.5 | 6 | 1.6 | 5 |" in text
