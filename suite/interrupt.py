"""SIGINT and SIGTERM end a run cleanly: `Interrupted` is raised where the run is, the ranks are
stopped (codegen.runtime.launch stops its ranks when the parent leaves the wait for them), the
report is written from the rows measured so far, one line says "interrupted after N of M points",
and the exit status is 128 + the signal (130 for SIGINT, 143 for SIGTERM).

`install()` sets the handlers (the entry point does, in the main thread); `received()` is the
signal number once one came (so that a rank's death the signal caused is not taken for a
failure), else 0. A second signal while the report is written falls back to the default action.
"""

from __future__ import annotations

import signal

_received = 0


class Interrupted(BaseException):
    """Raised by the handler; a BaseException so that no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum


def install() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handle)


def received() -> int:
    return _received


def _handle(signum, frame) -> None:
    global _received
    _received = signum
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    raise Interrupted(signum)
