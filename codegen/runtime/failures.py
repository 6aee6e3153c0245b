"""What a launched run's failure says (`codegen.runtime.launch`): the `RankError` it raises, and
how a rank's report or exit becomes one line.

`failure(rank, outcome, proc, grace_s)`: a rank's failure as a dict (`rank`, `line`: the one-line
description, `exc_type`, `exc_message`, `exitcode`, `tb`: the remote traceback, `echo`: whether
it looks like a peer's failure echoed, `looks_like_echo`), from its report (`outcome`: ("err",
type, message, traceback)) or, when it sent none (None), from its exit code: "died with exit
code C" or "killed by signal NAME". `raise_failure(failures)` raises the RankError of the root
cause (the first failure that is not an echo), `raise_timeout` the one of ranks past the deadline.
"""

from __future__ import annotations

import signal

ECHO_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}
ECHO_WORDS = (
    "connection closed",
    "connection reset",
    "broken pipe",
    "socket closed",
    "ECONNRESET",
    "EPIPE",
)


class RankError(RuntimeError):
    """A launched run failed: a rank raised, died, or the run passed its deadline.

    Attributes: `rank` (the rank at fault, None for a timeout), `ranks` (ranks at fault: the one
    rank, or all unfinished ranks on a timeout), `exc_type` and `exc_message` (the remote exception,
    None if the rank died), `exitcode`, `remote_traceback` (text, '' if none), `failures` (every
    failure collected, as (rank, one-line description) pairs, root cause first).
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        ranks: tuple[int, ...] = (),
        exc_type: str | None = None,
        exc_message: str | None = None,
        exitcode: int | None = None,
        remote_traceback: str = "",
        failures: tuple[tuple[int, str], ...] = (),
    ):
        super().__init__(message)
        self.rank, self.ranks = rank, tuple(ranks)
        self.exc_type, self.exc_message, self.exitcode = exc_type, exc_message, exitcode
        self.remote_traceback, self.failures = remote_traceback, tuple(failures)


def failure(rank: int, outcome, proc, grace_s: float) -> dict:
    """A rank's failure from its report, or from its exit (joined for up to `grace_s`)."""
    if outcome is None:
        proc.join(grace_s)
        code = proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"died with exit code {code}" + (" without returning" if code == 0 else "")
        return {
            "rank": rank,
            "line": how,
            "exc_type": None,
            "exc_message": None,
            "exitcode": code,
            "tb": "",
            "echo": False,
        }
    _, exc_type, message, tb = outcome
    text = " ".join(str(message).split())
    if len(text) > 500:
        text = text[:497] + "..."
    echo = looks_like_echo(exc_type, text)
    return {
        "rank": rank,
        "line": f"{exc_type}: {text}",
        "exc_type": exc_type,
        "exc_message": message,
        "exitcode": None,
        "tb": tb,
        "echo": echo,
    }


def looks_like_echo(exc_type: str, message: str) -> bool:
    """A failure that a peer's failure causes (a collective on a closed connection)."""
    return exc_type in ECHO_TYPES or any(w.lower() in message.lower() for w in ECHO_WORDS)


def raise_failure(failures: list[dict]):
    """The root cause's RankError (failures that look like echoes last in `failures`)."""
    ordered = [f for f in failures if not f["echo"]] + [f for f in failures if f["echo"]]
    root = ordered[0]
    raise RankError(
        f"rank {root['rank']} failed: {root['line']}",
        rank=root["rank"],
        ranks=(root["rank"],),
        exc_type=root["exc_type"],
        exc_message=root["exc_message"],
        exitcode=root["exitcode"],
        remote_traceback=root["tb"],
        failures=tuple((f["rank"], f["line"]) for f in ordered),
    )


def raise_timeout(ranks: list[int], timeout_s: float, stacks: str):
    raise RankError(
        f"ranks {ranks} did not finish within timeout_s={timeout_s:g}",
        rank=None,
        ranks=tuple(ranks),
        remote_traceback=stacks,
    )
