"""Every figure says what it is (issue 54): a bus bandwidth labelled with its size is that
size's, a summary's predicted column is the measured point's, the report defines the predicted
baseline and says what a smoke run can show."""

from __future__ import annotations

import pandas as pd

from reports.predicted import BASELINE_NOTE, predicted_section
from reports.summary import best_busbw, busbw_at, busbw_summary, schedule_summary


def test_busbw_at_a_size_is_that_sizes_and_the_best_says_where():
    rows = pd.DataFrame(
        {
            "schedule": ["all_reduce"] * 3 + ["all_gather"],
            "size": [1 << 28, 1 << 29, 1 << 30, 1 << 30],
            "busbw_gbps": [140.0, 155.1, 119.5, 200.0],
        }
    )
    assert busbw_at(rows, 1 << 30) == 119.5
    assert best_busbw(rows) == (155.1, 1 << 29)
    assert (
        busbw_summary("dgx_a100", rows)
        == "dgx_a100: all_reduce 119.5 GB/s at 1 GiB (best 155.1 at 512 MiB)"
    )


def test_the_predicted_local_column_is_the_measured_points_own():
    """model_parallel's points share a size and differ in K: the local prediction shown beside
    the largest measured point is that point's, not its neighbour's."""
    common = dict(experiment="model_parallel", world_size=2, size=1 << 20)
    rows = []
    for shape, (measured, predicted) in {"K=128": (1.1, 1.17), "K=512": (1.3, 1.35)}.items():
        for source, x in (("measured", measured), ("predicted", predicted)):
            rows.append(
                {
                    **common,
                    "shape": shape,
                    "schedule": "MM-RS-C-AG",
                    "source": source,
                    "topology": "local",
                    "speedup": x,
                }
            )
    header, table = schedule_summary(pd.DataFrame(rows), "model_parallel")
    assert header[1].startswith("measured") and header[2].startswith("predicted local")
    (row,) = table
    assert row[1:3] == ["x1.30", "x1.35"]  # K=512's, the largest point in shape order


def test_the_report_defines_the_predicted_baseline(tmp_path):
    (tmp_path / "figures").mkdir()
    df = pd.DataFrame(
        [
            {
                "experiment": "adam_fusion",
                "schedule": s,
                "source": "predicted",
                "topology": "dgx_h100",
                "world_size": 8,
                "size": 1024,
                "shape": "[1024]",
                "time_ms": t,
                "speedup": 0.1 / t,
                "compute_ms": 0.0,
                "comm_ms": t,
                "overlapped_ms": 0.0,
                "algo": "ring",
                "proto": "LL",
            }
            for s, t in (("baseline", 0.1), ("AR-C", 0.1))
        ]
    )
    text = predicted_section(df, "adam_fusion", tmp_path)
    assert BASELINE_NOTE in text and "nothing was measured" in BASELINE_NOTE


def test_a_report_opens_with_what_its_baseline_is_and_what_its_scale_shows():
    from reports.markdown import compared, render_report

    cpu = compared("cpu", "shm", "smoke", True, True)
    assert "torch.distributed's collective on gloo" in cpu and "baseline(gloo)" in cpu
    assert "NCCL's all-reduce" in cpu and "figures mean nothing" in cpu
    sim = compared("sim", "ring", "default", False, False)
    assert sim.startswith("Nothing is measured on backend sim") and "local topology" not in sim
    assert "NCCL's all-reduce" in sim
    assert "on NCCL" in compared("cuda", "nccl", "paper", True, False)
    text = render_report(
        experiment="e", figure="Fig. 1", settings={}, programs={}, checks=[], comparison=cpu
    )
    assert text.index("## What is compared") < text.index("## Settings")
