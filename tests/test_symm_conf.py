"""`backend.comm=symm` on cuda in the config: selected by `backend.comm=symm` or `comm=symm`, and a
transport the backend does not take is bad input naming what it takes (before any work)."""

import pytest

from suite.cli import prevalidate
from suite.errors import SuiteError


@pytest.mark.parametrize(
    "args", [["backend=cuda", "backend.comm=symm"], ["backend=cuda", "comm=symm"]]
)
def test_symm_is_a_cuda_transport(args):
    assert prevalidate(["experiment=adam_fusion", *args]).backend.comm == "symm"


def test_cuda_keeps_nccl_by_default():
    assert prevalidate(["experiment=adam_fusion", "backend=cuda"]).backend.comm == "nccl"


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ["backend=cuda", "backend.comm=shm"],
            r"backend.comm=shm is unknown \(backend=cuda takes comm=nccl\|symm\)",
        ),
        (
            ["comm=symm"],
            r"comm=symm and backend=cpu disagree \(backend=cpu takes comm=gloo\|shm\|library\)",
        ),
        (["backend=cpu", "backend.comm=symm"], r"backend.comm=symm is unknown"),
    ],
)
def test_a_transport_the_backend_does_not_take_is_refused(args, match):
    with pytest.raises(SuiteError, match=match):
        prevalidate(["experiment=adam_fusion", *args])
