"""Errors of the entry point: bad input ends the run with one line on stderr and exit 2 (`fail`),
a failure while running (a rank died, a kernel did not compile) with one line and exit 3
(`fail_run`)."""

import sys
from typing import NoReturn


class SuiteError(Exception):
    """A setting, override or name no run can use; the message is one line naming the problem."""


def one_line(message: object) -> str:
    """`message` on one line: its non-blank lines joined with '; '."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(lines) or "unknown error"


def fail(error: Exception) -> NoReturn:
    """End the run for bad input: one line on stderr, exit status 2."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    sys.exit(2)


def fail_run(error: Exception) -> NoReturn:
    """End the run for a failure while it ran (a rank died, hung or raised; a kernel did not
    compile): one line, exit 3."""
    print(f"error: {one_line(error)}", file=sys.stderr, flush=True)
    sys.exit(3)
