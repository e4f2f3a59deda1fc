"""Talking to the run's controller over HTTP: node events out, Prometheus metrics in.

Both calls use a short timeout, so a slow controller never holds a watch stream; a failure raises
:class:`~orchestrator.errors.TransientError` (the handlers turn it into a retry).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from operators.hetero.nodes import NodeEvent
from orchestrator.errors import TransientError
from orchestrator.spec.node_events_token import bearer_header

NODE_EVENTS_PATH = "/v1/node-events"
TIMEOUT_S = 2.0


def send_node_event(
    base_url: str, event: NodeEvent, *, token: str | None = None, timeout_s: float = TIMEOUT_S
) -> int:
    """POST one event to ``<base_url>/v1/node-events``; return the HTTP status (2xx).

    ``token``: sent as ``Authorization: Bearer``. A 401/403 is not transient (a wrong token does
    not heal): it raises PermissionError naming the Secret to check.
    """
    body = json.dumps(event.to_json()).encode()
    request = urllib.request.Request(
        base_url.rstrip("/") + NODE_EVENTS_PATH,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **bearer_header(token)},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise PermissionError(
                f"node event for {event.node} refused by {base_url} ({exc.code}): the operator's "
                "token does not match the controller's; check the node-events Secret"
            ) from exc
        raise TransientError(f"node event {event.event} for {event.node} not delivered to "
                             f"{base_url}: {exc}") from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise TransientError(f"node event {event.event} for {event.node} not delivered to "
                             f"{base_url}: {exc}") from exc


def fetch_metrics(base_url: str, *, timeout_s: float = TIMEOUT_S) -> str:
    """GET ``<base_url>/metrics`` (Prometheus text)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise TransientError(f"controller metrics at {base_url} unreachable: {exc}") from exc
