"""Structured logs of controller decisions, and progress bars that stay quiet off a terminal."""

from __future__ import annotations

import io
import json
import logging

from rich.console import Console
from telemetry_scenario import drive_scripted_run

from orchestrator.telemetry.logs import LogCallback, configure_logging, progress


def test_json_logs_carry_every_decision_with_its_numbers():
    stream = io.StringIO()
    configure_logging(json_format=True, stream=stream)
    try:
        drive_scripted_run(LogCallback("log-run"))
    finally:
        configure_logging(stream=io.StringIO())
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert all(line["run"] == "log-run" for line in lines)
    plans = [line for line in lines if line["msg"].startswith("plan (")]
    assert [p["reason"] for p in plans] == ["initial", "failure"]
    assert plans[1]["predicted_step_s"] == 0.8 and plans[1]["bound_ratio"] == 0.8 / 0.5
    assert plans[1]["devices"] == {"A100": 1}
    recovered = next(line for line in lines if line["msg"] == "recovered")
    assert recovered["recovery_s"] == 4.5 and recovered["lost_steps"] == 2
    assert any(line["level"] == "warning" and line.get("emulated") for line in lines)
    # Steps are debug-level: none at the default INFO level.
    assert not any(line["msg"] == "step" for line in lines)


def test_journal_events_come_out_as_json_fields():
    """The controller's journal logs with extra={"event": {...}}; the JSON keeps its numbers."""
    stream = io.StringIO()
    configure_logging(json_format=True, stream=stream)
    try:
        logging.getLogger("orchestrator.control").warning(
            "failure 1 at step 12",
            extra={
                "event": {
                    "kind": "failure",
                    "time_s": 5.0,
                    "message": "failure 1 at step 12",
                    "step": 12,
                    "lost_nodes": ["v100-0"],
                }
            },
        )
    finally:
        configure_logging(stream=io.StringIO())
    line = json.loads(stream.getvalue())
    assert line["msg"] == "failure 1 at step 12" and line["level"] == "warning"
    assert line["event"] == "failure" and line["step"] == 12 and line["lost_nodes"] == ["v100-0"]
    assert "message" not in line


def test_text_logs_are_readable_key_value_lines():
    stream = io.StringIO()
    configure_logging(level=logging.DEBUG, stream=stream)
    try:
        LogCallback("t").on_recovery("failure", 12.25, 3)
    finally:
        configure_logging(stream=io.StringIO())
    line = stream.getvalue().strip()
    assert "recovered" in line and "recovery_s=12.25" in line and "lost_steps=3" in line


def test_progress_is_quiet_when_output_is_not_a_terminal():
    out = io.StringIO()
    with progress("profiling", total=3, console=Console(file=out, force_terminal=False)) as bar:
        for _ in range(3):
            bar.advance()
    assert out.getvalue() == ""


def test_progress_draws_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with progress("profiling", total=3, console=console) as bar:
        for _ in range(3):
            bar.advance()
    assert "profiling" in out.getvalue() and "100%" in out.getvalue()
