"""Bad command lines: each is refused before any work with one line (suite.cli.prevalidate, the
checks `python -m suite` makes first), checked in-process for speed; a handful also through the
real entry point (exit 2, one stderr line, no traceback), and hypothesis draws more."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suite.cli import prevalidate
from suite.errors import SuiteError

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "syntax.yaml").write_text("a: [1\n")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00bad")
    (d / "empty_fields.yaml").write_text("name: local\nnodes: -3\n")
    (d / "a_file").write_text("x")
    return d


STATIC = [
    # schedules
    "experiment.schedules=[]",
    "experiment.schedules=[nope]",
    "experiment.schedules=[AR-C,zzz]",
    "experiment=model_parallel experiment.schedules=[AR-C]",
    "experiment=lamb_fusion experiment.schedules=[]",
    # sizes against the program's symbols
    "experiment.sizes=[{N:-4}]",
    "experiment.sizes=[{N:0}]",
    "experiment.sizes=[{X:1024}]",
    "experiment.sizes=[{N:1099511627776}]",
    "experiment.sizes=[{N:1024,M:4}]",
    "experiment.sizes=[{N:1023}]",
    "experiment.sizes=[{N:2}] world_size=4",
    "experiment.sizes=[{}]",
    "backend=sim experiment.sizes=[{N:0}]",
    "backend=sim experiment.sizes=[{N:-4}]",
    "backend=sim experiment.sizes=[{X:1024}]",
    "experiment=lamb_fusion experiment.sizes=[{N:-1}]",
    "experiment=model_parallel experiment.sizes=[{S:1024,B:1,H:1024}]",
    "experiment=model_parallel experiment.sizes=[{S:0,B:1,H:1024,K:4096}]",
    "experiment=model_parallel experiment.sizes=[{S:1024,B:1,H:1024,K:4095}]",
    "experiment=pipeline_parallel experiment.sizes=[{S:8,B:1}]",
    "experiment=pipeline_parallel experiment.sizes=[{S:-8,B:1,H:12}]",
    "experiment.sizes=[{N:1024}] world_size=3",
    "world_size=3",
    "experiment=pipeline_parallel world_size=3",
    "scale.max_elements=4",
    "experiment=lamb_fusion scale.max_elements=1",
    # experiment=paper: every run it lists, before the first starts
    "experiment=paper world_size=1",
    "experiment=paper world_size=3",
    "experiment=paper backend=sim world_size=3",
    "experiment=paper verify.world_sizes=[3]",
    # seed, world sizes, scale
    "seed=-1",
    "seed=4294967296",
    "seed=-99999",
    "world_size=0",
    "world_size=-2",
    "verify.world_sizes=[]",
    "verify.world_sizes=[0]",
    "verify.trials=0",
    "scale.repeats=0",
    "scale.warmup=-1",
    "scale.max_elements=0",
    "scale.min_rounds=0",
    "scale.max_rounds=1",
    "scale.budget_s=0",
    "scale.budget_s=-5",
    "scale.long_rounds=-1",
    "scale.long_budget_s=-3",
    "scale.ci_pct=0",
    "calibration=sometimes",
    "calibration=",
    "resume=maybe",
    "calibration_pool=0",
    "calibration_pool=101",
    "calibration_pool=few",
    # names and types
    "experiment=nope",
    "scale=huge",
    "backend=tpu",
    "topology=dgx9",
    "seed=abc",
    "world_size=two",
    "nosuchkey=1",
    "+nosuchkey=1",
    "scale.nope=1",
    "experiment.sizes=7",
    "verify.trials=1.5",
    "predict_also=[{name:nope}]",
    "topology.nodes=0",
    "experiment=",
    # override syntax
    "experiment=[",
    "seed=1)",
    "=3",
    "a b c",
]
FILES = [
    "topology.path={d}/syntax.yaml",
    "topology.path={d}/list.yaml",
    "topology.path={d}/binary.yaml",
    "topology.path={d}/missing.yaml",
    "topology.path={d}/empty_fields.yaml",
    "hydra.run.dir={d}/a_file",
    "hydra.run.dir={d}/a_file/below",
    "hydra.run.dir=/proc/x",
    "hydra.run.dir=/proc/self/x/y",
]


def _refused(line: str) -> str:
    with pytest.raises(SuiteError) as info:
        prevalidate(line.split())
    message = str(info.value)
    assert message and "\n" not in message and "Traceback" not in message, line
    return message


@pytest.mark.slow
def test_at_least_60_bad_command_lines_are_refused_with_one_line(files):
    lines = STATIC + [f.format(d=files) for f in FILES]
    assert len(lines) >= 60
    for line in lines:
        _refused(line)


def test_the_messages_name_the_problem(files):
    assert "empty" in _refused("experiment.schedules=[]")
    assert "positive" in _refused("experiment.sizes=[{N:-4}]")
    assert "bind exactly ['N']" in _refused("experiment.sizes=[{X:1024}]")
    assert "GiB" in _refused("experiment.sizes=[{N:1099511627776}]")
    assert "not a whole number" in _refused("world_size=3")
    assert "range" in _refused("seed=-1")
    assert "top level is a list" in _refused(f"topology.path={files}/list.yaml")
    assert "UnicodeDecodeError" in _refused(f"topology.path={files}/binary.yaml")
    assert "is a file" in _refused(f"hydra.run.dir={files}/a_file")
    assert "cannot be written" in _refused("hydra.run.dir=/proc/x")
    assert "no point of adam_fusion to measure" in _refused("scale.max_elements=4")
    # the paper run's pipeline needs two stages: refused before calibrate and the rest run (it
    # was refused only when its turn came, after three runs, on a one-GPU machine)
    assert "2 pipeline stages" in _refused("experiment=paper world_size=1")


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(st.integers(max_value=0), st.integers(min_value=1 << 40)),
    st.sampled_from(["N", "X", "n"]),
)
@pytest.mark.slow
def test_drawn_bad_sizes_are_refused(value, symbol):
    _refused(f"experiment.sizes=[{{{symbol}:{value}}}]")


@pytest.mark.parametrize(
    "line",
    [
        "experiment.schedules=[]",
        "experiment.sizes=[{N:-4}]",
        "seed=-1",
        "hydra.run.dir=/proc/x",
        "world_size=3",
        "experiment=paper world_size=1",
    ],
)
@pytest.mark.slow
def test_through_the_entry_point(line):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "suite", *line.split()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("error: ")
    assert "Traceback" not in out.stderr and not out.stdout.strip()


def test_the_memory_estimate_counts_every_copy_a_point_holds(monkeypatch):
    """A lower bound, every rank together: per schedule and for the reference one whole copy of
    the inputs; a data-parallel baseline, its gloo twin (comm=shm) and its memory probe (lamb)
    a replica on every rank each."""
    import experiments
    from suite import load

    adam, lamb, mp = (experiments.get(n) for n in ("adam_fusion", "lamb_fusion", "model_parallel"))
    one = load._bytes(adam.program(), {"N": 1 << 20})
    assert 16 << 20 < one < (16 << 20) + 64  # w, g, m, v in f32, and hyper-parameters
    assert load.point_bytes(adam, adam.program(), {"N": 1 << 20}, 5, 2) == one * (5 + 1 + 2)
    assert load.point_bytes(adam, adam.program(), {"N": 1 << 20}, 5, 2, shm=True) == one * (
        5 + 1 + 4
    )
    lone = load._bytes(lamb.program(), {"N": 1 << 20})
    assert load.point_bytes(lamb, lamb.program(), {"N": 1 << 20}, 5, 4) == lone * (5 + 1 + 8)
    b = {k: 64 for k in ("S", "B", "H", "K")}
    mone = load._bytes(mp.program(), b)
    assert load.point_bytes(mp, mp.program(), b, 3, 2) == mone * (3 + 1 + 1)
    # refused before any work, naming the copies, when the machine is smaller than the bound
    monkeypatch.setattr(load, "MEMORY_BYTES", lone * 9)  # the bound: 10 copies; 7 before
    with pytest.raises(
        SuiteError,
        match=r"on 2 ranks for its \d+ schedules and 2 baseline "
        r"copies; this machine has",
    ):
        prevalidate(["experiment=lamb_fusion", "experiment.sizes=[{N:1048576}]"])
