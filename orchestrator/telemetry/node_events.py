"""Node events posted to the controller (``POST /v1/node-events``), validated at the edge.

The Kubernetes operator (and anything else that learns of node changes before Ray does) posts::

    {"node": "gpu-l4-2", "event": "preemption_notice", "device_type": "L4",
     "deadline_unix_s": 1767225600.0, "reason": "spot reclaim"}

``event`` is one of :data:`NODE_EVENT_KINDS`; ``deadline_unix_s`` is required for a preemption
notice (when the node goes away) and optional otherwise. Unknown fields are refused, so a typo
never passes silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError

NODE_EVENT_KINDS = ("preemption_notice", "node_lost", "node_joined")
_FIELDS = ("node", "event", "device_type", "deadline_unix_s", "reason")


@dataclass(frozen=True)
class NodeEvent:
    """A validated node event, as handed to the controller's node-event handler."""

    node: str
    event: str
    device_type: str | None = None
    deadline_unix_s: float | None = None
    reason: str = ""


def parse_node_event(body: Any) -> NodeEvent:
    """Validate a decoded JSON body; raise :class:`UserError` naming the field and the fix."""
    if not isinstance(body, dict):
        raise UserError(
            f"expected a JSON object, got {type(body).__name__}",
            field="body",
            fix='send {"node": ..., "event": ...}',
        )
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise UserError(
            f"unknown field(s) {', '.join(unknown)}",
            field=unknown[0],
            fix=f"use only {', '.join(_FIELDS)}",
        )
    node = _required_string(body, "node")
    event = _required_string(body, "event")
    if event not in NODE_EVENT_KINDS:
        raise UserError(
            f"unknown event {event!r}",
            field="event",
            fix=f"use one of {', '.join(NODE_EVENT_KINDS)}",
        )
    device_type = _optional_string(body, "device_type")
    reason = _optional_string(body, "reason") or ""
    deadline = body.get("deadline_unix_s")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise UserError(
                f"must be a number (seconds since the epoch), got {deadline!r}",
                field="deadline_unix_s",
                fix="send a Unix time such as 1767225600.0",
            )
        if not math.isfinite(deadline) or deadline < 0:
            raise UserError(
                f"must be a finite, non-negative Unix time, got {deadline!r}",
                field="deadline_unix_s",
                fix="send a Unix time such as 1767225600.0",
            )
        deadline = float(deadline)
    elif event == "preemption_notice":
        raise UserError(
            "a preemption notice needs the time the node goes away",
            field="deadline_unix_s",
            fix="add deadline_unix_s (seconds since the epoch)",
        )
    return NodeEvent(
        node=node, event=event, device_type=device_type, deadline_unix_s=deadline, reason=reason
    )


def _required_string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise UserError(
            f"required, a non-empty string (got {value!r})", field=name, fix=f"add {name!r}"
        )
    return value


def _optional_string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserError(
            f"must be a non-empty string when given (got {value!r})",
            field=name,
            fix=f"send a string or leave {name!r} out",
        )
    return value
