"""Where decisions go: the run's event list, a structured log record, and the callbacks.

Every event is logged on the ``orchestrator.control`` logger with ``extra={"event": {...}}``, a
JSON-able dict (kind, time, message, data), so a JSON log formatter prints it as one line.
Callback calls are guarded: one that raises is logged and skipped, never fails the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import EventKind, RunEvent

LOGGER = logging.getLogger("orchestrator.control")


def jsonable(value: object) -> object:
    """A copy of ``value`` made of dicts, lists, str, int, float, bool and None only."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [jsonable(v) for v in value]
    return str(value)


class Journal:
    """Records events and fans them out; holds the run's event list."""

    def __init__(
        self,
        callbacks: Sequence[ControllerCallback] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        self.events: list[RunEvent] = []
        self.callbacks = list(callbacks)
        self.logger = logger or LOGGER
        self.callback_errors = 0

    def record(self, time_s: float, kind: EventKind, message: str, **data: object) -> RunEvent:
        """Append an event, log it, and deliver it to ``on_event``."""
        clean = jsonable(data)
        assert isinstance(clean, dict)
        event = RunEvent(time_s=time_s, kind=kind, message=message, data=clean)
        self.events.append(event)
        level = logging.WARNING if kind in (EventKind.FAILURE, EventKind.FAILED) else logging.INFO
        self.logger.log(
            level,
            message,
            extra={"event": {"kind": kind.value, "time_s": time_s, "message": message, **clean}},
        )
        self.notify("on_event", lambda cb: cb.on_event(event))
        return event

    def notify(self, hook: str, call: Callable[[ControllerCallback], None]) -> None:
        """``call(callback)`` for every callback (``hook`` names the method, for the log); a
        raising callback is logged and skipped."""
        for callback in self.callbacks:
            try:
                call(callback)
            except Exception:  # a broken exporter must never fail the run
                self.callback_errors += 1
                self.logger.exception(
                    "callback %s.%s raised; ignored",
                    type(callback).__name__,
                    hook,
                    extra={"event": {"kind": "callback_error", "hook": hook}},
                )

    def of_kind(self, kind: EventKind) -> list[RunEvent]:
        return [e for e in self.events if e.kind is kind]
