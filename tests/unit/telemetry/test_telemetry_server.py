"""The telemetry HTTP server on loopback: metrics, status and node events (good and bad)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from telemetry_scenario import a100_only_plan, step_report

from orchestrator.errors import UserError
from orchestrator.telemetry import NodeEvent, Telemetry, TelemetryServer, parse_node_event
from orchestrator.telemetry.metrics import PrometheusCallback


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def post(url: str, body: bytes | str | object) -> tuple[int, dict]:
    data = (
        body
        if isinstance(body, bytes)
        else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    )
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def received() -> list[NodeEvent]:
    return []


@pytest.fixture
def telemetry(received):
    with Telemetry("srv", port=0, node_event_handler=received.append, log_decisions=False) as t:
        yield t


def test_metrics_are_served_in_prometheus_text_format(telemetry, scripted_run):
    for callback in telemetry.callbacks:
        scripted_run(callback)
    status, content_type, body = get(telemetry.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    assert 'orchestrator_steps_total{run="srv"} 5.0' in body.decode()


def test_metrics_follow_a_replan_without_restarting_the_server(telemetry, scripted_run):
    metrics = telemetry.metrics
    scripted_run(metrics)
    port_before = telemetry.server.port
    metrics.on_plan(a100_only_plan(), 0.9, 0.45, "join")
    metrics.on_step(step_report(4, 0.9, two_stages=False), 0.9)
    _, _, body = get(telemetry.url + "/metrics")
    text = body.decode()
    assert telemetry.server.port == port_before
    assert 'orchestrator_plan_changes_total{reason="join",run="srv"} 1.0' in text
    assert 'orchestrator_plan_bound_ratio{run="srv"} 2.0' in text


def test_status_is_json_with_state_step_plan_and_events(telemetry, scripted_run):
    for callback in telemetry.callbacks:
        scripted_run(callback)
    status, content_type, body = get(telemetry.url + "/v1/status")
    assert status == 200 and content_type == "application/json"
    doc = json.loads(body)
    assert doc["state"] == "finished"
    assert doc["step"] == 3
    assert doc["steps_committed"] == 5
    assert doc["plan"]["devices"] == {"A100": 1}
    assert doc["plan_reason"] == "failure"
    assert doc["nodes"] == {"alive": {"A100": 3}, "draining": {}}
    assert doc["predicted_throughput_samples_per_s"] == pytest.approx(16 / 0.8)
    assert doc["throughput_samples_per_s"] == pytest.approx(16 / 0.85)
    assert [e["kind"] for e in doc["events"]] == ["plan_chosen", "node_lost", "replan", "recovery"]
    assert doc["lost_steps"] == 2 and doc["recoveries"] == 1 and doc["emulated"] is True


def test_a_valid_node_event_reaches_the_handler(telemetry, received):
    event = {
        "node": "l4-1",
        "event": "preemption_notice",
        "device_type": "L4",
        "deadline_unix_s": 1767225600,
        "reason": "spot reclaim",
    }
    status, body = post(telemetry.url + "/v1/node-events", event)
    assert status == 202 and body["accepted"] is True
    assert received == [NodeEvent("l4-1", "preemption_notice", "L4", 1767225600.0, "spot reclaim")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "body: not valid JSON"),
        ([1, 2], "body: expected a JSON object, got list"),
        ({"node": "n", "event": "node_lost", "colour": "red"}, "colour: unknown field"),
        ({"event": "node_lost"}, "node: required"),
        ({"node": "n", "event": "exploded"}, "event: unknown event 'exploded'"),
        ({"node": "n", "event": "preemption_notice"}, "deadline_unix_s: a preemption notice"),
        ({"node": "n", "event": "node_lost", "deadline_unix_s": "soon"}, "deadline_unix_s: must"),
        ({"node": "n", "event": "node_lost", "deadline_unix_s": -1}, "deadline_unix_s: must"),
        ({"node": "n", "event": "node_joined", "device_type": ""}, "device_type: must"),
    ],
)
def test_bad_node_events_answer_400_naming_the_field(telemetry, received, body, expected):
    status, answer = post(telemetry.url + "/v1/node-events", body)
    assert status == 400
    assert answer["error"].startswith(expected)
    assert received == []


def test_empty_body_is_refused(telemetry):
    status, answer = post(telemetry.url + "/v1/node-events", b"")
    assert status == 400 and "empty request body" in answer["error"]


def test_a_failing_handler_answers_500_and_the_server_keeps_serving():
    def broken(event: NodeEvent) -> None:
        raise RuntimeError("controller busy")

    def refusing(event: NodeEvent) -> None:
        raise UserError(f"no node named {event.node}", field="node")

    metrics = PrometheusCallback("srv")
    with TelemetryServer(metrics.registry, node_event_handler=broken, port=0) as server:
        status, answer = post(server.url + "/v1/node-events", {"node": "x", "event": "node_lost"})
        assert status == 500 and "controller busy" in answer["error"]
        server.node_event_handler = refusing
        status, answer = post(server.url + "/v1/node-events", {"node": "x", "event": "node_lost"})
        assert status == 400 and answer["error"] == "node: no node named x"
        assert get(server.url + "/metrics")[0] == 200


def test_without_provider_or_handler_the_server_says_so():
    metrics = PrometheusCallback("srv")
    with TelemetryServer(metrics.registry, port=0) as server:
        status, _, body = get(server.url + "/v1/status")
        assert status == 503 and b"no status provider" in body
        status, answer = post(server.url + "/v1/node-events", {"node": "x", "event": "node_lost"})
        assert status == 503 and "takes no node events" in answer["error"]
        status, _, body = get(server.url + "/nowhere")
        assert status == 404 and b"/metrics" in body


def test_a_broken_status_provider_answers_500():
    def provider() -> dict:
        raise KeyError("plan")

    metrics = PrometheusCallback("srv")
    with TelemetryServer(metrics.registry, status_provider=provider, port=0) as server:
        status, _, body = get(server.url + "/v1/status")
        assert status == 500 and b"status unavailable" in body
        assert get(server.url + "/healthz")[:1] == (200,)


def test_port_zero_picks_a_free_port_and_a_taken_port_is_a_user_error():
    metrics = PrometheusCallback("srv")
    with TelemetryServer(metrics.registry, port=0) as first:
        assert first.port > 0
        with pytest.raises(UserError, match=r"cannot listen on 127\.0\.0\.1:"):
            TelemetryServer(metrics.registry, port=first.port).start()
    # stop() released the port: binding it again works.
    with socket.socket() as s:
        s.bind(("127.0.0.1", first.port))


def test_out_of_range_port_is_refused():
    with pytest.raises(UserError, match="port 70000 is out of range"):
        TelemetryServer(PrometheusCallback("srv").registry, port=70000)


def test_parse_node_event_accepts_the_minimal_form():
    assert parse_node_event({"node": "a", "event": "node_joined"}) == NodeEvent("a", "node_joined")
