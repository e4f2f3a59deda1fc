"""Callbacks the controller calls; telemetry (metrics, logs) implements them.

Every method has a do-nothing default so an implementation overrides only what it needs. The
controller wraps each call so that a broken exporter never fails a training run.
"""

from __future__ import annotations

from orchestrator.control.events import ControllerStateName, PlanReason, RunEvent
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport


class ControllerCallback:
    """Base class: override the hooks you need."""

    def on_state(self, state: ControllerStateName) -> None:
        """The controller entered ``state``."""

    def on_devices(self, alive_by_type: dict[str, int], draining_by_type: dict[str, int]) -> None:
        """The cluster's make-up changed (devices alive and draining, by device type)."""

    def on_plan(
        self,
        plan: Plan,
        predicted_step_s: float,
        bound_step_s: float,
        reason: PlanReason,
    ) -> None:
        """A plan was put into effect, for ``reason``."""

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        """A step was committed."""

    def on_recovery(self, reason: str, duration_s: float, lost_steps: int) -> None:
        """A failure was recovered from: failure seen to first completed step after it."""

    def on_checkpoint(self, operation: str, duration_s: float) -> None:
        """A checkpoint was saved or loaded (``operation`` is "save" or "load")."""

    def on_event(self, event: RunEvent) -> None:
        """Any decision or observation (also delivered for plan, recovery and checkpoint)."""

    def on_emulated(self, emulated: bool) -> None:
        """Whether device speeds are emulated in this run."""
