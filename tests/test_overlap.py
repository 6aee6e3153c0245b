"""The chunked overlaps on gloo ranks: ol(MM,fuse(RS-C-AG)) and ol(RS,fuse(P2P-C-AG)) give exactly
the unoverlapped schedule's result for every chunk count that divides each rank's rows, and a
chunk count that does not divide them is a clear ShapeError before anything runs."""

import numpy as np
import pytest

import dsl
import experiments
from codegen.build import build
from codegen.lower import lower
from codegen.runtime.backend import CpuBackend
from codegen.runtime.execute import PlanRunner
from codegen.runtime.launch import launch

MP = {"S": 16, "B": 2, "H": 8, "K": 16}  # 32 rows, 16 per rank at P=2
PP = {"S": 16, "B": 1, "H": 8}  # 16 rows; P=1 (2 ranks) or 8 per rank at P=2 (4 ranks)


def _plans(world):
    mp, pp = experiments.get("model_parallel"), experiments.get("pipeline_parallel")
    cases = []
    if world == 2:
        cases.append(("mp", lower(mp.schedules()["MM-RS-C-AG"], MP, 2), MP))
        for c in (1, 2, 4, 8, 16):
            cases.append(
                (f"mp{c}", lower(mp.schedules(chunks=c)["ol(MM,fuse(RS-C-AG))"], MP, 2), MP)
            )
    rows = 16 // (world // 2)
    cases.append(("pp", lower(pp.schedules()["RS-P2P-C-AG"], PP, world), PP))
    for c in (d for d in (1, 2, 4, 8, 16) if rows % d == 0):
        cases.append(
            (f"pp{c}", lower(pp.schedules(chunks=c)["ol(RS,fuse(P2P-C-AG))"], PP, world), PP)
        )
    return cases


def _rank(rank, world, cases, inputs, kernels):
    backend = CpuBackend()
    fns = backend.build(kernels)
    out = {}
    for (name, plan, _), inp in zip(cases, inputs):
        r = PlanRunner(plan, rank, fns, backend.groups(plan.stages), backend)
        r.load(inp[rank])
        r.run()
        out[name] = r.outputs()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_overlap_exact_for_every_dividing_chunk_count(world):
    cases = _plans(world)
    progs = {
        "mp": experiments.get("model_parallel").program(),
        "pp": experiments.get("pipeline_parallel").program(),
    }
    inputs = [
        dsl.random_inputs(progs[name[:2]], world, b, np.random.default_rng(3))
        for name, _, b in cases
    ]
    kernels = [k for _, p, _ in cases for k in p.kernels()]
    build(kernels)
    res = launch(_rank, world, args=(cases, inputs, kernels), timeout_s=240)
    for rank in range(world):
        for name, _, _ in cases:
            ref = res[rank][name[:2]]
            assert set(res[rank][name]) == set(ref), name
            for k in ref:  # bit for bit: the chunks partition the same sums
                np.testing.assert_array_equal(res[rank][name][k], ref[k], err_msg=name)


def test_chunks_that_do_not_divide_the_rows_are_refused():
    mp = experiments.get("model_parallel")
    with pytest.raises(dsl.ShapeError, match="3 chunks do not divide the 16 rows"):
        lower(mp.schedules(chunks=3)["ol(MM,fuse(RS-C-AG))"], MP, 2)
    pp = experiments.get("pipeline_parallel")
    with pytest.raises(dsl.ShapeError, match="5 chunks do not divide the 8 rows"):
        lower(pp.schedules(chunks=5)["ol(RS,fuse(P2P-C-AG))"], PP, 4)
