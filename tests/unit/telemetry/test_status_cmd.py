"""`orchestrator status` against a real telemetry server on loopback."""

from __future__ import annotations

import json
import socket

import pytest

from orchestrator.cli.main import main
from orchestrator.cli.status_cmd import status_url
from orchestrator.telemetry import Telemetry, TelemetryServer
from orchestrator.telemetry.metrics import PrometheusCallback


@pytest.fixture
def running_job(scripted_run):
    with Telemetry("status-test", port=0, log_decisions=False) as t:
        for callback in t.callbacks:
            scripted_run(callback)
        yield t


def test_table_shows_state_plan_nodes_speed_and_events(running_job, capsys):
    assert main(["status", "--address", running_job.url]) == 0
    out = capsys.readouterr().out
    assert "state finished" in out and "step 3" in out
    assert "emulated" in out
    # plan after the failure: 1 replica on 1 A100, chosen because of the failure
    assert "plan (failure): 1 replica(s), 1 x A100" in out
    assert "[0, 10)" in out
    # speed against prediction: 16/0.85 = 18.82 measured, 16/0.8 = 20 predicted (94 %)
    assert "18.82 samples/s measured, 20 samples/s predicted (94% of predicted)" in out
    for text in ("node_lost", "recovery", "lost_steps=2", "recovery_s=4.5"):
        assert text in out


def test_json_has_state_step_plan_and_events(running_job, capsys):
    assert main(["status", "--address", running_job.url.removeprefix("http://"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "finished" and doc["step"] == 3
    assert doc["plan"]["num_replicas"] == 1
    assert [e["kind"] for e in doc["events"]][-1] == "recovery"


def test_no_job_prints_one_line_and_exits_1(capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["status", "--address", f"http://127.0.0.1:{port}", "--timeout-s", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"orchestrator status: no job is running at http://127.0.0.1:{port}")
    assert "\n" not in err


def test_a_server_without_a_status_document_counts_as_no_job(capsys):
    with TelemetryServer(PrometheusCallback("x").registry, port=0) as server:
        # /v1/status answers 503 there; any HTTP error means no job to show
        assert main(["status", "--address", server.url]) == 1
    assert "no job is running" in capsys.readouterr().err


def test_a_non_http_address_is_a_user_error(capsys):
    assert main(["status", "--address", "ray://head:10001"]) == 2
    assert "--address: 'ray://head:10001' is not an HTTP address" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("10.0.0.5:9400", "http://10.0.0.5:9400/v1/status"),
        ("http://h:1/metrics", "http://h:1/v1/status"),
        ("https://h/v1/status/", "https://h/v1/status"),
    ],
)
def test_status_url(address, url):
    assert status_url(address) == url


def test_a_job_whose_status_fails_says_why(capsys):
    def provider() -> dict:
        raise RuntimeError("plan not readable")

    metrics = PrometheusCallback("x")
    with TelemetryServer(metrics.registry, status_provider=provider, port=0) as server:
        assert main(["status", "--address", server.url]) == 1
    err = capsys.readouterr().err
    assert "answered HTTP 500" in err and "plan not readable" in err
