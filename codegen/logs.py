"""The suite's messages: progress and notes through `logging`, shown the way print showed them.

Library modules log to their own logger (`logging.getLogger(__name__)`): progress at INFO,
damaged caches and skipped inputs at WARNING. Nothing is shown until an entry point calls
`configure` (`python -m suite` does, from its `quiet` / `verbose` settings; so do the ranks it
starts, from the environment it exports): INFO and below go to stdout as bare lines, WARNING and
above to stderr; `quiet` shows warnings and errors only, `verbose` adds DEBUG. The level travels
to child processes as `COCONET_LOG_LEVEL` (a logging level name).
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "COCONET_LOG_LEVEL"
PACKAGES = ("suite", "experiments", "coconet", "cost_model", "codegen", "dsl", "reports")


class _Stream(logging.Handler):
    """Each record as its bare message on the stream of its level, looked up when it is written
    (so a test's captured stdout, or a redirected one, gets it)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - as logging.StreamHandler: never raise from logging
            self.handleError(record)


def level_of(quiet: bool = False, verbose: bool = False) -> int:
    return logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO


def configure(level: int | str | None = None) -> int:
    """Show the packages' messages at `level` (else `$COCONET_LOG_LEVEL`, else INFO), export it
    to child processes, and return it. Calling it again changes the level."""
    if level is None:
        level = os.environ.get(ENV) or logging.INFO
    level = logging.getLevelName(level) if isinstance(level, str) else level
    os.environ[ENV] = logging.getLevelName(level)
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = False
        if not any(isinstance(h, _Stream) for h in logger.handlers):
            handler = _Stream()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
    return level
