"""One step as one CUDA graph: a PlanRunner's step captured once, then replayed (one launch a step).

    step = StepGraph.capture(runner, agree=every_rank)   # collective over the step's ranks
    step.run()        # a replay of the captured graph (step.graphed), or runner.run() (eager)
    step.reason       # None when graphed; else one line saying why the step runs eagerly

Contract
- `capture(runner, agree=None, warmup=WARMUP)` first asks why the step cannot be captured: the
  rules of `REASONS`, in order, the first that answers wins (the backend's own `graph_reason(plan)`:
  the CPU has no CUDA graphs; a runner keeping a timeline, `marks`, times every piece of work on
  the host). Where none answers, it runs the step `warmup` times eagerly on a side stream (NCCL
  communicators and P2P connections, torch's allocator and CuPy's pool are set up there, outside
  the capture, as torch's and NCCL's capture rules ask), then captures one `runner.run()` into a
  `torch.cuda.CUDAGraph` on torch's capture stream, in "thread_local" mode (other threads, NCCL's
  watchdog or gloo's, may call what a capture forbids). `run()` forks the backend's compute and
  comm streams from the capture stream and joins them back (`Streams.fork`, `join`: events), so
  the kernels (CuPy, on the compute stream), the NCCL calls (on the comm stream), the events
  between them and torch's copies all land in the one graph. Anything that waits on the host
  inside a step (reading a value to the host, a synchronize, a blocking wait) makes the capture
  fail: the reason is "capture failed: <the error's first line>".
- Ranks agree: NCCL requires a captured operation to be captured by every rank it involves, so
  with `agree(ok) -> bool` (True on every rank when it is True on every rank: a collective over the
  ranks the step communicates with; it is called on every rank, whatever the rules said) a step
  that some rank could not capture runs eagerly everywhere ("capture failed on another rank").
  Without `agree` (one process) the rank's own outcome stands.
- State: the warm-up steps ran for real and updated whatever the step updates in place; load
  the inputs again before the step that counts. The capture itself runs nothing.
- `run()` is `PlanRunner.run()`'s contract (after the work on the caller's current stream, which
  then waits for the whole step): a graph replays on the current stream, reading and writing
  the runner's buffers where they were at capture (an input rebound later, `runner.bind`, is not
  seen: capture again). `compute_ms` is the runner's: host time issuing kernels, to which a
  replay adds nothing.
Host time per step (the time `run()` takes to return) is the caller's to measure
(`experiments.harness`: `host_us`).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

WARMUP = 2  # eager steps before the capture (NCCL's P2P connections need one outside it)
OTHER_RANK = "capture failed on another rank"

# why a step cannot be captured, asked in order: runner -> one line, or None (no objection)
REASONS: tuple[tuple[str, Callable[[object], Optional[str]]], ...] = (
    ("backend", lambda r: r.backend.graph_reason(r.plan)),
    (
        "timeline",
        lambda r: (
            "a timeline (marks) times each piece of work on the host"
            if r.marks is not None
            else None
        ),
    ),
)


def reason_not_to_capture(runner) -> Optional[str]:
    """The first rule of REASONS that objects to capturing the runner's step, or None."""
    for _, rule in REASONS:
        why = rule(runner)
        if why:
            return why
    return None


def cuda_graph(run: Callable[[], None], warmup: int = WARMUP):
    """`run` called `warmup` times on a side stream, then captured into a torch.cuda.CUDAGraph
    (torch's documented recipe: warm-up on a side stream, capture on torch's capture stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        run()
    return graph


def failure(e: BaseException) -> str:
    """An exception as one line of a reason."""
    lines = str(e).strip().splitlines()
    return f"capture failed: {type(e).__name__}: {lines[0] if lines else ''}"[:240]


class StepGraph:
    """A runner's step as a replayable CUDA graph, or the runner itself with why not."""

    def __init__(self, runner, graph=None, reason: Optional[str] = None):
        if (graph is None) == (reason is None):
            raise ValueError("a StepGraph has a graph or a reason, not both nor neither")
        self.runner, self.graph, self.reason = runner, graph, reason

    @classmethod
    def capture(
        cls, runner, agree: Optional[Callable[[bool], bool]] = None, warmup: int = WARMUP
    ) -> "StepGraph":
        reason, graph = reason_not_to_capture(runner), None
        if reason is None:
            try:
                graph = cuda_graph(runner.run, warmup)
            except Exception as e:  # noqa: BLE001 - any failure: run eagerly and say why
                reason = failure(e)
        if agree is not None and not agree(reason is None) and reason is None:
            graph, reason = None, OTHER_RANK
        return cls(runner, graph, reason)

    @property
    def graphed(self) -> bool:
        return self.graph is not None

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.runner.run()

    @property
    def compute_ms(self) -> float:
        return self.runner.compute_ms

    def columns(self) -> dict:
        """The results table's `graphed` and `graph_reason` ('' when graphed)."""
        return {"graphed": self.graphed, "graph_reason": self.reason or ""}
