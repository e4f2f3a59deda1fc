"""The run's progress as the driver and the demo read it: a plan's lines precede its typed
update, and the one-per-step lines can be left out by flag, so no reader parses the lines."""

from __future__ import annotations

from orchestrator.control.events import PlanReason
from orchestrator.runtime.elastic.session import ProgressLines
from orchestrator.runtime.elastic.updates import PlanApplied, StepDone
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.reports import StepReport


def _plan() -> Plan:
    stage = StageSpec(layers=(0, 4), device_type="T4")
    replica = ReplicaSpec(batch_size=4, stages=(stage,))
    return Plan(global_batch_size=4, microbatch_size=2, replicas=(replica,))


def test_a_plans_lines_are_there_once_its_update_is_seen() -> None:
    progress = ProgressLines(total_steps=3)
    progress.on_plan(_plan(), 0.5, 0.4, PlanReason.INITIAL)
    updates, _ = progress.updates_since(0)
    (applied,) = updates
    assert isinstance(applied, PlanApplied) and applied.reason is PlanReason.INITIAL
    lines, cursor = progress.since(0)
    assert lines[0].startswith("plan (planner): T4 x1") and "[initial]" in lines[0]
    assert cursor == len(lines) >= 2  # the header and one line per replica


def test_step_lines_are_left_out_by_flag_and_the_cursor_still_moves_past_them() -> None:
    progress = ProgressLines(total_steps=3)
    progress.on_plan(_plan(), 0.5, 0.4, PlanReason.INITIAL)
    start = len(progress.since(0)[0])
    progress.on_step(StepReport(0, 2.5, 0.5, 4), 0.5)
    progress.on_step(StepReport(1, 2.4, 0.5, 4, eval_loss=2.6, eval_after_steps=2), 0.5)
    every, end = progress.since(start)
    assert [line.split()[0] for line in every] == ["step", "step", "eval"]
    without, end_without = progress.since(start, steps=False)
    assert without == [every[2]] and end_without == end
    assert progress.since(end, steps=False) == ([], end)
    kinds = [type(u) for u in progress.updates_since(0)[0]]
    assert kinds == [PlanApplied, StepDone, StepDone]
