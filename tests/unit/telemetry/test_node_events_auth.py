"""The node-events endpoint's bearer token: required when configured, checked, fails closed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from orchestrator.telemetry import NodeEvent, TelemetryServer
from orchestrator.telemetry.auth import (
    TOKEN_FILE_ENV,
    TokenCheck,
    bearer_header,
    token_check_from_env,
)

EVENT = {"node": "gke-a100-1", "event": "node_lost"}


def post(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        url + "/v1/node-events", data=json.dumps(EVENT).encode(), method="POST",
        headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def served():
    """A server whose token is 's3cret'; yields (url, events received)."""
    received: list[NodeEvent] = []
    server = TelemetryServer(CollectorRegistry(), node_event_handler=received.append, port=0,
                             node_events_auth=TokenCheck(required=True, token="s3cret"))
    with server:
        yield server.url, received


def test_without_or_with_a_wrong_token_the_event_is_refused(served) -> None:
    url, received = served
    assert post(url, {}) == 401
    assert post(url, {"Authorization": "Bearer wrong"}) == 401
    assert post(url, {"Authorization": "Basic s3cret"}) == 401
    assert received == []


def test_with_the_token_the_event_reaches_the_handler(served) -> None:
    url, received = served
    assert post(url, bearer_header("s3cret")) == 202
    assert [(e.node, e.event) for e in received] == [("gke-a100-1", "node_lost")]


def test_metrics_need_no_token(served) -> None:
    url, _ = served
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        assert response.status == 200


def test_token_from_the_file_the_environment_names(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc123\n")
    check = token_check_from_env({TOKEN_FILE_ENV: str(path)})
    assert check == TokenCheck(required=True, token="abc123")
    assert check.allows("Bearer abc123") and not check.allows(None)
    assert token_check_from_env({}) == TokenCheck(required=False)


def test_an_unreadable_token_file_fails_closed(tmp_path: Path) -> None:
    check = token_check_from_env({TOKEN_FILE_ENV: str(tmp_path / "missing")})
    assert check.required and check.problem and TOKEN_FILE_ENV in check.problem
    assert not check.allows("Bearer anything")
    received: list[NodeEvent] = []
    server = TelemetryServer(CollectorRegistry(), node_event_handler=received.append, port=0,
                             node_events_auth=check)
    with server:
        assert post(server.url, bearer_header("anything")) == 503
    assert received == []
