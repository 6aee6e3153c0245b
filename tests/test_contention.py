"""cost_model.contention: a matmul beside an independent collective, against PyTorch's measurement
(pytorch/pytorch PR 172714, 8 x H100) and where overlap should win or lose."""

import dataclasses

import pytest
import yaml

from cost_model.contention import MODES, overlap_pair, two_tasks
from cost_model.topology import CONF_TOPOLOGY_DIR, Topology, TopologyError, load_topology

MIB = 2**20
H100 = load_topology("dgx_h100")
SQUARE = (8192, 8192, 8192)
AG_BYTES = 8 * 64 * MIB  # --ag-mb 64 is each rank's input: nccl-tests' size is the 512 MiB output
# PR 172714: sequential, NCCL on its own stream, copy-engine collective (ms)
MEASURED_MS = {"sequential": 2.96, "sm": 2.02, "copy_engine": 1.77}


def _pair(mode, topo=H100, matmul=SQUARE, kind="all_gather", nbytes=AG_BYTES, ranks=8):
    return overlap_pair(topo, matmul, "f16", kind, nbytes, ranks, mode)


def _slow_copy_engines(gbps: float) -> Topology:
    return dataclasses.replace(H100, intra=dataclasses.replace(H100.intra, copy_engine_gbps=gbps))


@pytest.mark.parametrize("mode", MODES)
def test_pytorch_8_h100_case_within_15_percent(mode):
    predicted_ms = _pair(mode).total_us / 1e3
    error = predicted_ms / MEASURED_MS[mode] - 1.0
    print(f"{mode}: predicted {predicted_ms:.3f} ms, measured {MEASURED_MS[mode]} ms, {error:+.1%}")
    assert abs(error) < 0.15


def test_the_breakdown_says_why_overlap_wins():
    seq, sm, ce = (_pair(mode) for mode in MODES)
    assert seq.total_us == pytest.approx(seq.matmul_us + seq.collective_us)
    # NCCL's ring holds 24 SMs (a CTA per channel: twice the graph's 12) of 132
    assert sm.collective == "ring/Simple" and sm.sms_taken == 24
    assert sm.matmul_rate == pytest.approx(108 / 132, rel=1e-3)
    assert sm.collective_rate == 1.0 and sm.both_us == pytest.approx(sm.collective_us)
    assert ce.sms_taken == 0 and ce.matmul_rate == 1.0 and ce.collective == "copy_engine"
    assert seq.total_us > sm.total_us > ce.total_us  # the measured order
    assert 0 < sm.hidden_us < sm.collective_us and ce.hidden_us == pytest.approx(ce.collective_us)


def test_copy_engines_far_below_nvlink_lose_to_running_one_after_the_other():
    slow = _slow_copy_engines(40.0)  # a tenth of H100's copy engines, for a 512 MiB all-gather
    seq, ce = _pair("sequential", slow), _pair("copy_engine", slow)
    assert ce.total_us > seq.total_us  # overlap loses: the collective alone outlasts both
    assert ce.total_us == pytest.approx(ce.collective_us)
    # and sharing SMs with NCCL beats the slow copy engines
    assert _pair("sm", slow).total_us < ce.total_us


def test_a_tiny_matmul_hides_almost_nothing_behind_a_big_collective():
    tiny = (256, 256, 256)
    seq, sm = _pair("sequential", matmul=tiny), _pair("sm", matmul=tiny)
    assert sm.hidden_us <= seq.matmul_us + 1e-9
    assert sm.total_us == pytest.approx(sm.collective_us)
    assert seq.total_us / sm.total_us < 1.01


@pytest.mark.parametrize("nbytes", [MIB, 64 * MIB, AG_BYTES, 4 * AG_BYTES])
@pytest.mark.parametrize("matmul", [(1024, 1024, 1024), SQUARE, (65536, 8192, 16)])
def test_sharing_sms_never_takes_longer_than_one_after_the_other(matmul, nbytes):
    seq, sm = (
        _pair("sequential", matmul=matmul, nbytes=nbytes),
        _pair("sm", matmul=matmul, nbytes=nbytes),
    )
    assert max(seq.matmul_us, seq.collective_us) <= sm.total_us <= seq.total_us + 1e-9


def test_a_memory_bound_matmul_and_the_collective_share_the_hbm():
    skinny = (65536, 8192, 16)  # 1 GiB of output over 34 GFLOP: memory-bound
    sm = _pair("sm", matmul=skinny)
    assert sm.collective_rate < 1.0  # the two demands pass HBM's bandwidth: both slow
    assert sm.matmul_rate == pytest.approx(sm.collective_rate)  # its SM share costs it nothing
    assert sm.total_us < sm.matmul_us + sm.collective_us


def test_two_tasks_closed_form():
    total, both = two_tasks(10.0, 4.0, 0.5, 1.0)  # b ends at 4; a has done 2, 8 left
    assert (total, both) == (12.0, 4.0)
    assert two_tasks(2.0, 10.0, 0.5, 1.0) == (10.0, 4.0)  # a ends at 4; b finishes at full speed


def test_blackwell_has_copy_engines_and_more_sms():
    b200 = load_topology("dgx_b200")
    ce, sm = _pair("copy_engine", b200), _pair("sm", b200)
    assert ce.collective_us < _pair("sequential", b200).collective_us * 1.5
    assert sm.sms_taken == 32 and sm.matmul_rate == pytest.approx(116 / 148, rel=1e-2)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"mode": "fused"}, "mode 'fused': must be one of sequential, sm, copy_engine"),
        ({"matmul": (8192, -1, 8192)}, "must be three positive integers"),
        ({"matmul": (8192, 0, 8192)}, "must be three positive integers"),
        ({"nbytes": -1}, "nbytes=-1: must be >= 0"),
        ({"ranks": 0}, "ranks=0: must be in 1..8"),
        ({"kind": "all_scatter"}, "collective 'all_scatter'"),
        ({"kind": "all_reduce", "mode": "copy_engine"}, "all_reduce has no copy-engine form"),
        ({"topo": load_topology("dgx_a100"), "mode": "copy_engine"}, "no intra.copy_engine_gbps"),
        (
            {"topo": load_topology("dgx_h100", nodes=2), "ranks": 16, "mode": "copy_engine"},
            "span nodes",
        ),
        ({"topo": load_topology("local"), "ranks": 2}, "no GPU with NCCL"),
    ],
)
def test_bad_input_is_a_clear_value_error(kwargs, message):
    args = {"mode": "sm", **kwargs}
    with pytest.raises(ValueError) as info:
        _pair(**args)
    assert message in str(info.value)


def test_copy_engine_gbps_is_validated_like_the_other_fields():
    d = yaml.safe_load((CONF_TOPOLOGY_DIR / "dgx_h100.yaml").read_text())
    d["intra"]["copy_engine_gbps"] = -5
    with pytest.raises(TopologyError, match="topology.intra.copy_engine_gbps=-5"):
        Topology.from_dict(d)
