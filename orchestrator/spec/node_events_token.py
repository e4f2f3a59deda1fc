"""The node-events token as both ends see it: where it is found and how it is sent.

A node event moves work off a node, so only the Kubernetes operator may post one to the
controller's ``POST /v1/node-events``. The chart mounts one token file into the operator and the
Ray head; both find it through ``ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE``, and the operator sends it
as ``Authorization: Bearer <token>``. This module is the shared contract (the operator imports
only the spec layer); the controller's check is ``orchestrator.telemetry.auth``.
"""

from __future__ import annotations

import os
from pathlib import Path

TOKEN_FILE_ENV = "ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE"


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path`` (surrounding whitespace removed); OSError/ValueError if unusable."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


def bearer_header(token: str | None) -> dict[str, str]:
    """The header that carries ``token`` (nothing without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
