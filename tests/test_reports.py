"""Reports are pure functions of the results table: Markdown table, figures, HTML with embedded
figures, LaTeX (booktabs) and CSV tables, and `python -m suite.compare` of two runs (times, and
measured speedups with their spread)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from reports.figures import breakdown_figure, speedup_figure
from reports.html import write_html
from reports.latex import latex_table, write_tables
from reports.results import COLUMNS, append_row, read_table
from reports.sections import measured_section
from reports.tables import measured_table

ROOT = Path(__file__).resolve().parent.parent


def _rows(scale=1.0):
    out = []
    for n in (1 << 20, 1 << 21):
        for sched, t in (("baseline", 10.0), ("AR-C", 9.0), ("fuse(RS-C-AG)", 6.0)):
            t = t * scale * n / (1 << 20)
            out.append(
                {
                    "experiment": "adam_fusion",
                    "schedule": sched,
                    "source": "measured",
                    "backend": "cpu",
                    "topology": "local",
                    "world_size": 2,
                    "size": n,
                    "shape": f"[{n}]",
                    "dtype": "f32",
                    "time_ms": t,
                    "time_ms_min": t * 0.9,
                    "time_ms_max": t * 1.1,
                    "speedup": 10.0 * scale * n / (1 << 20) / t,
                    "verified": True,
                    "compute_ms": t / 2,
                    "comm_ms": t / 2,
                    "overlapped_ms": 0.0,
                }
            )
    return out


def _run(tmp_path, scale=1.0) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in _rows(scale):
        append_row(tmp_path / "results.csv", r)
    return tmp_path


def test_table_round_trip_and_markdown(tmp_path):
    df = read_table(_run(tmp_path) / "results.csv")
    assert tuple(df.columns) == COLUMNS
    md = measured_table(df, "adam_fusion")
    assert "| fuse(RS-C-AG) |" in md and "x1.67" in md and "2^21" in md


def test_rows_appended_to_a_file_an_older_version_began_stay_aligned(tmp_path):
    """resume=true into a results.csv with fewer columns (written before one was added): the
    new rows follow that file's header, and every row reads back in its columns."""
    path = tmp_path / "results.csv"
    old = COLUMNS[:-1]
    path.write_text(",".join(old) + "\n")
    for r in _rows():
        append_row(path, {**r, COLUMNS[-1]: 1.5})
    df = read_table(path)
    assert tuple(df.columns) == old and len(df) == len(_rows())
    assert set(df.schedule) == {r["schedule"] for r in _rows()}
    assert (df.time_ms > 0).all() and (df.experiment == "adam_fusion").all()


def test_figures_and_html_embed_everything(tmp_path):
    run = _run(tmp_path)
    df = read_table(run / "results.csv")
    text = "# adam_fusion\n\n" + measured_section(df, "adam_fusion", run)
    assert (run / "figures" / "adam_fusion.png").stat().st_size > 1000
    assert (run / "figures" / "adam_fusion.svg").exists()
    (run / "report.md").write_text(text)
    html = write_html(run / "report.md").read_text()
    assert html.count("<img") == text.count("![") == 2
    assert "data:image/png;base64," in html and "<table>" in html
    # nothing fetched from elsewhere ("http" itself can occur by chance in the base64 data)
    assert 'src="http' not in html and "src='http" not in html


def test_breakdown_figure(tmp_path):
    df = read_table(_run(tmp_path) / "results.csv")
    assert breakdown_figure(df, "adam_fusion", tmp_path / "b.png").stat().st_size > 1000
    assert speedup_figure(df, "adam_fusion", tmp_path / "s.png").exists()


def test_latex_booktabs(tmp_path):
    df = read_table(_run(tmp_path) / "results.csv")
    tex = latex_table(df, "adam_fusion")
    assert tex.startswith("\\begin{tabular}{lrr}") and "\\toprule" in tex and "\\bottomrule" in tex
    assert "fuse(RS-C-AG) & 6.00 (1.67$\\times$)" in tex and "2\\^{}20" in tex
    paths = write_tables(df, tmp_path)
    assert {p.suffix for p in paths} == {".csv", ".tex"}
    assert len(pd.read_csv(paths[0])) == 6


def test_compare_two_runs(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", scale=2.0)
    out = subprocess.run(
        [sys.executable, "-m", "suite.compare", str(a), str(b), "--out", str(tmp_path / "cmp.md")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "ratio[1]" in out.stdout and "2.000" in out.stdout
    md = (tmp_path / "cmp.md").read_text()
    assert md.count("| adam_fusion |") == 6
    bad = subprocess.run(
        [sys.executable, "-m", "suite.compare", str(tmp_path / "nope")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_compare_speedups_across_runs(tmp_path):
    """--speedup: each run's measured speedups (no baseline rows), their mean, and the largest
    deviation from it in %; the one-line summary names the point that spreads most."""
    from suite.compare import compare_speedups, spread_line

    a = _run(tmp_path / "a")
    (tmp_path / "b").mkdir()
    for r in _rows():
        if r["schedule"] == "fuse(RS-C-AG)" and r["size"] == 1 << 21:
            r = {**r, "speedup": r["speedup"] * 1.1}
        append_row(tmp_path / "b" / "results.csv", r)
    table = compare_speedups([str(a), str(tmp_path / "b")])
    assert len(table) == 4 and "baseline" not in set(table.schedule)
    worst = table.loc[table.spread.idxmax()]
    assert worst.schedule == "fuse(RS-C-AG)" and worst["size"] == 1 << 21
    assert worst["mean"] == pytest.approx(10 / 6 * 1.05)
    assert worst.spread == pytest.approx(100 * (1.1 / 1.05 - 1))  # 4.76%
    assert table.spread.drop(worst.name).max() == pytest.approx(0.0)
    assert "largest 4.8% (adam_fusion fuse(RS-C-AG) at [2097152])" in spread_line(table)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite.compare",
            "--speedup",
            str(a),
            str(tmp_path / "b"),
            "--out",
            str(tmp_path / "s.md"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "speedup[1]" in out.stdout and "speedup spread across runs: median 0.0%" in out.stdout
    assert (tmp_path / "s.md").read_text().count("| adam_fusion |") == 4


def test_compare_gathers_the_jobs_of_a_sweep(tmp_path):
    from suite.compare import load

    _run(tmp_path / "sweep" / "0_adam_fusion")
    _run(tmp_path / "sweep" / "1_adam_fusion_again", scale=2.0)
    assert len(load(str(tmp_path / "sweep"))) == 6  # the same points: the later job's kept
    with pytest.raises(FileNotFoundError):
        load(str(tmp_path / "empty"))


def test_speedup_figure_bars_for_shaped_points(tmp_path):
    rows = [
        {
            "experiment": "model_parallel",
            "schedule": s,
            "source": src,
            "topology": topo,
            "world_size": 2,
            "size": 1 << 20,
            "shape": f"S=1024,B=1,H=1024,K={k}",
            "speedup": x,
        }
        for s, x in (("baseline", 1.0), ("MM-RS-C-AG", 1.2))
        for k in (1024, 4096)
        for src, topo in (("measured", "local"), ("predicted", "dgx2"))
    ]
    path = speedup_figure(pd.DataFrame(rows), "model_parallel", tmp_path / "mp.png")
    assert path.exists() and path.with_suffix(".svg").exists()
    svg = path.with_suffix(".svg").read_text()
    assert "measured on local" in svg and "predicted on dgx2" in svg and "K=4096" in svg
