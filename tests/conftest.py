"""Test tiers. The markers are registered in pyproject.toml (`--strict-markers`):

- `slow`: a test whose case took 2 s or more, or whose cases took 10 s together, on 2 cores
  (marked on the test). `pytest -m "not slow"` is the edit loop's fast tier; the full suite, which
  CI and the README's test command run, is every tier.
- `multiprocess`: the test's module starts processes (ranks, the suite's entry point, torchrun,
  compilers): assigned here, by module.
- `slurm`: needs a SLURM cluster (tests/test_slurm.py sets a one-host one up where it is root,
  else skips and says why): assigned here.
- `cuda`: needs a GPU (marked on the test; it skips without one).
"""

from __future__ import annotations

import pytest

from codegen.logs import configure

configure()  # the packages' messages on stdout / stderr, as the entry point shows them

MULTIPROCESS = {
    "test_awake",
    "test_bad_input_fuzz",
    "test_benchmarks_one_rank",
    "test_build",
    "test_build_cuda",
    "test_caches",
    "test_calibrate",
    "test_cost_model_suite",
    "test_doc_scripts",
    "test_dp_experiments",
    "test_fused_optim",
    "test_gpu_figures",
    "test_interrupt_resume",
    "test_joined",
    "test_layers",
    "test_multinode",
    "test_overlap",
    "test_paper",
    "test_pipeline_fidelity",
    "test_rank_safety",
    "test_render_cuda",
    "test_reports",
    "test_rounds",
    "test_run_dir",
    "test_runtime_comm",
    "test_runtime_plans",
    "test_runtime_timeline",
    "test_shm_comm",
    "test_slurm",
    "test_space",
    "test_suite_cli",
    "test_symm_kernel",
    "test_two_hosts",
    "test_user_experiment",
    "test_validate",
    "test_docs",
    "test_tutorials",
}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in MULTIPROCESS:
            item.add_marker(pytest.mark.multiprocess)
        if module == "test_slurm":
            item.add_marker(pytest.mark.slurm)
