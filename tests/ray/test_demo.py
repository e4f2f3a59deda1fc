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

# Short enough for a test, long enough that the join's switch pays with room to spare: 225 steps
# remain after the join, and the gain per step of adding the two L4s to the T4s left after the
# crash, times that, is many times the measured switch cost (~5-6 s), so a slower machine does
# not flip the decision.
STEPS = 300


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
@pytest.mark.timeout(960)  # past run_demo's own 900 s limit, so that one reports
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
    # The first plan is heterogeneous: both types, uneven batch shares, beside uniform DP.
    assert set(plans[0]["devices"]) == {"A100-80", "T4"}
    shares = {r.split("batch ")[1].split(",")[0] for r in plans[0]["replicas"]}
    assert len(shares) > 1, plans[0]["replicas"]
    uniform = summary["uniform_data_parallel"]
    assert uniform is not None and uniform["uniform_batch_per_worker"] == [12, 12, 12, 12]
    assert uniform["uniform_over_plan"] > 1.0
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


# ---- the summary's arithmetic, on literal data (no Ray) -------------------------------------


def test_summary_reads_plans_recovery_and_join_from_events_and_timeline() -> None:
    from orchestrator.control.events import EventKind, RunEvent
    from orchestrator.demo.scenario import DemoScenario
    from orchestrator.demo.summary import build_summary
    from orchestrator.demo.timeline import PlanLog, Timeline

    t = Timeline(global_batch_size=32)
    for i in range(10):  # 1 step per 0.5 s before the crash at 5.0: 64 samples/s
        t.record(i * 0.5, i)
    replicas = ["replica 0: batch 16, stages [0,6)@A100-80"]
    t.add_plan(0.0, PlanLog(0.0, "initial", {"A100-80": 2}, 0.1994, replicas))
    t.add_plan(9.0, PlanLog(9.0, "failure", {"A100-80": 1, "T4": 2}, 0.25))
    t.crashed_at_s, t.crashed_node, t.crashed_at_step = 5.0, "n1", 10
    t.joined_at_s, t.joined_node, t.joined_at_step = 20.0, "n2", 30
    events = [
        RunEvent(12.0, EventKind.RECOVERY, "recovered",
                 {"recovery_s": 5.5, "lost_steps": 0, "step": 10}),
        RunEvent(21.0, EventKind.REPLAN, "join: gain 25.5 s > 9.5 s",
                 {"trigger": "join", "gain_s": 25.5, "switch_cost_s": 9.5}),
        RunEvent(30.0, EventKind.PLAN_CHOSEN, "overhead", {"switch_cost_s": 8.0}),
    ]  # fmt: skip
    controller = _run_summary(
        "finished", 60, events, first_loss=5.5, last_loss=2.5, emulated=True
    )
    s = build_summary(DemoScenario(steps=60), controller, t, [], Path("/w"), "/tmp/orcX")
    assert s.completed and s.loss_fell
    assert [p.reason for p in s.plans] == ["initial", "failure"]
    assert s.plans[1].devices == {"A100-80": 1, "T4": 2}
    assert s.plans[0].replicas == ["replica 0: batch 16, stages [0,6)@A100-80"]
    assert s.crash is not None and s.crash["crash_to_first_step_s"] == 7.0  # 12.0 - 5.0
    assert s.crash["lost_steps"] == 0
    assert s.join is not None and s.join["switched"] and s.join["join_to_first_step_s"] == 10.0
    # Window [0, 5], its first step left out: steps 1..9 at 0.5..4.5 s, 8 x 32 samples in 4 s.
    assert s.throughput_samples_per_s["initial"] == 64.0
    assert "emulated" in s.emulation


def test_summary_says_not_completed_when_the_run_failed() -> None:
    from orchestrator.demo.scenario import DemoScenario
    from orchestrator.demo.summary import build_summary
    from orchestrator.demo.timeline import Timeline

    controller = _run_summary("failed", 12, reason="failure budget spent")
    s = build_summary(DemoScenario(steps=60), controller, Timeline(16), [], Path("/w"))
    assert not s.completed
    assert s.to_json()["completed"] is False


def _run_summary(state: str, steps: int, events=(), **figures):
    """A controller's summary with the given figures (the rest empty)."""
    from orchestrator.control.events import ControllerStateName
    from orchestrator.runtime.elastic.summary import RunSummary

    base = dict(
        reason="", steps_run=steps, first_loss=None, last_loss=None, mean_step_s=0.0,
        step_indices=(), losses=(), emulated=False, failure_count=0, lost_steps_total=0,
        recoveries=(), switch_costs_s=(), checkpoint_step=None, checkpoint_path="",
    )  # fmt: skip
    base.update(figures)
    return RunSummary(state=ControllerStateName(state), steps=steps, events=tuple(events), **base)
