"""Joins, stragglers and preemption notices, stepped on fakes with a fake clock
(see control_fakes.py: its worker group takes batch / speed seconds per step, like its planner
predicts, so the calibration is 1 unless a node is throttled)."""

from __future__ import annotations

import pytest
from control_fakes import NUM_LAYERS, SPEEDS, FakePlanner, make_harness

from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.recovery import RestoreKind
from orchestrator.control.states import FinishedState, ResizingState
from orchestrator.policies import PreemptionPolicy

RUNNING = ControllerStateName.RUNNING


def _nodes_of(plan):
    return {s.node for r in plan.replicas for s in r.stages}


def _running_at(h, step):
    h.states_until(lambda c: c.next_step == step and c.state.name is RUNNING)


def test_join_switches_when_the_gain_over_the_remaining_steps_beats_the_switch_cost():
    # One T4 (speed 1): 16 s/step. Two A100s join: candidate max(2/1, 14/8) = 2 s/step.
    h = make_harness([("t", "T4", 1)], total_steps=50, checkpoint_interval_steps=0)
    _running_at(h, 5)
    h.cluster.add("big", "A100-80", 2)
    h.clock.advance(1.0)  # the next step() polls
    c = h.controller
    assert isinstance(h.step(), ResizingState)
    (decision,) = c.journal.of_kind(EventKind.REPLAN)
    # gain = (16 - 2) x 45 remaining = 630 s; cost = the initial launch's measured 2 s
    assert decision.data["gain_s"] == pytest.approx(630.0)
    assert decision.data["switch_cost_s"] == pytest.approx(2.0)
    assert h.step().name is ControllerStateName.LAUNCHING
    assert h.step().name is RUNNING
    plan, restore = h.workers.launches[-1]
    assert _nodes_of(plan) == {"t", "big"}
    assert (restore.kind, restore.resume_step, restore.lost_steps) == (RestoreKind.REPLICAS, 5, 0)
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(50)) for i in range(NUM_LAYERS)}
    assert len(c.switch_cost.observations_s) == 2  # the first launch and the switch


def test_join_near_the_end_keeps_the_plan_and_logs_the_numbers():
    # Two T4 replicas, 8 s/step; a third T4 gives 16/3 -> 6 s/step (batches 6, 5, 5).
    h = make_harness([("t1", "T4", 1), ("t2", "T4", 1)], total_steps=12)
    h.workers.launch_s = 30.0  # a slow launch: the measured switch cost is ~30 s
    _running_at(h, 10)
    h.cluster.add("t3", "T4", 1)
    h.clock.advance(1.0)
    c = h.controller
    assert h.step().name is RUNNING  # decided, then trained one step
    (skipped,) = c.journal.of_kind(EventKind.REPLAN_SKIPPED)
    # gain = (8 - 6) x 2 steps left = 4 s <= 30 s
    assert skipped.data["gain_s"] == pytest.approx(4.0)
    assert skipped.data["switch_cost_s"] == pytest.approx(30.0)
    assert "keeping the plan" in skipped.message
    h.states_until(lambda c: c.done)
    assert len(h.workers.launches) == 1


def test_worker_lost_while_resizing_goes_to_recovery_without_losing_steps():
    h = make_harness([("a", "A100-80", 2), ("b", "L4", 2)], total_steps=30)
    _running_at(h, 6)
    h.cluster.add("c", "A100-80", 2)
    h.clock.advance(1.0)
    assert isinstance(h.step(), ResizingState)
    h.cluster.kill("a", noticed=False)
    assert h.step().name is ControllerStateName.RECOVERING
    h.states_until(lambda c: c.state.name is RUNNING)
    plan, restore = h.workers.launches[-1]
    assert "a" not in _nodes_of(plan) and restore.kind is RestoreKind.REPLICAS
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(30)) for i in range(NUM_LAYERS)}


def test_a_node_joining_during_recovery_is_in_the_new_plan():
    h = make_harness([("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=20)
    _running_at(h, 8)
    h.cluster.kill("b")
    c = h.controller
    assert h.step().name is ControllerStateName.RECOVERING
    h.cluster.add("l4", "L4", 1)
    h.states_until(lambda c: c.state.name is RUNNING)
    plan, restore = h.workers.launches[-1]
    assert _nodes_of(plan) == {"a", "l4"}
    assert restore.resume_step == 8 and restore.lost_steps == 0
    assert not c.journal.of_kind(EventKind.REPLAN_SKIPPED)  # no second re-plan for the join
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_persistent_straggler_is_replanned_with_its_measured_speed():
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=80, checkpoint_interval_steps=0
    )
    _running_at(h, 10)
    h.workers.throttle["b"] = 3.0  # thermal throttling: node b runs 3x slower from now on
    h.states_until(lambda c: c.journal.of_kind(EventKind.STRAGGLER))
    straggler = h.controller.journal.of_kind(EventKind.STRAGGLER)[0]
    assert straggler.data["node"] == "b"
    assert straggler.data["slowdown_factor"] == pytest.approx(3.0)
    _, slowdown = h.planner.calls[-1]
    assert slowdown == {"b": pytest.approx(3.0)}
    # Candidate: b at speed 8/3 gets 4 of 16 samples, a gets 12: 1.5 s/step against 3 s now.
    (replan,) = h.controller.journal.of_kind(EventKind.REPLAN)
    assert replan.data["current_step_s"] == pytest.approx(3.0)
    assert replan.data["candidate_predicted_step_s"] == pytest.approx(1.5)
    assert isinstance(h.controller.state, ResizingState)
    h.states_until(lambda c: c.done)
    plan, restore = h.workers.launches[-1]
    assert [r.batch_size for r in plan.replicas] == [12, 4]
    assert restore.lost_steps == 0
    # One detection (both of b's stages, at one moment); the new plan does not re-trigger.
    stragglers = h.controller.journal.of_kind(EventKind.STRAGGLER)
    assert [(e.data["node"], e.data["stage"]) for e in stragglers] == [("b", 0), ("b", 1)]
    assert len({e.time_s for e in stragglers}) == 1
    assert h.final_layer_states() == {i: tuple(range(80)) for i in range(NUM_LAYERS)}


def test_a_throttled_node_that_speeds_up_again_is_given_its_work_back():
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=120, checkpoint_interval_steps=0
    )
    _running_at(h, 10)
    h.workers.throttle["b"] = 3.0
    h.states_until(lambda c: len(h.workers.launches) == 2 and c.state.name is RUNNING)
    assert [r.batch_size for r in h.workers.launches[-1][0].replicas] == [12, 4]
    assert h.controller.journal.of_kind(EventKind.SPEEDUP) == []  # still slow: nothing sped up
    for _ in range(10):  # b stays slow under the new plan: no flapping either way
        h.step()
    assert len(h.workers.launches) == 2
    h.workers.throttle["b"] = 1.0  # cooled down
    h.states_until(lambda c: len(h.workers.launches) == 3 and c.state.name is RUNNING)
    (speedup,) = h.controller.journal.of_kind(EventKind.SPEEDUP)[:1]
    assert speedup.data["node"] == "b"
    assert speedup.data["factor"] == pytest.approx(1 / 3)
    assert h.controller.ledger.slowdown_by_node == {}  # back to full speed: planned as such
    _, slowdown = h.planner.calls[-1]
    assert slowdown == {}
    replans = h.controller.journal.of_kind(EventKind.REPLAN)
    assert [e.data["trigger"] for e in replans] == ["straggler", "speedup"]
    plan, restore = h.workers.launches[-1]
    assert [r.batch_size for r in plan.replicas] == [8, 8]
    assert restore.lost_steps == 0
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(120)) for i in range(NUM_LAYERS)}


def test_one_slow_step_is_not_a_straggler():
    h = make_harness(total_steps=30)
    h.workers.before_step = lambda step: h.workers.throttle.update({"b": 5.0 if step == 12 else 1})
    h.states_until(lambda c: c.done)
    assert not h.controller.journal.of_kind(EventKind.STRAGGLER)


def test_preemption_notice_evacuates_before_the_deadline_without_lost_steps():
    h = make_harness([("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=20)
    _running_at(h, 9)
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 30.0)
    h.clock.advance(1.0)
    c = h.controller
    assert h.step().name is ControllerStateName.RESIZING
    notice = [
        e for e in c.journal.of_kind(EventKind.PREEMPTION_NOTICE) if "evacuating" in e.message
    ]
    assert notice and notice[0].data["slack_s"] == pytest.approx(29.0)
    assert h.step().name is ControllerStateName.PLANNING  # state read, old group stopped
    h.states_until(lambda c: c.state.name is RUNNING)
    assert h.clock.now_s() < h.cluster.draining["b"]  # all of it before the deadline
    plan, restore = h.workers.launches[-1]
    assert _nodes_of(plan) == {"a"}
    assert (restore.kind, restore.lost_steps, restore.resume_step) == (RestoreKind.REPLICAS, 0, 9)
    assert c.failure_count == 0
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_notice_seen_after_its_deadline_is_treated_as_a_failure():
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)],
        total_steps=20,
        preemption=PreemptionPolicy(safety_margin_s=5.0),
    )
    _running_at(h, 4)
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 4.0)  # inside the 5 s safety margin
    h.clock.advance(1.0)
    c = h.controller
    assert h.step().name is ControllerStateName.RECOVERING
    assert c.failure_count == 1 and "preemption deadline passed" in c.state.cause
    assert any("passed" in e.message for e in c.journal.of_kind(EventKind.PREEMPTION_NOTICE))
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState)
    assert h.controller.lost_steps_total == 0  # node a held every layer


def test_deadline_passing_during_evacuation_falls_back_to_the_checkpoint():
    # One replica across two nodes: layers 0-1 on a, 2-3 on b. b drains with a short deadline
    # and reading its state takes longer than that: b's layers exist nowhere else.
    h = make_harness(
        [("a", "A100-80", 1), ("b", "A100-80", 1)], total_steps=20, checkpoint_interval_steps=5
    )
    h.planner.one_pipeline = True
    _running_at(h, 12)
    assert [s.node for s in h.workers.plan.replicas[0].stages] == ["a", "b"]
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 2.0)
    h.cluster.add("c", "L4", 1)  # a replacement is already there
    h.workers.fetch_s = 3.0
    h.clock.advance(1.0)
    c = h.controller
    assert h.step().name is ControllerStateName.RESIZING
    assert h.step().name is ControllerStateName.RECOVERING  # b died at the deadline mid-read
    h.states_until(lambda c: c.state.name is RUNNING)
    plan, restore = h.workers.launches[-1]
    assert [s.node for s in plan.replicas[0].stages] == ["a", "c"]
    assert (restore.kind, restore.checkpoint_step, restore.lost_steps) == (
        RestoreKind.CHECKPOINT,
        10,
        2,
    )
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


class _EstimatingPlanner(FakePlanner):
    """The fake planner, also costing a given plan the way it costs its own."""

    def estimate(self, plan, snapshot, slowdown_by_node):
        speed = {n.node_id: SPEEDS[n.device_type] * n.num_devices for n in snapshot.nodes}
        return max(
            r.batch_size / speed[r.stages[0].node] * slowdown_by_node.get(r.stages[0].node, 1.0)
            for r in plan.replicas
        )


@pytest.mark.parametrize("estimating", [True, False])
def test_after_a_speed_up_the_running_plan_is_costed_again_for_the_switch_rule(estimating):
    # Both runs see a host hiccup right after the straggler re-plan: the launch's calibration
    # says the model is 2x too optimistic. Costing the running plan again under today's speeds
    # (what an estimating planner allows) still switches; the launch's calibration alone does not.
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=120, checkpoint_interval_steps=0
    )
    if estimating:
        h.controller.ctx.planner = h.planner = _EstimatingPlanner()
    _running_at(h, 10)
    h.workers.throttle["b"] = 3.0
    h.states_until(lambda c: len(h.workers.launches) == 2 and c.state.name is RUNNING)
    for _ in range(10):
        h.step()
    measured = h.controller.ledger.measurements
    measured._calibration_samples[:] = [2.0 * measured.predicted_step_s] * 3
    h.workers.throttle["b"] = 1.0
    h.states_until(lambda c: c.journal.of_kind(EventKind.SPEEDUP))
    h.states_until(
        lambda c: c.journal.of_kind(EventKind.REPLAN_SKIPPED) or len(h.workers.launches) == 3
    )
    if estimating:
        (replan,) = h.controller.journal.of_kind(EventKind.REPLAN)[1:]
        # Running plan [12, 4] at full speed costs 12 / 8 = 1.5 s, as measured: calibration 1.
        assert replan.data["calibration"] == pytest.approx(1.0)
        h.states_until(lambda c: len(h.workers.launches) == 3)
        assert [r.batch_size for r in h.workers.launches[-1][0].replicas] == [8, 8]
    else:
        (skipped,) = h.controller.journal.of_kind(EventKind.REPLAN_SKIPPED)
        assert skipped.data["calibration"] == pytest.approx(2.0)
