"""Failure budget with exponential backoff.

A run may lose workers ``max_failures`` times. The first failure re-plans at once (a single crash
should cost no idle time); the n-th (n >= 2) waits ``min(initial_backoff_s * multiplier ** (n - 2),
max_backoff_s)`` before the controller re-plans, so a flapping node does not make the run thrash.
Failure ``max_failures + 1`` gives up.

The backoff counts only a *burst*. A failure starts a new one (n = 1, no wait) when

- it comes more than ``reset_after_s`` after the previous failure, or
- the previous failure's recovery succeeded (its first step committed) and the run then trained
  stably: at least ``stable_steps`` committed steps *and* ``stable_s`` seconds since that first
  step, before this failure.

Without the first, a long run at scale, where interruptions hours apart are normal, would wait
``max_backoff_s`` after every one of them; without the second, independent failures a minute
apart (each recovered and trained on) would wait 1, 2, 4, ... s as if a node were flapping. What
the backoff is for, a recovery that fails again at once or a node that drops out every few
seconds, never trains ``stable_s`` between failures and still backs off.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import SpecError


@dataclass(frozen=True)
class Retry:
    """Re-plan on the survivors after waiting ``after_s`` seconds."""

    after_s: float
    failure_count: int
    failures_left: int


@dataclass(frozen=True)
class GiveUp:
    """Stop the run; ``reason`` is the line shown to the user."""

    reason: str
    failure_count: int


class FailureDecision:
    """The two decisions: ``FailureDecision.RETRY(...)`` and ``FailureDecision.GIVE_UP(...)``.

    ``isinstance(decision, FailureDecision.RETRY)`` tells them apart.
    """

    RETRY = Retry
    GIVE_UP = GiveUp


@dataclass(frozen=True)
class FailurePolicy:
    """How many worker or node failures a run survives, and how long it waits after each."""

    max_failures: int = 5
    initial_backoff_s: float = 1.0
    backoff_multiplier: float = 2.0
    max_backoff_s: float = 30.0
    reset_after_s: float = 600.0  # a failure this long after the previous one starts a new burst
    # A failure after the previous recovery trained this long (steps and seconds) starts one too.
    stable_steps: int = 20
    stable_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_failures < 0:
            raise SpecError(
                f"max_failures is {self.max_failures}",
                field="elasticity.max_failures",
                fix="use 0 (fail on the first failure) or more",
            )
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise SpecError(
                "backoff seconds are negative",
                field="elasticity.initial_backoff_s / max_backoff_s",
                fix="use 0 or more seconds",
            )
        if self.reset_after_s < 0:
            raise SpecError(
                f"reset_after_s is {self.reset_after_s}",
                field="elasticity.reset_after_s",
                fix="use 0 or more seconds",
            )
        if self.stable_steps < 0 or self.stable_s < 0:
            raise SpecError(
                f"stable training is {self.stable_steps} steps / {self.stable_s} s",
                field="elasticity.backoff_reset_after_stable_steps / backoff_reset_after_stable_s",
                fix="use 0 or more",
            )
        if self.backoff_multiplier < 1:
            raise SpecError(
                f"backoff_multiplier is {self.backoff_multiplier}",
                field="elasticity.backoff_multiplier",
                fix="use 1 (constant backoff) or more",
            )

    def starts_burst(
        self,
        since_previous_failure_s: float,
        trained_since_recovery: tuple[int, float] | None,
    ) -> bool:
        """Whether a failure starts a new burst (its backoff from zero).

        ``since_previous_failure_s``: seconds since the previous failure (``inf`` if none).
        ``trained_since_recovery``: (committed steps, seconds) since the first step after the
        previous failure's recovery; None when that recovery has not yet committed a step.
        """
        if since_previous_failure_s > self.reset_after_s:
            return True
        if trained_since_recovery is None:
            return False
        steps, seconds = trained_since_recovery
        return steps >= self.stable_steps and seconds >= self.stable_s

    def backoff_s(self, failure_count: int) -> float:
        """Seconds to wait after the ``failure_count``-th failure (1-based); none after the 1st."""
        if failure_count <= 1:
            return 0.0
        raw = self.initial_backoff_s * self.backoff_multiplier ** (failure_count - 2)
        return min(raw, self.max_backoff_s)

    def decide(
        self, failure_count: int, cause: str, burst_count: int | None = None
    ) -> Retry | GiveUp:
        """Decide after the ``failure_count``-th failure of the run (1-based), the
        ``burst_count``-th of the current burst (default: ``failure_count``)."""
        if failure_count > self.max_failures:
            return GiveUp(
                reason=(
                    f"failure budget spent: {failure_count} failures, the budget allows "
                    f"{self.max_failures} (last: {cause}); raise elasticity.max_failures "
                    "or fix the failing nodes, then resume from the checkpoint"
                ),
                failure_count=failure_count,
            )
        return Retry(
            after_s=self.backoff_s(failure_count if burst_count is None else burst_count),
            failure_count=failure_count,
            failures_left=self.max_failures - failure_count,
        )
