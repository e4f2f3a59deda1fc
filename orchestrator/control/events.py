"""Data the controller produces: run events and state names.

These plain values flow from the controller to callbacks (metrics, logs, status). No framework
imports: telemetry and tests read them as they are. Step reports, which the worker group
produces, are nouns of ``orchestrator/spec/reports.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ControllerStateName(StrEnum):
    """The controller's states (see control/controller.py for the diagram)."""

    DISCOVERING = "discovering"
    PLANNING = "planning"
    LAUNCHING = "launching"
    RUNNING = "running"
    RECOVERING = "recovering"
    RESIZING = "resizing"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in (ControllerStateName.FINISHED, ControllerStateName.FAILED)


class PlanReason(StrEnum):
    """Why the controller looked for a plan, and why the plan it runs was put into effect."""

    INITIAL = "initial"
    RESTART = "restart"  # a new controller resumed from a checkpoint
    FAILURE = "failure"
    JOIN = "join"
    STRAGGLER = "straggler"
    SPEEDUP = "speedup"  # a node planned as slow measured faster again
    READMIT = "readmit"  # a slow node left without work, tried again at its labelled speed
    PREEMPTION = "preemption"


class EventKind(StrEnum):
    PLAN_CHOSEN = "plan_chosen"
    REPLAN = "replan"
    REPLAN_SKIPPED = "replan_skipped"
    FAILURE = "failure"
    RECOVERY = "recovery"
    PREEMPTION_NOTICE = "preemption_notice"
    NODE_JOINED = "node_joined"
    NODE_LOST = "node_lost"
    CHECKPOINT = "checkpoint"
    STRAGGLER = "straggler"
    STEP_SKIPPED = "step_skipped"  # fp16 overflow: the update was dropped, the step runs again
    SPEEDUP = "speedup"
    WARMING = "warming"  # a switch's new workers start and warm up while the plan trains
    WARM_READY = "warm_ready"  # they are ready: the switch happens at this step boundary
    READMIT = "readmit"  # a slow node without work tried again, and the trial's verdict
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True)
class RunEvent:
    """One decision or observation, with its numbers, for the event list and structured log."""

    time_s: float
    kind: EventKind
    message: str
    data: dict[str, object] = field(default_factory=dict)
