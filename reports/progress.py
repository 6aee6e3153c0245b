"""A text progress bar with an estimate of the time left, for work whose items are known upfront.

    progress = Progress(weights=[n for n in sizes for _ in schedules], label="adam_fusion")
    print(progress.step("AR-C N=2^20"))   # after each item

`Progress(weights, label="")`: one weight per item, in the order they will be done (the relative
cost of an item, e.g. its elements: a sweep's last, largest points take the longest). After k items
`line()` shows the bar, k of n, the share of the total weight done, the elapsed time and the time
left, estimated as elapsed x (weight left / weight done). `step(detail)` marks one more item done
and returns the line. Times are wall-clock seconds from construction (`clock`, for tests).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

WIDTH = 20  # characters of the bar


def clock_text(seconds: float) -> str:
    """0:42, 3:05, 1:02:09."""
    s = max(0, int(round(seconds)))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    def __init__(
        self, weights: Sequence[float], label: str = "", clock: Callable[[], float] = time.monotonic
    ):
        if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError("progress needs at least one item and positive weights")
        self.weights, self.label, self.clock = list(weights), label, clock
        self.start, self.done = clock(), 0

    @property
    def total(self) -> int:
        return len(self.weights)

    def fraction(self) -> float:
        return sum(self.weights[: self.done]) / sum(self.weights)

    def left_s(self) -> float | None:
        """Estimated seconds left; None before anything measurable is done."""
        f, elapsed = self.fraction(), self.clock() - self.start
        if f <= 0:
            return None
        return elapsed * (1 - f) / f

    def line(self, detail: str = "") -> str:
        f = self.fraction()
        filled = int(round(WIDTH * f))
        left = self.left_s()
        eta = "?" if left is None else clock_text(left)
        head = f"{self.label} " if self.label else ""
        tail = f"  {detail}" if detail else ""
        return (
            f"{head}[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} "
            f"{100 * f:3.0f}%  {clock_text(self.clock() - self.start)} elapsed, "
            f"~{eta} left{tail}"
        )

    def step(self, detail: str = "") -> str:
        self.done = min(self.done + 1, self.total)
        return self.line(detail)
