"""One step as one CUDA graph (`codegen.runtime.graph.StepGraph`), as far as a machine without a
GPU shows it: every backend says why it cannot capture (the CPU: "no CUDA graphs on the CPU"), the
rules are asked in order, a capture that fails runs the step eagerly with the error as its reason,
ranks agree (a step some rank could not capture runs eagerly everywhere), a captured step replays;
and the harness's measured rows carry `graphed`, `graph_reason` and `host_us` into results.csv
(2 gloo ranks). The capture itself (torch.cuda.graph over CuPy kernels and NCCL) needs a GPU:
`scripts/gpu_figures.py` checks it there."""

import csv

import pytest

import experiments
from codegen.runtime import backend as backends
from codegen.runtime import graph
from codegen.runtime.graph import OTHER_RANK, StepGraph, reason_not_to_capture
from experiments import MeasureSettings, harness
from reports.results import COLUMNS


class _Runner:
    """What StepGraph reads of a PlanRunner: backend, plan, marks, run(), compute_ms."""

    def __init__(self, backend, marks=None):
        self.backend, self.plan, self.marks, self.calls, self.compute_ms = (
            backend,
            None,
            marks,
            0,
            0.0,
        )

    def run(self):
        self.calls += 1
        self.compute_ms += 1.0


class _Capturable(backends.CpuBackend):
    """A backend with no objection to graphs (on this machine the capture itself then fails)."""

    def graph_reason(self, plan):
        return None


def test_every_backend_says_why_it_cannot_capture_here():
    for comm in backends.CpuBackend.COMMS:
        assert backends.CpuBackend(comm=comm).graph_reason(None) == "no CUDA graphs on the CPU"
    cuda = backends.get("cuda")
    assert cuda.graph_reason(None) == cuda.cannot_run() and cuda.cannot_run()  # no GPU here


def test_the_cpu_runs_eagerly_and_says_why():
    r = _Runner(backends.CpuBackend())
    step = StepGraph.capture(r)
    assert not step.graphed and step.reason == "no CUDA graphs on the CPU"
    assert r.calls == 0  # nothing warmed up where nothing is captured
    step.run()
    step.run()
    assert r.calls == 2 and step.compute_ms == 2.0
    assert step.columns() == {"graphed": False, "graph_reason": "no CUDA graphs on the CPU"}


def test_the_rules_are_asked_in_order():
    assert reason_not_to_capture(_Runner(_Capturable())) is None
    timeline = reason_not_to_capture(_Runner(_Capturable(), marks=[]))
    assert "timeline" in timeline
    # the backend's reason comes first
    assert reason_not_to_capture(_Runner(backends.CpuBackend(), marks=[])) == (
        "no CUDA graphs on the CPU"
    )


def test_a_failed_capture_runs_eagerly_with_the_error_as_its_reason():
    r = _Runner(_Capturable())
    step = StepGraph.capture(r)  # torch here is a CPU build: torch.cuda cannot capture
    assert not step.graphed and step.reason.startswith("capture failed: RuntimeError: ")
    assert "\n" not in step.reason
    step.run()
    assert r.calls == 1


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_a_captured_step_replays_and_ranks_agree(monkeypatch):
    captured = []

    def fake(run, warmup):
        for _ in range(warmup):
            run()
        captured.append(_Graph())
        return captured[-1]

    monkeypatch.setattr(graph, "cuda_graph", fake)
    r = _Runner(_Capturable())
    votes = []
    step = StepGraph.capture(r, agree=lambda ok: votes.append(ok) or ok, warmup=3)
    assert step.graphed and step.reason is None and votes == [True]
    assert r.calls == 3  # the warm-up ran for real
    step.run()
    step.run()
    assert captured[0].replays == 2 and r.calls == 3 and step.compute_ms == 3.0
    assert step.columns() == {"graphed": True, "graph_reason": ""}
    # another rank could not capture: this one runs eagerly too, and says so
    r = _Runner(_Capturable())
    step = StepGraph.capture(r, agree=lambda ok: False)
    assert not step.graphed and step.reason == OTHER_RANK
    step.run()
    assert r.calls == graph.WARMUP + 1
    # a rank whose backend objects still votes (the others wait for its vote)
    votes.clear()
    StepGraph.capture(_Runner(backends.CpuBackend()), agree=lambda ok: votes.append(ok) or ok)
    assert votes == [False]


def test_a_step_graph_has_a_graph_or_a_reason():
    with pytest.raises(ValueError):
        StepGraph(_Runner(backends.CpuBackend()))
    with pytest.raises(ValueError):
        StepGraph(_Runner(backends.CpuBackend()), _Graph(), "why")


@pytest.mark.slow
def test_measured_rows_say_whether_the_step_was_a_graph_and_its_host_time(tmp_path):
    assert {"host_us", "graphed", "graph_reason"} <= set(COLUMNS)
    adam = experiments.get("adam_fusion")
    fused = "fuse(RS-C-AG)+as_slice"
    settings = MeasureSettings(
        scale="smoke",
        max_elements=1 << 12,
        world_size=2,
        warmup=0,
        repeats=1,
        points=[{"N": 1 << 12}],
        csv_path=tmp_path / "results.csv",
        kernels_dir=tmp_path / "kernels",
        schedules={fused: adam.schedules()[fused]},
    )
    rows = {r["schedule"]: r for r in harness.measure(adam, settings)}
    assert set(rows) == {"baseline", "fuse(RS-C-AG)+as_slice"}
    fused, base = rows["fuse(RS-C-AG)+as_slice"], rows["baseline"]
    assert fused["verified"] and base["verified"]
    assert (fused["graphed"], fused["graph_reason"]) == (False, "no CUDA graphs on the CPU")
    assert (base["graphed"], base["graph_reason"]) == (False, harness.BASELINE_EAGER)
    # on the CPU a call blocks: the host's time to issue a step is the step's own time
    assert all(0 < r["host_us"] for r in rows.values())
    assert fused["host_us"] <= 1e3 * fused["time_ms_max"] * 10
    table = {r["schedule"]: r for r in csv.DictReader((tmp_path / "results.csv").open())}
    assert table["fuse(RS-C-AG)+as_slice"]["graph_reason"] == "no CUDA graphs on the CPU"
    assert table["fuse(RS-C-AG)+as_slice"]["graphed"] == "False"
    assert float(table["baseline"]["host_us"]) > 0
