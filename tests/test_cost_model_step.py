"""A step's overhead beyond its operations, and the baselines' predictions from the library time
measured in the run: exact in tiny timelines (pure)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

import experiments
from codegen.lower import lower
from codegen.plan import Compute
from cost_model.closed_form import step_us
from cost_model.topology import Topology, TopologyError, load_topology
from cost_model.workload import largest_transfer, simulate
from experiments import predict
from experiments.calibration.fit import Measurement, fit, predict_ms
from tests.test_calibrate import synthetic, truth
from tests.test_cost_model import tiny

adam_fusion, lamb_fusion = (experiments.get(n) for n in ("adam_fusion", "lamb_fusion"))


def _ar_c(n=8000):
    return lower(adam_fusion.program(), {"N": n}, 2)


def test_the_step_overhead_ends_every_rank_exactly():
    plan = _ar_c()
    plain = simulate(plan, tiny())
    more = simulate(plan, tiny(step_overhead_us=7.0))
    assert more.time_us == pytest.approx(plain.time_us + 7.0, abs=1e-9)
    over = more.trace[more.trace.task == "overhead"].sort_values("rank")
    assert list(over["rank"]) == [0, 1]
    for r in over.itertuples():
        assert (r.start, r.end) == pytest.approx(
            (plain.finish_us[r.rank], plain.finish_us[r.rank] + 7.0)
        )
    assert plain.trace[plain.trace.task == "overhead"].empty  # 0: no task at all


def test_every_plan_of_more_than_one_rank_pays_the_step_overhead_at_its_largest_transfer():
    """The overhead is what waking a rank by communication, then a kernel, costs beyond both
    (calibration's `sequence`); a pipeline of one rank per stage wakes its ranks by sends."""
    from experiments import pipeline_parallel

    p = pipeline_parallel.schedules()["AR-P2P-C"]
    one, two = (lower(p, {"S": 16, "B": 1, "H": 8}, world) for world in (2, 4))
    assert one.P == 1 and two.P == 2
    by = {64: 3.0, 1 << 20: 9.0}  # its largest transfer: 16x8 f32 activations, 2^9 bytes
    for plan in (one, two):
        assert largest_transfer(plan, tiny()) == 16 * 8 * 4
        plain, more = (simulate(plan, tiny(per_node=4, step_overhead_by_bytes=b)) for b in ({}, by))
        assert more.time_us == pytest.approx(plain.time_us + 3.0 + 6.0 * 3 / 14, abs=1e-9)
    alone = lower(experiments.get("adam_fusion").schedules()["AR-C"], {"N": 64}, 1)
    assert simulate(alone, tiny(step_overhead_us=7.0)).time_us == pytest.approx(
        simulate(alone, tiny()).time_us
    )  # one rank alone: nothing wakes it


def test_a_given_compute_time_replaces_the_roofline():
    plan = _ar_c()
    sid = next(s.id for s in plan.steps if isinstance(s, Compute))
    r = simulate(plan, tiny(), compute_us={sid: 123.0})
    comp = r.trace[r.trace.stream == "compute"]
    assert len(comp) == 2 and all(abs(t - 123.0) < 1e-9 for t in comp.end - comp.start)


def test_library_steps_interpolate_in_log_log_and_scale_per_byte_beyond():
    dev = dataclasses.replace(
        load_topology("local").device, library_steps_us={"adam": {1024: 10.0, 4096: 40.0}}
    )
    assert dev.library_step_us("adam", 2048) == pytest.approx(20.0)  # log-log: x2 -> x2
    assert dev.library_step_us("adam", 1 << 14) == pytest.approx(160.0)  # per byte beyond
    assert dev.library_step_us("adam", 16) == pytest.approx(10.0)  # the smallest's time below
    assert dev.library_step_us("lamb", 2048) is None


def test_a_bad_library_step_or_overhead_fails_with_its_name():
    d = load_topology("local").to_dict()
    d["device"]["library_steps_us"] = {"adam": {1024: 0.0}}
    with pytest.raises(TopologyError, match=r"library_steps_us\['adam'\]\[1024\]"):
        Topology.from_dict(d)
    d = load_topology("local").to_dict()
    d["step_overhead_us"] = -1
    with pytest.raises(TopologyError, match="step_overhead_us=-1"):
        Topology.from_dict(d)


def _with_steps(topo, overhead_us, curves):
    return dataclasses.replace(
        topo,
        step_overhead_us=overhead_us,
        device=dataclasses.replace(topo.device, library_steps_us=curves),
    )


@pytest.mark.slow
def test_the_fit_recovers_the_step_overhead_and_the_library_steps():
    t = _with_steps(
        truth(),
        2500.0,
        {"adam": {1 << 20: 900.0, 1 << 22: 4000.0}, "lamb": {1 << 20: 20000.0, 1 << 22: 90000.0}},
    )
    extra = [
        Measurement(k, b, 0.0, 2, kernel_bytes=7 * b)
        for b in (1 << 21, 1 << 22, 1 << 23)
        for k in ("sequence", "sequence_comm", "sequence_compute")
    ]
    extra += [
        Measurement(f"library_{r}", b, 0.0, 2) for r in ("adam", "lamb") for b in (1 << 20, 1 << 22)
    ]
    ms = synthetic(t) + [dataclasses.replace(m, time_ms=predict_ms(t, m)) for m in extra]
    got = fit(ms, load_topology("local"), 2)
    assert got.step_overhead_us == pytest.approx(2500.0, rel=1e-3)
    assert got.device.library_steps_us == {
        "adam": {1 << 20: 900.0, 1 << 22: 4000.0},
        "lamb": {1 << 20: 20000.0, 1 << 22: 90000.0},
    }
    # noise making a step look cheaper than its parts: no negative overhead
    cheaper = [
        dataclasses.replace(m, time_ms=m.time_ms * (0.5 if m.kind == "sequence" else 1)) for m in ms
    ]
    assert fit(cheaper, load_topology("local"), 2).step_overhead_us == 0.0


@pytest.mark.parametrize("name", ["adam_fusion", "lamb_fusion"])
def test_the_baseline_computes_in_its_measured_library_time(name):
    """The baseline's Plan takes the compute time its own library call took when measured (the
    measured baseline row's compute_ms at that point) on its first Compute step, 0 elsewhere."""
    exp = experiments.get(name)
    n = 1 << 20
    topo = load_topology("local")
    plan = lower(exp.program(), {"N": n}, 2)
    got = predict.library_compute_us(plan, 5.0)
    computes = [s.id for s in plan.steps if isinstance(s, Compute)]
    assert got[computes[0]] == pytest.approx(5000.0)
    assert all(got[i] == 0.0 for i in computes[1:])
    assert all(got[s.id] == 0.0 for s in plan.steps if type(s).__name__ == "Collective")
    rows = {
        r["schedule"]: r
        for r in predict.predict(exp, topo, [{"N": n}], 2, baseline_compute_ms={f"[{n}]": 5.0})
    }
    assert rows["baseline"]["compute_ms"] == pytest.approx(5.0, rel=1e-6)
    assert rows["baseline"]["time_ms"] != rows["AR-C"]["time_ms"]


def test_the_measured_baseline_compute_is_read_from_the_measured_rows():
    exp = experiments.get("model_parallel")
    b = {"S": 64, "B": 2, "H": 128, "K": 128}
    size, shape = exp.size_and_shape(b)
    measured = [
        {
            "source": "measured",
            "schedule": "baseline",
            "world_size": 2,
            "size": size,
            "shape": shape,
            "compute_ms": 7.0,
        },
        {
            "source": "measured",
            "schedule": "MM-AR-C",
            "world_size": 2,
            "size": size,
            "shape": shape,
            "compute_ms": 1.0,
        },
    ]
    assert predict.measured_baseline_compute(measured) == {(2, shape): 7.0}
    assert predict.local_points(exp, measured) == [(2, b)]
    rows = {
        r["schedule"]: r
        for r in predict.predict(
            exp, load_topology("local"), [b], 2, baseline_compute_ms={shape: 7.0}
        )
    }
    assert rows["baseline"]["time_ms"] > rows["MM-AR-C"]["time_ms"] + 5.0


def test_without_a_measured_routine_the_baseline_is_the_unscheduled_schedule():
    topo = load_topology("local")
    rows = {
        r["schedule"]: r
        for r in predict.predict(experiments.get("adam_fusion"), topo, [{"N": 1 << 16}], 2)
    }
    assert rows["baseline"]["time_ms"] == rows["AR-C"]["time_ms"]


def test_write_allocate_counts_the_writes_to_buffers_a_kernel_does_not_read():
    """On a CPU (write_allocate) a store reads its line first: LAMB's first kernel writes new
    buffers (m, v, u of the step) and moves their bytes twice; Adam's updates in place do not."""
    from cost_model.closed_form import kernel_bytes

    n = 1 << 16
    cpu = load_topology("local")
    gpu = dataclasses.replace(cpu, device=dataclasses.replace(cpu.device, write_allocate=False))
    assert cpu.device.write_allocate
    extra = []
    for exp in (adam_fusion, lamb_fusion):
        plan = lower(exp.program(), {"N": n}, 2)
        for s in (s for s in plan.steps if isinstance(s, Compute)):
            read = {a.buffer for a in s.kernel.reads}
            fresh = sum(n * 4 for _, b in s.kernel.writes if b not in read)  # f32, loop n
            assert kernel_bytes(plan, s, gpu) == s.nbytes
            assert kernel_bytes(plan, s, cpu) == s.nbytes + fresh
            extra.append(fresh // n)
    assert extra == [0, 12, 0]  # Adam in place; LAMB's first kernel writes m', v', u anew
    adam = next(
        s for s in lower(adam_fusion.program(), {"N": n}, 2).steps if isinstance(s, Compute)
    )
    assert kernel_bytes(plan, adam, cpu) == adam.nbytes  # w, m, v read and written in place


def test_an_in_place_write_weighs_what_the_calibration_measured():
    """With `inplace_write_weight` w a kernel's bytes are its reads, w x its writes into buffers
    it reads and twice its other writes (write-allocate), in units of the calibration kernel's
    bytes (x 28 / (16 + 12 w)): Adam's AR-C kernel (the calibration's own, 16 B read and 12 B
    written in place per element) still counts its nbytes; LAMB's first kernel, whose writes are
    all fresh, counts 40 of 22 units a byte of Adam's, where w = 1 gave it 40 of 28."""
    from codegen.plan import ITEMSIZE
    from cost_model.closed_form import kernel_bytes
    from cost_model.microbench import CALIBRATION_KERNEL

    n = 1 << 16
    cpu = load_topology("local")
    half = dataclasses.replace(
        cpu, device=dataclasses.replace(cpu.device, inplace_write_weight=0.5)
    )
    unit = 28 / (16 + 12 * 0.5)
    got = {}
    for exp in (adam_fusion, lamb_fusion):
        plan = lower(exp.program(), {"N": n}, 2)
        for s in (s for s in plan.steps if isinstance(s, Compute)):
            read = {a.buffer for a in s.kernel.reads}
            written = {b for _, b in s.kernel.writes}
            size = lambda ids: sum(ITEMSIZE[plan.buffer(b).dtype] for b in ids)  # noqa: E731
            r, inplace, fresh = size(read), size(written & read), size(written - read)
            assert n * (r + inplace + fresh) == s.nbytes  # every byte counted once at w = 1
            got["_".join(s.kernel.name.split("_")[:2])] = (r, inplace, fresh)  # e.g. lamb_k1
            assert kernel_bytes(plan, s, half) == pytest.approx(
                n * (r + 0.5 * inplace + 2 * fresh) * unit
            )
    assert got["adam_k1"] == (*CALIBRATION_KERNEL, 0)
    assert got["lamb_k1"] == (16, 0, 12) and got["lamb_k2"] == (24, 12, 0)
    (a_plan, adam), (l_plan, lamb) = (
        (p, next(s for s in p.steps if isinstance(s, Compute)))
        for p in (lower(e.program(), {"N": n}, 2) for e in (adam_fusion, lamb_fusion))
    )
    assert kernel_bytes(a_plan, adam, half) == pytest.approx(adam.nbytes)
    for topo, ratio in ((half, 40 / 22), (cpu, 40 / 28)):
        assert kernel_bytes(l_plan, lamb, topo) / kernel_bytes(a_plan, adam, topo) == pytest.approx(
            ratio
        )


def test_a_megatron_baseline_times_its_matmul_as_the_schedules_do():
    """model_parallel's baseline is MM-AR-C in library calls: its measured `library_ms` (the
    tail beside its matmul) goes on the tail, and its matmul takes the cost model's time, as the
    schedules' same torch.matmul does. So a baseline whose tail took what the generated tail
    takes is predicted as fast as MM-AR-C. (The measured compute_ms, matmul included, on the
    tail while the MatMul step was modelled too counted the matmul twice: predicted speedups of
    2-3x where 1.1-1.4x were measured.)"""
    exp = experiments.get("model_parallel")
    b = {"S": 1024, "B": 1, "H": 1024, "K": 1024}
    topo = load_topology("local")
    _, shape = exp.size_and_shape(b)
    plan = lower(exp.schedules()["MM-AR-C"], b, 2)
    tail = next(s for s in plan.steps if isinstance(s, Compute))
    tail_ms = step_us(plan, tail, topo, 1) / 1e3
    measured = [
        {
            "source": "measured",
            "schedule": "baseline",
            "world_size": 2,
            "shape": shape,
            "compute_ms": 30.0,
            "library_ms": tail_ms,
        }
    ]
    got = predict.measured_baseline_compute(measured)
    assert got == {(2, shape): tail_ms}
    rows = {
        r["schedule"]: r
        for r in predict.predict(exp, topo, [b], 2, baseline_compute_ms={shape: got[(2, shape)]})
    }
    assert rows["baseline"]["time_ms"] == pytest.approx(rows["MM-AR-C"]["time_ms"], rel=0.02)
    assert rows["MM-AR-C"]["speedup"] == pytest.approx(1.0, abs=0.02)
    # a baseline without library_ms (a library optimizer step): its compute_ms is the library's
    assert predict.measured_baseline_compute([{**measured[0], "library_ms": float("nan")}]) == {
        (2, shape): 30.0
    }


@pytest.mark.slow
def test_the_step_overhead_is_the_paired_extra_when_measured():
    """With `sequence_extra` (sequence - comm - compute, paired call by call), the step overhead
    is its median over sizes, whatever the medians of the three parts say; never negative."""
    t = truth()
    sizes = (1 << 21, 1 << 22, 1 << 23)
    parts = [
        dataclasses.replace(m, time_ms=predict_ms(t, m))
        for m in (
            Measurement(k, b, 0.0, 2, kernel_bytes=7 * b)
            for b in sizes
            for k in ("sequence", "sequence_comm", "sequence_compute")
        )
    ]
    extra = [Measurement("sequence_extra", b, x, 2) for b, x in zip(sizes, (0.2, 0.9, 0.4))]
    got = fit(synthetic(t) + parts + extra, load_topology("local"), 2)
    assert got.step_overhead_us == pytest.approx(statistics.median((200.0, 900.0, 400.0)))
    faster = [dataclasses.replace(m, time_ms=-1.0) for m in extra]
    assert fit(synthetic(t) + parts + faster, load_topology("local"), 2).step_overhead_us == 0.0


def test_the_step_overhead_is_fitted_by_size_and_charged_by_the_largest_transfer():
    """`sequence_extra` grows with the all-reduce it follows: the fit keeps it by size (a running
    median of three, never negative) and a step pays it at its largest transfer's size, not the
    median over sizes."""
    t = truth()
    sizes = (1 << 21, 1 << 22, 1 << 23, 1 << 24, 1 << 25)
    extra = [
        Measurement("sequence_extra", b, x, 2) for b, x in zip(sizes, (0.3, -0.5, 1.9, 2.5, 3.8))
    ]
    got = fit(synthetic(t) + extra, load_topology("local"), 2)
    assert got.step_overhead_by_bytes == {
        1 << 21: 300.0,
        1 << 22: 300.0,
        1 << 23: 1900.0,
        1 << 24: 2500.0,
        1 << 25: 3800.0,
    }
    assert got.step_overhead_us == pytest.approx(1900.0)  # the median, for older readers
    assert got.step_overhead_at(1 << 20) == 300.0 and got.step_overhead_at(1 << 27) == 3800.0
    assert got.step_overhead_at(3 << 22) == pytest.approx(
        1900.0 + (2500.0 - 1900.0) * 0.585, rel=1e-3
    )  # linear in log2(bytes)
    for n in (1 << 18, 1 << 22):  # AR-C: its all-reduce of 4N bytes is the largest transfer
        plan = _ar_c(n)
        plain = simulate(
            plan, dataclasses.replace(got, step_overhead_by_bytes={}, step_overhead_us=0.0)
        )
        assert simulate(plan, got).time_us == pytest.approx(
            plain.time_us + got.step_overhead_at(4 * n), abs=1e-6
        )
    bad = dataclasses.asdict(got)
    bad["step_overhead_by_bytes"] = {1 << 20: -1.0}
    with pytest.raises(TopologyError, match="step_overhead_by_bytes"):
        Topology.from_dict(bad)
