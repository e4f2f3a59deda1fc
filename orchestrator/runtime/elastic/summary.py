"""What a run reports when it ends (and, so far, while it runs): :class:`RunSummary`.

Built from the controller's ledger and its journal by :func:`summarise`; plain frozen data, so it
crosses the controller actor's boundary as it is. :meth:`RunSummary.to_json` gives the same
figures as JSON-ready data for tools that store or diff them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.control.controller import Controller
from orchestrator.control.events import ControllerStateName, EventKind, RunEvent
from orchestrator.control.ports import CheckpointStore
from orchestrator.control.states import FailedState, FinishedState
from orchestrator.spec.reports import StepReport


@dataclass(frozen=True)
class Recovery:
    """One recovered failure: failure seen to first committed step after it."""

    recovery_s: float
    lost_steps: int
    step: int
    cause: str


@dataclass(frozen=True)
class RunSummary:
    """State, steps, losses, recoveries (time and lost steps), plans and events of a run.

    ``steps`` counts every committed step of the run, also those of an earlier controller it
    resumed from; ``steps_run`` (and ``step_indices``, ``losses``) only this controller's.
    """

    state: ControllerStateName
    reason: str
    steps: int
    steps_run: int
    first_loss: float | None
    last_loss: float | None
    mean_step_s: float
    step_indices: tuple[int, ...]
    losses: tuple[float, ...]
    emulated: bool
    failure_count: int
    lost_steps_total: int
    recoveries: tuple[Recovery, ...]
    switch_costs_s: tuple[float, ...]
    checkpoint_step: int | None
    checkpoint_path: str
    events: tuple[RunEvent, ...]

    @property
    def finished(self) -> bool:
        return self.state is ControllerStateName.FINISHED

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-ready data (enum values as strings, events as in ``/v1/status``)."""
        from orchestrator.telemetry.status import event_to_json

        data = asdict(self)
        data.update(state=self.state.value, events=[event_to_json(e) for e in self.events])
        return data


def summarise(
    c: Controller, reports: Sequence[StepReport], emulated: bool, store: CheckpointStore
) -> RunSummary:
    """The summary of controller ``c`` whose committed steps were ``reports``."""
    state = c.state
    latest = store.latest()
    return RunSummary(
        state=state.name,
        reason=state.reason if isinstance(state, FailedState) else "",
        steps=state.steps if isinstance(state, FinishedState) else c.next_step,
        steps_run=len(reports),
        first_loss=reports[0].loss if reports else None,
        last_loss=reports[-1].loss if reports else None,
        mean_step_s=statistics.fmean(r.step_duration_s for r in reports) if reports else 0.0,
        step_indices=tuple(r.step for r in reports),
        losses=tuple(r.loss for r in reports),
        emulated=emulated,
        failure_count=c.failure_count,
        lost_steps_total=c.lost_steps_total,
        recoveries=tuple(
            Recovery(
                recovery_s=_number(e.data["recovery_s"]),
                lost_steps=int(_number(e.data.get("lost_steps"))),
                step=int(_number(e.data.get("step"))),
                cause=str(e.data.get("cause", "")),
            )
            for e in c.journal.of_kind(EventKind.RECOVERY)
            if "recovery_s" in e.data
        ),
        switch_costs_s=tuple(c.switch_cost.observations_s),
        checkpoint_step=latest.step if latest else None,
        checkpoint_path=str(latest.manifest.get("path", "")) if latest else "",
        events=tuple(c.events),
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
