"""Typed updates of a running job, in the order they happened, for programs that follow a run.

:class:`~orchestrator.runtime.elastic.controller_actor.RunHandle` hands them out; the progress
lines a driver prints are only their human rendering, never something to parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.control.events import PlanReason, RunEvent
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport


@dataclass(frozen=True)
class PlanApplied:
    """A plan was put into effect (``time_s``: wall clock, seconds since the epoch)."""

    time_s: float
    plan: Plan
    predicted_step_s: float
    bound_step_s: float
    reason: PlanReason
    source: str  # "planner", or "file <path>" for a fixed plan
    emulated: bool


@dataclass(frozen=True)
class StepDone:
    """A step was committed (``time_s``: wall clock when the controller saw it)."""

    time_s: float
    report: StepReport
    total_steps: int


RunUpdate = PlanApplied | StepDone | RunEvent
