"""The run's status as JSON, kept up to date from the controller's callbacks.

:class:`StatusTracker` is the status provider the telemetry server serves at ``GET /v1/status``
and ``orchestrator status`` prints. It remembers only what a person asks first: the state, the
plan, the cluster's make-up, speed against the prediction, and the last events.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName, RunEvent
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport

STATUS_FORMAT = "orchestrator-status/v1"
DEFAULT_MAX_EVENTS = 50


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Replicas, stages and devices of ``plan`` in a compact, readable form."""
    replicas = []
    for index, replica in enumerate(plan.replicas):
        stages = [
            {
                "stage": s_index,
                "layers": [stage.layers[0], stage.layers[1]],
                "device_type": stage.device_type,
                "tp": stage.tp,
                "node": stage.node,
            }
            for s_index, stage in enumerate(replica.stages)
        ]
        replicas.append({"replica": index, "batch_size": replica.batch_size, "stages": stages})
    return {
        "global_batch_size": plan.global_batch_size,
        "microbatch_size": plan.microbatch_size,
        "num_replicas": len(plan.replicas),
        "num_stages": [len(r.stages) for r in plan.replicas],
        "devices": dict(sorted(plan.device_counts().items())),
        "replicas": replicas,
    }


def event_to_json(event: RunEvent) -> dict[str, Any]:
    """A run event as JSON-ready data (non-JSON values in ``data`` become strings)."""
    data = {
        k: v if isinstance(v, str | int | float | bool | None) else str(v)
        for k, v in event.data.items()
    }
    return {
        "time_s": event.time_s,
        "kind": event.kind.value,
        "message": event.message,
        "data": data,
    }


class StatusTracker(ControllerCallback):
    """Collects the run's status from controller hooks; ``snapshot()`` returns it as JSON data.

    Thread-safe: hooks run on the controller's thread, ``snapshot()`` on the server's.
    """

    def __init__(
        self,
        run: str,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.run = run
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._state: str | None = None
        self._plan: dict[str, Any] | None = None
        self._plan_reason: str | None = None
        self._predicted_step_s: float | None = None
        self._bound_step_s: float | None = None
        self._global_batch_size: int | None = None
        self._alive: dict[str, int] = {}
        self._draining: dict[str, int] = {}
        self._last_step: dict[str, float | int] | None = None
        self._steps_committed = 0
        self._recoveries = 0
        self._lost_steps = 0
        self._emulated: bool | None = None
        self._events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._updated_unix_s = wall_clock()

    def _touch(self) -> None:
        self._updated_unix_s = self._wall_clock()

    def on_state(self, state: ControllerStateName) -> None:
        with self._lock:
            self._state = state.value
            self._touch()

    def on_devices(self, alive_by_type: dict[str, int], draining_by_type: dict[str, int]) -> None:
        with self._lock:
            self._alive = dict(sorted(alive_by_type.items()))
            self._draining = {k: v for k, v in sorted(draining_by_type.items()) if v}
            self._touch()

    def on_plan(
        self, plan: Plan, predicted_step_s: float, bound_step_s: float, reason: str
    ) -> None:
        with self._lock:
            self._plan = plan_summary(plan)
            self._plan_reason = reason
            self._predicted_step_s = predicted_step_s
            self._bound_step_s = bound_step_s
            self._global_batch_size = plan.global_batch_size
            self._touch()

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        with self._lock:
            self._steps_committed += 1
            self._predicted_step_s = predicted_step_s
            self._last_step = {
                "step": report.step,
                "loss": report.loss,
                "step_duration_s": report.step_duration_s,
                "samples": report.samples,
                "throughput_samples_per_s": report.throughput_samples_per_s,
            }
            self._touch()

    def on_recovery(self, reason: str, duration_s: float, lost_steps: int) -> None:
        with self._lock:
            self._recoveries += 1
            self._lost_steps += max(lost_steps, 0)
            self._touch()

    def on_event(self, event: RunEvent) -> None:
        with self._lock:
            self._events.append(event_to_json(event))
            self._touch()

    def on_emulated(self, emulated: bool) -> None:
        with self._lock:
            self._emulated = emulated
            self._touch()

    def snapshot(self) -> dict[str, Any]:
        """The status document served at ``GET /v1/status`` (format ``orchestrator-status/v1``)."""
        with self._lock:
            last = dict(self._last_step) if self._last_step else None
            predicted_tput = None
            if self._predicted_step_s and self._global_batch_size:
                predicted_tput = self._global_batch_size / self._predicted_step_s
            return {
                "format": STATUS_FORMAT,
                "run": self.run,
                "state": self._state,
                "step": last["step"] if last else None,
                "steps_committed": self._steps_committed,
                "loss": last["loss"] if last else None,
                "plan": self._plan,
                "plan_reason": self._plan_reason,
                "nodes": {"alive": dict(self._alive), "draining": dict(self._draining)},
                "step_duration_s": last["step_duration_s"] if last else None,
                "predicted_step_s": self._predicted_step_s,
                "bound_step_s": self._bound_step_s,
                "throughput_samples_per_s": last["throughput_samples_per_s"] if last else None,
                "predicted_throughput_samples_per_s": predicted_tput,
                "recoveries": self._recoveries,
                "lost_steps": self._lost_steps,
                "emulated": self._emulated,
                "events": list(self._events),
                "updated_unix_s": self._updated_unix_s,
            }
