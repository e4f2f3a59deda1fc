"""Data the controller produces: step reports, run events, state names.

These plain dataclasses flow from the worker group to the controller and from the controller to
callbacks (metrics, logs, status). No framework imports: telemetry and tests read them as they are.
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


@dataclass(frozen=True)
class StageTiming:
    """What one stage of one replica measured during one step."""

    replica: int
    stage: int
    device_type: str
    compute_s: float  # forward + backward compute time of this stage during the step
    step_s: float  # wall time of the whole step on this rank


@dataclass(frozen=True)
class StepReport:
    """One completed (committed) training step, as the worker group reports it."""

    step: int
    loss: float
    step_duration_s: float
    samples: int
    stage_timings: tuple[StageTiming, ...] = ()

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples / self.step_duration_s if self.step_duration_s > 0 else 0.0


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
    FINISHED = "finished"
    FAILED = "failed"


@dataclass(frozen=True)
class RunEvent:
    """One decision or observation, with its numbers, for the event list and structured log."""

    time_s: float
    kind: EventKind
    message: str
    data: dict[str, object] = field(default_factory=dict)
