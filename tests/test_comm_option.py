"""`comm=NAME` at the top level selects the ranks' transport (short for backend.comm; gloo is
backend.comm=ring); backend.comm keeps working; the two disagreeing is bad input."""

import pytest

from suite.cli import prevalidate
from suite.errors import SuiteError


@pytest.mark.parametrize(
    "args,expect",
    [
        ([], "ring"),
        (["comm=shm"], "shm"),
        (["comm=gloo"], "ring"),
        (["backend.comm=shm"], "shm"),
        (["comm=shm", "backend.comm=shm"], "shm"),
        (["comm=library"], "library"),
    ],
)
def test_comm_selects_the_transport(args, expect):
    assert prevalidate(["experiment=collectives", *args]).backend.comm == expect


@pytest.mark.parametrize("args", [["comm=gloo", "backend.comm=shm"], ["comm=shm", "backend=cuda"]])
def test_comm_disagreeing_with_backend_comm_is_refused(args):
    with pytest.raises(SuiteError, match="disagree"):
        prevalidate(["experiment=collectives", *args])
