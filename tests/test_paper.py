"""`python -m suite experiment=paper scale=smoke`: every experiment into one run directory, one
reproduction report. The run (about 2 minutes) is made once; the tests read what it wrote:
report.html parsed (every figure embedded, at least one table per experiment), the merged CSV and
the LaTeX tables, the environment, and the summary it prints last."""

import csv
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

import experiments

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = [
    "adam_fusion",
    "lamb_fusion",
    "model_parallel",
    "pipeline_parallel",
    "collectives",
    "calibrate",
]


@pytest.fixture(scope="module")
def paper_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "experiment=paper", "scale=smoke", f"hydra.run.dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


class Sections(HTMLParser):
    """Per <h2> section of the page: its tables and its images' src."""

    def __init__(self):
        super().__init__()
        self.sections, self.heading, self.current = {}, False, None

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self.heading = True
        elif self.current is not None and tag in ("table", "img"):
            self.sections[self.current][tag].append(dict(attrs).get("src", ""))

    def handle_endtag(self, tag):
        if tag == "h2":
            self.heading = False

    def handle_data(self, data):
        if self.heading:
            self.current = data.strip()
            self.sections.setdefault(self.current, {"table": [], "img": []})


@pytest.mark.slow
def test_report_html_embeds_every_figure_and_has_a_table_per_experiment(paper_run):
    out, _ = paper_run
    page, html = Sections(), (out / "report.html").read_text()
    page.feed(html)
    for name in EXPERIMENTS + ["Summary"]:
        assert name in page.sections, name
        assert page.sections[name]["table"], f"no table in the {name} section"
    md = (out / "report.md").read_text()
    images = [src for s in page.sections.values() for src in s["img"]]
    assert len(images) == md.count("![") >= 8
    for src in images:
        assert src.startswith("data:image/png;base64,") and len(src) > 5000
    # nothing fetched from elsewhere (not "http" in the base64 data: that can occur there by
    # chance, and once did)
    assert 'src="http' not in html and "src='http" not in html


def test_report_tables_and_merged_results(paper_run):
    out, _ = paper_run
    df = pd.read_csv(out / "results.csv")
    assert set(df.experiment) == set(EXPERIMENTS)
    measured = df[(df.source == "measured") & df.experiment.isin(EXPERIMENTS[:4])]
    assert len(measured) > 0 and measured.verified.astype(str).eq("True").all()
    predicted = set(df[df.source == "predicted"].topology)
    assert {"local", "dgx2", "dgx_a100", "dgx_h100"} <= predicted
    for name in EXPERIMENTS:
        for source in ("measured", "predicted"):
            tex = (out / "tables" / f"{name}_{source}.tex").read_text()
            assert r"\toprule" in tex and r"\bottomrule" in tex
            assert len(pd.read_csv(out / "tables" / f"{name}_{source}.csv")) > 0


def test_environment_and_summary(paper_run):
    out, stdout = paper_run
    env = json.loads((out / "environment.json").read_text())
    for key in ("cpu", "cores", "torch", "suite_commit", "date", "world_size", "command"):
        assert env[key] not in (None, ""), key
    md = (out / "report.md").read_text()
    assert "## Environment" in md and env["torch"] in md
    assert "experiment=paper" in md  # the command that regenerates it
    assert "== summary: paper ==" in stdout and f"report: {out / 'report.md'}" in stdout
    assert "left" in stdout and "elapsed" in stdout  # progress with the time left
    # the later runs predict this machine with the topology calibrated in this run
    assert f"predict this machine with {out / 'calibrate' / 'topology.yaml'}" in stdout
    for name in EXPERIMENTS:
        assert (out / name / "report.md").exists()


@pytest.mark.parametrize("name", EXPERIMENTS[:4])
def test_each_program_experiment_verifies_at_smoke_scale(paper_run, name):
    """Each experiment's own run inside the paper run: every schedule verified and measured on
    4 ranks, and the baseline's library time beside its matmul (Megatron's tail), which is what
    the cost model takes."""
    out, _ = paper_run
    exp = experiments.get(name)
    report = (out / name / "report.md").read_text()
    assert report.startswith(f"# {name}\n") and exp.figure in report
    for schedule in exp.schedules():
        assert f"### {schedule}\n" in report and f"| `{schedule}` | 4 |" in report
    assert " no |" not in report
    rows = list(csv.DictReader((out / name / "results.csv").open()))
    base = [r for r in rows if r["source"] == "measured" and r["schedule"] == "baseline"]
    assert base
    for r in base:
        if name == "model_parallel":
            assert 0 < float(r["library_ms"]) < float(r["compute_ms"]), r
        elif name == "pipeline_parallel":
            assert float(r["library_ms"]) == pytest.approx(float(r["compute_ms"]), abs=1e-3)
        else:
            assert r["library_ms"] == "", r


def _copy(paper_run, tmp_path) -> Path:
    """A copy of the paper run, for a test that rewrites it."""
    import shutil

    copy = tmp_path / "paper"
    shutil.copytree(paper_run[0], copy)
    return copy


def _report(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "suite.report", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_suite_report_rebuilds_a_paper_run(paper_run, tmp_path):
    """python -m suite.report on an experiment=paper run: every run's report, then the
    reproduction report with the checks the run recorded (on a copy of the run)."""
    copy = _copy(paper_run, tmp_path)
    before = (copy / "report.md").read_text()
    for p in [copy / "report.md", *(copy / n / "report.md" for n in EXPERIMENTS)]:
        p.unlink()
    proc = _report(copy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report: {copy / 'report.md'}" in proc.stdout
    assert "== summary: paper ==" in proc.stdout
    for name in EXPERIMENTS:
        assert (copy / name / "report.md").exists(), name
    after = (copy / "report.md").read_text()
    checks = json.loads((copy / "environment.json").read_text())["checks"]
    assert checks["adam_fusion"][1] > 0
    for name, (verified, total) in checks.items():  # as the run reported them
        line = f"{verified} of {total} checks verified the schedules"
        assert line in before and line in after, name
    assert after.count("## ") == before.count("## ")


@pytest.mark.slow
def test_suite_report_on_a_paper_run_with_a_broken_environment_is_one_line(paper_run, tmp_path):
    copy = _copy(paper_run, tmp_path)
    (copy / "environment.json").write_text("{not json")
    proc = _report(copy)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "environment.json" in proc.stderr
    assert "Traceback" not in proc.stderr
