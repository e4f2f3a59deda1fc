"""The controller's one HTTP endpoint: metrics, status and node events.

``TelemetryServer`` is a stdlib ``ThreadingHTTPServer`` on a daemon thread. It lives as long as
the controller process, so Prometheus keeps scraping through re-plans and recoveries (those
replace worker groups, never this server). Routes:

- ``GET /metrics``         Prometheus text format of the run's registry
- ``GET /v1/status``       JSON from the status provider (see telemetry/status.py)
- ``POST /v1/node-events`` a node event (see telemetry/node_events.py) for the controller;
  202 when accepted, 400 with a one-line reason on bad input, 401 without the bearer token
  when one is configured (see telemetry/auth.py)
- ``GET /healthz``         ``ok``

A failing status provider or handler answers 500 with its message; it never stops the server.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from orchestrator.errors import UserError
from orchestrator.telemetry import endpoints
from orchestrator.telemetry.auth import TokenCheck, token_check_from_env
from orchestrator.telemetry.node_events import NodeEvent, parse_node_event

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9400
MAX_BODY_BYTES = 64 * 1024  # a node event is a few hundred bytes

StatusProvider = Callable[[], dict[str, Any]]
NodeEventHandler = Callable[[NodeEvent], None]

log = logging.getLogger(__name__)


class TelemetryServer:
    """Serves ``registry`` and the run's status over HTTP on ``host:port`` (port 0: a free one).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        status_provider: StatusProvider | None = None,
        node_event_handler: NodeEventHandler | None = None,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        node_events_auth: TokenCheck | None = None,
    ) -> None:
        """``node_events_auth``: the token node events need; default from the environment."""
        if not 0 <= port <= 65535:
            raise UserError(f"port {port} is out of range", field="port", fix="use 0..65535")
        self.registry = registry
        self.status_provider = status_provider
        self.node_event_handler = node_event_handler
        self.node_events_auth = (
            node_events_auth if node_events_auth is not None else token_check_from_env()
        )
        self._host = host
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._record: Path | None = None

    @property
    def port(self) -> int:
        """The port actually bound (differs from the requested one when that was 0)."""
        if self._httpd is None:
            return self._port
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:9400``."""
        host = self._host if self._host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self) -> TelemetryServer:
        """Bind and serve on a daemon thread; raise :class:`UserError` if the port is taken."""
        if self._httpd is not None:
            return self
        handler = _make_handler(self)
        try:
            self._httpd = ThreadingHTTPServer((self._host, self._port), handler)
        except OSError as exc:
            if self._port == DEFAULT_PORT and exc.errno == errno.EADDRINUSE:
                # Another run on this machine has the default: serve on a free port instead
                # (the URL is printed and recorded for `orchestrator status`).
                log.warning("port %d is taken; serving telemetry on a free port", self._port)
                self._port = 0
                return self.start()
            raise UserError(
                f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc}",
                field="metrics port",
                fix="choose a free port (0 picks one)",
            ) from exc
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="orchestrator-telemetry", daemon=True
        )
        self._thread.start()
        self._record = endpoints.record(self.url, self.port)
        log.info("telemetry server listening", extra={"data": {"url": self.url}})
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._httpd is None:
            return
        endpoints.forget(self._record)
        self._record = None
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> TelemetryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _make_handler(server: TelemetryServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "orchestrator-telemetry"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(HTTPStatus.OK, generate_latest(server.registry), CONTENT_TYPE_LATEST)
            elif path == "/v1/status":
                self._status()
            elif path == "/healthz":
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no route {path}; try /metrics or /v1/status")

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path != "/v1/node-events":
                self._error(HTTPStatus.NOT_FOUND, f"no route POST {path}; try /v1/node-events")
                return
            self._node_event()

        def _status(self) -> None:
            if server.status_provider is None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, "no status provider in this process")
                return
            try:
                body = server.status_provider()
            except Exception as exc:  # a broken provider must not take the server down
                log.exception("status provider failed")
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"status unavailable: {exc}")
                return
            self._json(HTTPStatus.OK, body)

        def _node_event(self) -> None:
            if server.node_event_handler is None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, "this process takes no node events")
                return
            auth = server.node_events_auth
            if auth.problem is not None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"node events refused: {auth.problem}")
                return
            if not auth.allows(self.headers.get("Authorization")):
                self._error(
                    HTTPStatus.UNAUTHORIZED,
                    "node events need 'Authorization: Bearer <token>' with the token of the "
                    "node-events Secret",
                )
                return
            try:
                event = parse_node_event(self._read_json())
            except UserError as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc))
                return
            try:
                server.node_event_handler(event)
            except UserError as exc:
                self._error(HTTPStatus.BAD_REQUEST, str(exc))
                return
            except Exception as exc:
                log.exception("node event handler failed")
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"node event not handled: {exc}")
                return
            self._json(
                HTTPStatus.ACCEPTED, {"accepted": True, "node": event.node, "event": event.event}
            )

        def _read_json(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                raise UserError("not a number", field="Content-Length") from None
            if length <= 0:
                raise UserError("empty request body", field="body", fix="send a JSON object")
            if length > MAX_BODY_BYTES:
                raise UserError(
                    f"{length} bytes is over the {MAX_BODY_BYTES}-byte limit", field="body"
                )
            raw = self.rfile.read(length)
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(
                    f"not valid JSON ({exc})", field="body", fix="send a JSON object"
                ) from None

        def _json(self, status: HTTPStatus, body: Any) -> None:
            data = (json.dumps(body, sort_keys=True) + "\n").encode()
            self._send(status, data, "application/json")

        def _error(self, status: HTTPStatus, message: str) -> None:
            self._json(status, {"error": message})

        def _send(self, status: HTTPStatus, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            # Scrapes every second would flood stderr; requests go to debug logging instead.
            log.debug("%s " + format, self.address_string(), *args)

    return Handler
