"""experiment=tensor_parallel: the sequence-parallel MLP block and its overlapped schedules.

- every schedule is equivalent to the block (`dsl.check_equivalent`) at the smoke and default
  verification sizes, and the block's GeLU is torch's;
- the matmul + collective pairs at the published sizes: the copy engines hide the all-gather at
  least as well as NCCL's kernel (it takes SMs from the matmul), a reduce-scatter has no
  copy-engine row (it reduces on SMs), and every pair overlapped is no slower than one after
  the other (the model leaves out L2 and power interference: see cost_model.contention);
- the suite runs it end to end at smoke scale: measured rows verified, predicted rows on
  dgx_h100 and dgx_b200 for every schedule, the report's section with the pairs.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import dsl
import experiments
from experiments import tensor_parallel as tp

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("scale", ["smoke", "default"])
def test_every_schedule_is_the_block(scale):
    block = tp.program()
    for bindings in tp.verify_bindings(scale):
        for name, sched in tp.schedules().items():
            for world in (2, 4):
                dsl.check_equivalent(block, sched, world, trials=2, bindings=bindings)


def test_the_blocks_gelu_is_torchs():
    b = {"S": 16, "B": 2, "H": 8, "F": 16}
    inputs = dsl.random_inputs(tp.program(), 2, b, np.random.default_rng(0))
    got = dsl.interpret(tp.program(), inputs, 2, b)
    x = np.concatenate([inputs[r]["x"] for r in range(2)])
    w1 = np.concatenate([inputs[r]["w1"] for r in range(2)], axis=1)
    w2 = np.concatenate([inputs[r]["w2"] for r in range(2)], axis=0)
    t = torch.from_numpy
    z = torch.nn.functional.gelu(t(x) @ t(w1)) @ t(w2)
    want = z.numpy().reshape(2, 8, 2, 8)
    for r in range(2):
        np.testing.assert_allclose(got[r]["z"], want[r], rtol=1e-4, atol=1e-4)


def test_the_pairs_say_what_each_way_of_overlapping_gives():
    rows = pd.DataFrame(tp.pairs())
    assert set(rows.topology) == {"dgx_h100", "dgx_b200"}
    assert not ((rows.pattern == "MM-RS") & (rows["mode"] == "copy_engine")).any()
    for _, g in rows.groupby(["topology", "point", "pattern"]):
        s = g.set_index("mode").speedup
        assert s["sequential"] == 1.0 and s["sm"] >= 1.0
        if "copy_engine" in s:
            assert s["copy_engine"] >= s["sm"]
    sm = rows[rows["mode"] == "sm"]
    assert (sm.sms_taken > 0).all() and (sm.speedup < 2.0).all()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_suite_runs_it_measured_and_predicted(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "experiment=tensor_parallel", "scale=smoke",
         f"hydra.run.dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    names = set(experiments.get("tensor_parallel").schedules())
    measured = df[(df.source == "measured") & df.schedule.isin(names)]
    assert set(measured.schedule) == names and measured.verified.astype(str).eq("True").all()
    predicted = df[df.source == "predicted"]
    for topo in ("dgx_h100", "dgx_b200"):
        assert names <= set(predicted[predicted.topology == topo].schedule), topo
    report = (out / "report.md").read_text()
    assert "SMs taken, or copy engines" in report and "| dgx_b200 | GPT-3 175B | AG-MM |" in report


def test_the_published_cases_are_predicted_beside_their_figures():
    """A800 is dgx_a100 with 8 NVLinks; the PyTorch pair one after the other is predicted within
    15% of its measurement; decomposed, every pair is predicted faster than one after the other;
    the report's section names every case, its source and the gaps."""
    from experiments import tp_published as pub

    a800, a100 = pub.a800(), pub.load_topology("dgx_a100")
    assert a800.intra.link.bandwidth_gbps == 200.0 and a800.nccl.channels == 8
    assert a800.device == a100.device and a800.nccl.slice_us == a100.nccl.slice_us
    for case in pub.CASES:
        pred = pub.predict_case(case)
        seq, ol = list(pred.values())[:2]
        assert ol < seq, case.name
        if case.topology == "dgx_h100":
            assert abs(seq / case.measured["NCCL + cuBLAS"] - 1) < 0.15
    text = pub.section()
    for case in pub.CASES:
        assert case.name in text and case.source in text
    assert "Domino" in text and text.count("| a800 |") == 4


@pytest.mark.slow
def test_the_autotuner_searches_the_overlaps(tmp_path):
    """experiment=autotune target=tensor_parallel on dgx_h100 (the cost model only): the search
    space holds the decomposed overlaps at several chunk counts, and its pick at each size is one."""
    out = tmp_path / "tune"
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "experiment=autotune", "target=tensor_parallel",
         "backend=sim", "topology=dgx_h100", f"hydra.run.dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = [line for line in proc.stdout.splitlines() if "predicted dgx_h100" in line]
    assert len(best) == 2 and all("best ol(AG,MM)" in line for line in best), best


def test_the_weights_are_drawn_as_a_network_initialises_them():
    """init="fan_in": a weight [K, N] is standard normal over sqrt(K), so the matmul's outputs
    have unit variance and the GeLU of them stays clear of subnormal numbers (which slow a CPU's
    next matmul several times over)."""
    b = {"S": 64, "B": 1, "H": 256, "F": 512}
    inputs = dsl.random_inputs(tp.program(), 2, b, np.random.default_rng(0))
    w1 = np.concatenate([inputs[r]["w1"] for r in range(2)], axis=1)
    assert w1.std() == pytest.approx(1 / 16, rel=0.05)
    x = np.concatenate([inputs[r]["x"] for r in range(2)])
    assert (x @ w1).std() == pytest.approx(1.0, rel=0.1)
