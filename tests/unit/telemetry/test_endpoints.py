"""A second run on one machine still serves telemetry, and `orchestrator status` finds it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from orchestrator.cli import status_cmd
from orchestrator.cli.main import main
from orchestrator.telemetry.endpoints import live_endpoints
from orchestrator.telemetry.server import DEFAULT_PORT, TelemetryServer


def _server(state: str) -> TelemetryServer:
    return TelemetryServer(
        CollectorRegistry(), status_provider=lambda: {"state": state, "run": state}
    )


def test_default_port_taken_falls_back_to_a_free_port_and_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    first, second = _server("first").start(), _server("second").start()
    try:
        # Both asked for the default port; at most one holds it, the other serves elsewhere.
        assert first.port != second.port and second.port != DEFAULT_PORT
        for server in (first, second):
            with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
                assert response.read() == b"ok\n"
        assert set(live_endpoints()) == {first.url, second.url}
        assert live_endpoints()[0] == second.url  # newest first
        # Nothing at the default address: status finds the newest recorded run.
        monkeypatch.setattr(status_cmd, "DEFAULT_ADDRESS", "http://127.0.0.1:1")
        assert main(["status", "--json", "--timeout-s", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["run"] == "second"
    finally:
        first.stop()
        second.stop()
    assert live_endpoints() == []  # records removed on stop


def test_an_explicit_port_that_is_taken_stays_an_error() -> None:
    holder = TelemetryServer(CollectorRegistry(), port=0).start()
    try:
        with pytest.raises(Exception, match="cannot listen on"):
            TelemetryServer(CollectorRegistry(), port=holder.port).start()
    finally:
        holder.stop()
