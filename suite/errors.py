"""Errors of the entry point: bad input that ends the run with one line on stderr and exit 2."""


class SuiteError(Exception):
    """A setting, override or name no run can use; the message is one line naming the problem."""


def one_line(message: object) -> str:
    """`message` on one line: its non-blank lines joined with '; '."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(lines) or "unknown error"
