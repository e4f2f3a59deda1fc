"""Typed failures of a worker group; retryable versus permanent is in the type.

A lost worker is the controller's own :class:`~orchestrator.control.ports.WorkerLost`.

Every error here pickles intact (it may be raised where Ray moves it between processes).
"""

from __future__ import annotations

from orchestrator.errors import PermanentError, TransientError


class WorkerTimeoutError(TransientError):
    """Workers did not finish a phase (set-up or a step) in time; they may be hung or too slow."""

    def __init__(self, phase: str, ranks: tuple[int, ...], timeout_s: float) -> None:
        super().__init__(f"{phase}: ranks {list(ranks)} did not finish within {timeout_s:.0f} s")
        self.phase = phase
        self.ranks = ranks
        self.timeout_s = timeout_s

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.phase, self.ranks, self.timeout_s))


class WorkerFailedError(PermanentError):
    """A worker raised an error while every worker stayed alive: a bug or bad data, not a loss."""

    def __init__(self, phase: str, rank: int, detail: str) -> None:
        super().__init__(f"{phase}: rank {rank} failed: {detail}")
        self.phase = phase
        self.rank = rank
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.phase, self.rank, self.detail))
