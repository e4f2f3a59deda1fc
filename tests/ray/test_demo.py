"""``orchestrator demo`` end to end: its own local Ray cluster, a crash, a join, a summary.

The demo starts its own multi-node Ray cluster (it does not use this folder's shared one), so
these tests run it as a separate process, as a user would, and read its ``--json`` summary.
Nothing is faked: real Ray nodes, a real SIGKILL of a node, real torch training on CPUs with
emulated device speeds (which the summary must say).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Short enough for a test, long enough that the join's switch pays (gain > measured cost).
STEPS = 160


def run_demo(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    workdir = tmp_path / "demo"
    cache = tmp_path / "profile-cache"
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "demo", "--json"]
    cmd += ["--workdir", str(workdir), "--profile-cache", str(cache), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    summary = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, summary, proc.stderr


def ray_processes_under(path: str) -> list[str]:
    """Command lines of live processes that mention ``path`` (the demo's Ray temp dir)."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if path in line]


@pytest.mark.slow
def test_demo_survives_a_crash_and_switches_on_a_join(tmp_path: Path) -> None:
    code, summary, stderr = run_demo(tmp_path, "--steps", str(STEPS))
    assert code == 0, stderr[-3000:]
    assert summary["completed"] is True
    assert summary["steps"] == STEPS
    assert summary["state"] == "finished"
    # The crash: recovered, with its lost steps reported (replicas held every layer: none lost).
    crash = summary["crash"]
    assert crash is not None and crash["recovered"] is True
    assert crash["lost_steps"] == 0
    assert crash["crash_to_first_step_s"] > 0
    assert summary["failure_count"] >= 1
    # The join: the controller re-planned onto the new node, and the plan in effect changed.
    join = summary["join"]
    assert join is not None and join["switched"] is True, join
    assert join["numbers"]["gain_s"] > join["numbers"]["switch_cost_s"]
    plans = summary["plans"]
    reasons = [p["reason"] for p in plans]
    assert reasons[0] == "initial" and "failure" in reasons
    assert any(p["reason"] == "join" and "L4" in p["devices"] for p in plans)
    assert plans[0]["devices"] != plans[-1]["devices"]
    # Training did something, and the output says what was emulated.
    assert summary["loss_fell"] is True
    assert summary["last_loss"] < summary["first_loss"]
    assert summary["emulated"] is True
    assert "emulated" in summary["emulation"]
    # Every process the demo started is gone.
    assert summary["ray_temp_dir"]
    assert ray_processes_under(summary["ray_temp_dir"]) == []


@pytest.mark.slow
def test_demo_without_failure_reports_no_crash(tmp_path: Path) -> None:
    code, summary, stderr = run_demo(tmp_path, "--steps", "40", "--no-failure")
    assert code == 0, stderr[-3000:]
    assert summary["completed"] is True
    assert summary["crash"] is None
    assert summary["failure_count"] == 0
    assert summary["lost_steps_total"] == 0
    assert ray_processes_under(summary["ray_temp_dir"]) == []


def test_demo_refuses_too_few_steps(tmp_path: Path) -> None:
    code, summary, stderr = run_demo(tmp_path, "--steps", "5")
    assert code == 2
    assert summary == {}
    assert "--steps" in stderr and "Traceback" not in stderr
