"""experiments.table1 and table1_memory: the activation count against the peak measured on this
machine's CPU, BERT's parameter count, and the predicted Table 1's rows in the paper's set-up."""

from __future__ import annotations

import pytest

from coconet.programs import PUBLISHED
from cost_model.topology import load_topology
from experiments import bert as B
from experiments import table1 as T
from experiments import table1_memory as M

PEAK_TOLERANCE = 0.02  # measured per-sample peak against the count, relative


@pytest.mark.parametrize(
    "size", [B.ModelSize(2, 64, 2, 256, 32), B.ModelSize(2, 128, 4, 1024, 64)], ids=str
)
def test_the_activation_count_matches_the_measured_peak(size):
    measured = M.measured_peak_per_sample(size, micro_batches=(4, 8))
    counted = M.peak_bytes(M.shapes_of(size))
    assert abs(measured / counted - 1) < PEAK_TOLERANCE, (measured, counted)


def test_the_kept_count_matches_what_autograd_saves():
    size = B.ModelSize(2, 64, 2, 256, 32)
    saved = B.activation_bytes(size.model(0), *size.batch(0, 0, 0, 4)) / 4
    assert abs(saved / M.kept_bytes(M.shapes_of(size)) - 1) < 1e-3


def test_korthikanti_per_layer_figure_at_f16_with_dropout():
    m = T.bert_shapes(24, 1024)
    s, h, a = 128, 1024, 16
    stats = 2 * M.STATS_BYTES * s  # the LayerNorms' f32 mean and rstd, beside Korthikanti's
    assert M._layer_bytes(m) == s * h * (34 + 5 * a * s / h) + stats


def test_bert_parameters_from_shapes():
    assert [T.bert_parameters(layers, h) for _, layers, h in T.BERT] == [
        336_226_108,
        1_280_595_772,
        3_869_081_404,
    ]


@pytest.fixture(scope="module")
def rows():
    return T.predict_table1(load_topology("dgx2", nodes=16), 256)


def test_rows_in_the_papers_set_up(rows):
    assert len(rows) == 3 * 2 * 2 and {r["world_size"] for r in rows} == {256}
    by = {(r["shape"].split()[0], r["optimizer"], r["schedule"]): r for r in rows}
    for opt in ("adam", "lamb"):
        base, fused = by[("BERT-336M", opt, "baseline")], by[("BERT-336M", opt, PUBLISHED)]
        assert base["speedup"] == 1.0 and fused["speedup"] >= 1.0
        assert base["state_bytes"] == T.STATE_BYTES_PER_PARAM * 336_226_108
        assert fused["state_bytes"] < base["state_bytes"] / 100  # w, m, v and scratch sliced
        assert fused["micro_batch"] > base["micro_batch"] > 0
        for r in (base, fused):
            assert r["memory_bytes"] <= T.MEMORY_BYTES
            assert r["time_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"], abs=2e-3)
        # 1.2B: the baseline's 23 GB of weights and state leave a small micro-batch
        assert by[("BERT-1.2B", opt, PUBLISHED)]["speedup"] > fused["speedup"]
        # 3.9B: 70 GB of weights and state do not fit a 32 GB V100; the sliced ones do
        assert by[("BERT-3.9B", opt, "baseline")]["micro_batch"] == 0
        assert by[("BERT-3.9B", opt, PUBLISHED)]["micro_batch"] > 0
        assert "at their batches" in by[("BERT-1.2B", opt, PUBLISHED)]["note"]


def test_the_baseline_hides_its_all_reduce_but_the_last_bucket(rows):
    base = next(r for r in rows if r["schedule"] == "baseline" and r["micro_batch"])
    assert base["comm_ms"] > 0 and base["overlapped_ms"] > base["comm_ms"]
