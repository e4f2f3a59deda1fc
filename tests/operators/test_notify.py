"""The node-event sender and metrics reader against a small local HTTP server (real sockets)."""

from __future__ import annotations

import socket

import pytest
from conftest import FakeController

from operators.hetero.delivery import with_retries
from operators.hetero.nodes import NodeEvent, NodeEventKind
from operators.hetero.notify import fetch_metrics, send_node_event
from orchestrator.errors import TransientError

EVENT = NodeEvent("gke-a100-1", NodeEventKind.SPOT_TERMINATION, "A100-80", 1767225600.0,
                  "taint cloud.google.com/impending-node-termination",
                  {"orchestrator.io/device-type": "A100-80"})


def test_sender_posts_the_documented_json(controller) -> None:
    assert send_node_event(controller.url, EVENT) == 202
    assert controller.received() == [{
        "node": "gke-a100-1", "event": "preemption_notice", "device_type": "A100-80",
        "deadline_unix_s": 1767225600.0,
        "reason": "spot_termination: taint cloud.google.com/impending-node-termination",
    }]


def test_server_errors_are_transient_and_retried() -> None:
    fake = FakeController(fail_first=2)
    try:
        with pytest.raises(TransientError):
            send_node_event(fake.url, EVENT)
        # One failure left on the server: the retry delivers the event.
        assert with_retries(lambda: send_node_event(fake.url, EVENT), backoff_s=0.01) == 202
        assert [e["node"] for e in fake.received()] == ["gke-a100-1"]
    finally:
        fake.close()


def test_unreachable_controller_is_transient() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransientError, match="not delivered"):
        send_node_event(f"http://127.0.0.1:{port}", EVENT, timeout_s=1.0)
    with pytest.raises(TransientError, match="unreachable"):
        fetch_metrics(f"http://127.0.0.1:{port}", timeout_s=1.0)


def test_fetch_metrics_reads_the_text(controller) -> None:
    controller.metrics_text = "orchestrator_loss{run=\"r\"} 2.5\n"
    assert fetch_metrics(controller.url) == controller.metrics_text


def test_sender_carries_the_token_and_a_refusal_is_not_transient() -> None:
    from prometheus_client import CollectorRegistry

    from orchestrator.telemetry import TelemetryServer
    from orchestrator.telemetry.auth import TokenCheck

    received = []
    server = TelemetryServer(CollectorRegistry(), node_event_handler=received.append, port=0,
                             node_events_auth=TokenCheck(required=True, token="t0ken"))
    with server:
        assert send_node_event(server.url, EVENT, token="t0ken") == 202
        with pytest.raises(PermissionError, match="node-events Secret"):
            send_node_event(server.url, EVENT, token="other")
        with pytest.raises(PermissionError):
            send_node_event(server.url, EVENT)
    assert [e.node for e in received] == ["gke-a100-1"]
