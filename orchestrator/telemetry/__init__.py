"""Telemetry: Prometheus metrics, run status and structured logs, fed by controller callbacks.

The controller's process wires it once at start-up::

    telemetry = Telemetry(run="llama-8b", host="0.0.0.0", port=9400,
                          node_event_handler=controller.post_node_event).start()
    controller = Controller(..., callbacks=[*telemetry.callbacks, ...])
    ...
    telemetry.stop()

and the server keeps answering through every re-plan and recovery.
"""

from __future__ import annotations

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.telemetry.logs import LogCallback, configure_logging, progress
from orchestrator.telemetry.metrics import METRIC_NAMES, PrometheusCallback
from orchestrator.telemetry.node_events import NODE_EVENT_KINDS, NodeEvent, parse_node_event
from orchestrator.telemetry.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    NodeEventHandler,
    TelemetryServer,
)
from orchestrator.telemetry.status import StatusTracker


class Telemetry:
    """Metrics, status and logs of one run, with the HTTP server that serves them."""

    def __init__(
        self,
        run: str,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        node_event_handler: NodeEventHandler | None = None,
        log_decisions: bool = True,
    ) -> None:
        self.metrics = PrometheusCallback(run)
        self.status = StatusTracker(run)
        self.logs = LogCallback(run) if log_decisions else None
        self.server = TelemetryServer(
            self.metrics.registry,
            status_provider=self.status.snapshot,
            node_event_handler=node_event_handler,
            host=host,
            port=port,
        )

    @property
    def callbacks(self) -> list[ControllerCallback]:
        """The callbacks to hand to the controller."""
        found: list[ControllerCallback] = [self.metrics, self.status]
        if self.logs is not None:
            found.append(self.logs)
        return found

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> Telemetry:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> Telemetry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "METRIC_NAMES",
    "NODE_EVENT_KINDS",
    "LogCallback",
    "NodeEvent",
    "PrometheusCallback",
    "StatusTracker",
    "Telemetry",
    "TelemetryServer",
    "configure_logging",
    "parse_node_event",
    "progress",
]
