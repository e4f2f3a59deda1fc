"""Structured logs of every controller decision, and progress bars for long work.

- :func:`configure_logging` sets up the ``orchestrator`` logger: readable text, or one JSON object
  per line (``json_format=True``) for log collectors. Numbers travel in ``extra={"data": {...}}``
  and land as fields of the JSON object (or ``key=value`` pairs in text).
- :class:`LogCallback` logs what the controller hooks carry (plans with their bound ratio,
  devices, recoveries; steps at debug level). The controller's journal logs every decision as an
  event on ``orchestrator.control``; both come out as JSON with their numbers.
- :func:`progress` is a rich progress bar that stays quiet when output is not a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport

LOGGER_NAME = "orchestrator"


def _record_data(record: logging.LogRecord) -> dict[str, Any]:
    """Numbers of a record: ``extra={"data": {...}}`` (telemetry) and ``extra={"event": {...}}``
    (the controller's journal, whose ``kind`` becomes the ``event`` field)."""
    found: dict[str, Any] = {}
    event = getattr(record, "event", None)
    if isinstance(event, dict):
        found.update({("event" if k == "kind" else k): v for k, v in event.items()})
        found.pop("message", None)  # already the record's message
    data = getattr(record, "data", None)
    if isinstance(data, dict):
        found.update(data)
    return found


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (Unix seconds), ``level``, ``logger``, ``msg`` and data."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _record_data(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, sort_keys=False)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value ...`` for people."""

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        pairs = " ".join(f"{k}={_short(v)}" for k, v in _record_data(record).items())
        line = f"{clock} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if pairs:
            line = f"{line}  {pairs}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def configure_logging(
    *, level: str | int = "INFO", json_format: bool = False, stream: IO[str] | None = None
) -> logging.Logger:
    """Send the ``orchestrator`` logger to ``stream`` (stderr by default), text or JSON.

    Calling it again replaces the handler it installed before (never others' handlers).
    """
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        if getattr(handler, "_orchestrator_handler", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter())
    handler._orchestrator_handler = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level if isinstance(level, int) else level.upper())
    logger.propagate = False
    return logger


class LogCallback(ControllerCallback):
    """Logs every controller decision and observation with its numbers."""

    def __init__(self, run: str, logger: logging.Logger | None = None) -> None:
        self.run = run
        self.log = logger or logging.getLogger(f"{LOGGER_NAME}.controller")

    def _info(self, message: str, **data: Any) -> None:
        self.log.info(message, extra={"data": {"run": self.run, **data}})

    # Events (every decision with its numbers) are logged by the controller's journal on
    # ``orchestrator.control``; this callback adds what only the hooks carry, without repeating.

    def on_state(self, state: ControllerStateName) -> None:
        self.log.debug(
            f"state {state.value}", extra={"data": {"run": self.run, "state": state.value}}
        )

    def on_devices(self, alive_by_type: dict[str, int], draining_by_type: dict[str, int]) -> None:
        self._info(
            "devices",
            alive=dict(sorted(alive_by_type.items())),
            draining=dict(sorted(draining_by_type.items())),
        )

    def on_plan(
        self, plan: Plan, predicted_step_s: float, bound_step_s: float, reason: str
    ) -> None:
        ratio = predicted_step_s / bound_step_s if bound_step_s > 0 else None
        self._info(
            f"plan ({reason})",
            reason=reason,
            replicas=len(plan.replicas),
            stages=[len(r.stages) for r in plan.replicas],
            devices=plan.device_counts(),
            predicted_step_s=predicted_step_s,
            bound_step_s=bound_step_s,
            bound_ratio=ratio,
        )

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        # Every step at debug level: a run has many thousands; decisions stay at info.
        self.log.debug(
            "step",
            extra={
                "data": {
                    "run": self.run,
                    "step": report.step,
                    "loss": report.loss,
                    "step_s": report.step_duration_s,
                    "predicted_step_s": predicted_step_s,
                    "samples_per_s": report.throughput_samples_per_s,
                }
            },
        )

    def on_recovery(self, reason: str, duration_s: float, lost_steps: int) -> None:
        self._info("recovered", reason=reason, recovery_s=duration_s, lost_steps=lost_steps)

    def on_checkpoint(self, operation: str, duration_s: float) -> None:
        self.log.debug(
            f"checkpoint {operation}",
            extra={"data": {"run": self.run, "operation": operation, "duration_s": duration_s}},
        )

    def on_emulated(self, emulated: bool) -> None:
        if emulated:
            self.log.warning(
                "device speeds are emulated (no real accelerators)",
                extra={"data": {"run": self.run, "emulated": True}},
            )


class ProgressBar:
    """Handle of one bar: :meth:`advance` it; quiet (no output) when not on a terminal."""

    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._progress = progress
        self._task_id = task_id

    def advance(self, amount: float = 1.0) -> None:
        self._progress.advance(self._task_id, amount)

    def update(self, *, description: str | None = None, completed: float | None = None) -> None:
        self._progress.update(self._task_id, description=description, completed=completed)


@contextmanager
def progress(
    description: str, total: float | None, *, console: Console | None = None
) -> Iterator[ProgressBar]:
    """A progress bar for long work (profiling, training in ``demo``).

    Disabled automatically when ``console`` (stderr by default) is not a terminal, so logs and CI
    output stay free of bar redraws.
    """
    console = console or Console(stderr=True)
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task_id = bar.add_task(description, total=total)
        yield ProgressBar(bar, task_id)
