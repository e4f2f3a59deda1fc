"""The shared token that guards ``POST /v1/node-events``.

A node event moves work off a node, so only the Kubernetes operator may send one. On Kubernetes
the chart generates a token in a Secret and mounts it into the operator and the Ray head; both
find the file through ``ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE``. The operator sends
``Authorization: Bearer <token>``; the controller compares in constant time.

Without the variable (a laptop, the demo) the endpoint takes events without a token, as before.
A variable that names an unreadable or empty file fails closed: events are refused.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from orchestrator.spec.node_events_token import (
    TOKEN_FILE_ENV,
    bearer_header,
    read_token_file,
)

__all__ = [
    "TOKEN_FILE_ENV",
    "TokenCheck",
    "bearer_header",
    "read_token_file",
    "token_check_from_env",
]


@dataclass(frozen=True)
class TokenCheck:
    """What the endpoint requires: nothing (``required`` False), or ``token``.

    ``problem`` is set when a token was configured but could not be read; every request is then
    refused with it.
    """

    required: bool
    token: str | None = None
    problem: str | None = None

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may post an event."""
        if not self.required:
            return True
        if self.token is None or not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        )


def token_check_from_env(environ: dict[str, str] | None = None) -> TokenCheck:
    """The check ``ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE`` asks for (none when unset)."""
    env = os.environ if environ is None else environ
    path = env.get(TOKEN_FILE_ENV)
    if not path:
        return TokenCheck(required=False)
    try:
        return TokenCheck(required=True, token=read_token_file(path))
    except (OSError, ValueError) as exc:
        return TokenCheck(required=True, problem=f"{TOKEN_FILE_ENV}={path}: {exc}")
