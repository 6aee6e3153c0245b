"""The headline figures the README (or the manual's results page) shows are the reference run's
rows: each "best measured speedup" cell is that experiment's largest measured speedup in
docs/reference/results.csv, with its schedule and point, and each busbw figure is the predicted
all_reduce row at the size it names. A figure edited by hand, or left from another run, fails."""

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference" / "results.csv"
PAGES = [ROOT / "docs" / "results.md", ROOT / "README.md"]
SPEEDUP = re.compile(r"^(\d+\.\d+)x (\S+) at (\S+)")


def headline_rows() -> list[list[str]]:
    """The cells of the headline table (its header starts with `| experiment (paper figure)`)."""
    for page in PAGES:
        if not page.exists():
            continue
        lines = page.read_text().splitlines()
        for k, line in enumerate(lines):
            if line.startswith("| experiment (paper figure)"):
                body = []
                for row in lines[k + 2 :]:
                    if not row.startswith("|"):
                        break
                    body.append([c.strip() for c in row.strip("|").split("|")])
                return body
    return []


@pytest.fixture(scope="module")
def reference():
    if not REFERENCE.exists():
        pytest.skip("no reference run committed")
    return pd.read_csv(REFERENCE, low_memory=False)


def test_each_best_measured_speedup_is_its_row(reference):
    rows = headline_rows()
    assert rows, "no headline table found"
    measured = reference[reference.source == "measured"]
    checked = 0
    for cells in rows:
        experiment = cells[0].split()[0]
        found = SPEEDUP.match(cells[2])
        if not found:
            continue
        value, schedule, point = found.groups()
        mine = measured[(measured.experiment == experiment) & measured.speedup.notna()]
        best = mine.loc[mine.speedup.idxmax()]
        where = f"2^{int(best['size']).bit_length() - 1}" if "=" not in point else best["shape"]
        assert (f"{best.speedup:.2f}", best.schedule, where) == (value, schedule, point), cells
        checked += 1
    assert checked >= 4


def test_each_busbw_figure_is_the_predicted_row_at_its_size(reference):
    cells = [c for row in headline_rows() if row[0].startswith("collectives") for c in row]
    text = " ".join(cells)
    at = reference[
        (reference.experiment == "collectives")
        & (reference.source == "predicted")
        & (reference.schedule == "all_reduce")
    ]
    checked = 0
    for label, topology in (("DGX A100", "dgx_a100"), ("DGX H100", "dgx_h100")):
        found = re.search(label + r" (\d+) GB/s", text)
        assert found, text
        one_gib = at[(at.topology == topology) & (at["size"] == 1 << 30)]
        assert len(one_gib) == 1, one_gib
        assert round(float(one_gib.busbw_gbps.iloc[0])) == int(found.group(1)), (label, text)
        checked += 1
    assert "at 1 GiB" in text and checked == 2
