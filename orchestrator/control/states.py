"""The controller's states, each carrying what the next transition needs.

The state *type* knows its :class:`ControllerStateName` (and so whether it is terminal); the
controller keeps exactly one state object at a time and replaces it on every transition. A state
that waits (for devices, for a retry, for a failure's backoff) carries the time it may proceed
(:func:`proceed_at_s`): stepping it earlier returns it unchanged, so no step ever blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orchestrator.control.events import ControllerStateName, PlanReason
from orchestrator.control.ports import PlanProposal
from orchestrator.control.recovery import RestoreSource


@dataclass(frozen=True)
class DiscoveringState:
    """Waiting for enough usable devices; ``restore`` is what the next plan will load."""

    name: ClassVar[ControllerStateName] = ControllerStateName.DISCOVERING
    since_s: float
    reason: PlanReason
    restore: RestoreSource | None = None  # None: decide at start (checkpoint or fresh)
    waiting_for: str = ""  # why the last attempt could not plan
    retry_at_s: float = float("-inf")  # when to look again


@dataclass(frozen=True)
class PlanningState:
    name: ClassVar[ControllerStateName] = ControllerStateName.PLANNING
    since_s: float
    reason: PlanReason
    restore: RestoreSource
    retry_at_s: float = float("-inf")  # after a transient planner error: when to try again


@dataclass(frozen=True)
class LaunchingState:
    name: ClassVar[ControllerStateName] = ControllerStateName.LAUNCHING
    since_s: float
    reason: PlanReason
    proposal: PlanProposal
    restore: RestoreSource


@dataclass(frozen=True)
class PendingSwitch:
    """A switch the rule decided whose new workers are warming while the current plan trains;
    the switch happens at the first step boundary after they are ready."""

    proposal: PlanProposal
    trigger: PlanReason
    since_s: float
    evacuate_nodes: frozenset[str] = frozenset()  # a preemption's draining nodes
    switch_by_s: float = float("inf")  # switch then even if not warm (a preemption deadline)


@dataclass(frozen=True)
class RunningState:
    name: ClassVar[ControllerStateName] = ControllerStateName.RUNNING
    since_s: float
    reason: PlanReason  # why this plan is running
    proposal: PlanProposal
    pending: PendingSwitch | None = None


@dataclass(frozen=True)
class RecoveringState:
    """Workers were lost: read what survives, wait out the backoff, then re-plan.

    ``restore`` is set when the state to resume from is already in hand (a launch failed after
    states were read); otherwise recovery reads it from the survivors or the checkpoint.
    ``ready``: the restore is chosen and the old group stopped; only the backoff is left.
    """

    name: ClassVar[ControllerStateName] = ControllerStateName.RECOVERING
    since_s: float
    lost_nodes: frozenset[str]
    lost_ranks: frozenset[int]
    cause: str
    retry_at_s: float
    restore: RestoreSource | None = None
    ready: bool = False


@dataclass(frozen=True)
class ResizingState:
    """Moving a healthy run to a new plan at a step boundary.

    ``proposal`` is the new plan (join, straggler) or ``None`` to re-plan after evacuating
    ``evacuate_nodes`` (preemption).
    """

    name: ClassVar[ControllerStateName] = ControllerStateName.RESIZING
    since_s: float
    reason: PlanReason
    proposal: PlanProposal | None
    evacuate_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FinishedState:
    name: ClassVar[ControllerStateName] = ControllerStateName.FINISHED
    since_s: float
    steps: int


@dataclass(frozen=True)
class FailedState:
    """The run stopped; ``checkpoint_step`` is the checkpoint to resume from (None: none)."""

    name: ClassVar[ControllerStateName] = ControllerStateName.FAILED
    since_s: float
    reason: str
    checkpoint_step: int | None


ControllerState = (
    DiscoveringState
    | PlanningState
    | LaunchingState
    | RunningState
    | RecoveringState
    | ResizingState
    | FinishedState
    | FailedState
)


def proceed_at_s(state: ControllerState) -> float:
    """When ``state`` may next make progress (``-inf``: now)."""
    match state:
        case DiscoveringState() | PlanningState():
            return state.retry_at_s
        case RecoveringState(ready=True):
            return state.retry_at_s
        case _:
            return float("-inf")
