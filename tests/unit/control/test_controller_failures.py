"""Failures in every state, restore-source choice, and the failure budget with backoff,
stepped on fakes with a fake clock (see control_fakes.py)."""

from __future__ import annotations

import pytest
from control_fakes import NUM_LAYERS, make_harness

from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.recovery import RestoreKind
from orchestrator.control.states import FailedState, FinishedState, RecoveringState
from orchestrator.errors import TransientError
from orchestrator.policies import FailurePolicy

THREE_NODES = [("a", "A100-80", 2), ("b", "A100-80", 2), ("c", "L4", 2)]


def _running_at(h, step):
    h.states_until(lambda c: c.next_step == step and c.state.name is ControllerStateName.RUNNING)


def test_node_crash_while_running_restores_from_replicas_without_lost_steps():
    h = make_harness(THREE_NODES, total_steps=20, checkpoint_interval_steps=5)
    _running_at(h, 7)
    h.cluster.kill("b")
    c = h.controller
    assert c.step().name is ControllerStateName.RECOVERING
    assert c.state.lost_nodes == {"b"}
    assert c.step().name is ControllerStateName.PLANNING
    h.states_until(lambda c: c.state.name is ControllerStateName.RUNNING)
    plan, restore = h.workers.launches[-1]
    assert restore.kind is RestoreKind.REPLICAS and restore.resume_step == 7
    assert restore.lost_steps == 0
    assert "b" not in {s.node for r in plan.replicas for s in r.stages}
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}
    recovered = [e for e in c.events if e.kind is EventKind.RECOVERY and "lost_steps" in e.data]
    assert recovered[-1].data["lost_steps"] == 0
    assert recovered[-1].data["recovery_s"] > 0


def test_losing_every_holder_of_a_layer_rolls_back_to_the_checkpoint():
    # One replica on node a: when a dies no survivor holds any layer. A T4 node replaces it.
    h = make_harness([("a", "A100-80", 2)], total_steps=20, checkpoint_interval_steps=5)
    _running_at(h, 13)
    h.cluster.kill("a")
    h.cluster.add("z", "T4", 2)
    assert h.controller.step().name is ControllerStateName.RECOVERING
    h.states_until(lambda c: c.state.name is ControllerStateName.RUNNING)
    _, restore = h.workers.launches[-1]
    assert restore.kind is RestoreKind.CHECKPOINT
    assert (restore.checkpoint_step, restore.resume_step, restore.lost_steps) == (10, 10, 3)
    h.states_until(lambda c: c.done)
    assert h.controller.lost_steps_total == 3
    assert h.workers.steps_run == [*range(13), *range(10, 20)]  # steps 10-12 run twice
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_failure_while_launching_keeps_the_state_read_from_survivors():
    h = make_harness(THREE_NODES, total_steps=20)
    _running_at(h, 6)
    h.cluster.kill("a")
    c = h.controller
    h.states_until(lambda c: c.state.name is ControllerStateName.LAUNCHING)
    h.cluster.kill("c", noticed=False)  # dies before the launch; the probe has not seen it
    assert c.step().name is ControllerStateName.RECOVERING
    assert c.state.restore is not None and c.state.restore.resume_step == 6
    h.states_until(lambda c: c.state.name is ControllerStateName.RUNNING)
    plan, restore = h.workers.launches[-1]
    assert {s.node for r in plan.replicas for s in r.stages} == {"b"}
    assert restore.kind is RestoreKind.REPLICAS and restore.lost_steps == 0
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_failure_while_recovering_counts_both_losses():
    h = make_harness(THREE_NODES, total_steps=20)
    _running_at(h, 4)
    h.cluster.kill("a")
    c = h.controller
    assert c.step().name is ControllerStateName.RECOVERING
    h.cluster.kill("b", noticed=False)  # dies while we read the survivors
    h.workers.fetch_s = 0.0
    # Reading layers from rank 2 (node b) fails; both losses carry into the next recovery.
    assert c.step().name is ControllerStateName.RECOVERING
    assert c.state.lost_nodes == {"a", "b"} and c.failure_count == 2
    h.states_until(lambda c: c.state.name is ControllerStateName.RUNNING)
    plan, restore = h.workers.launches[-1]
    assert {s.node for r in plan.replicas for s in r.stages} == {"c"}
    assert restore.kind is RestoreKind.REPLICAS  # node c held every layer
    h.states_until(lambda c: c.done)
    assert h.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_node_lost_between_planning_and_launching():
    h = make_harness(THREE_NODES, total_steps=10)
    c = h.controller
    c.step()  # -> planning
    c.step()  # -> launching, plan uses a, b, c
    h.cluster.kill("c")
    assert c.step().name is ControllerStateName.RECOVERING
    ((_, restore),) = h.workers.launches
    assert c.state.restore.kind is RestoreKind.FRESH and c.state.restore.resume_step == 0
    assert restore.kind is RestoreKind.FRESH
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState)
    plan, _ = h.workers.launches[-1]
    assert {s.node for r in plan.replicas for s in r.stages} == {"a", "b"}


def test_probe_sees_a_dead_node_before_any_step_fails():
    h = make_harness(THREE_NODES, total_steps=20, poll_interval_s=1.0)
    _running_at(h, 5)
    h.cluster.kill("b")
    h.clock.advance(2.0)  # the next step() polls first
    steps_before = len(h.workers.steps_run)
    assert h.controller.step().name is ControllerStateName.RECOVERING
    assert len(h.workers.steps_run) == steps_before  # no step was attempted
    assert "seen by the cluster probe" in h.controller.state.cause


def test_transient_step_error_without_ranks_recovers_from_replicas():
    h = make_harness(total_steps=10)
    h.workers.step_errors[3] = TransientError("collective timed out")
    h.states_until(lambda c: c.done)
    assert isinstance(h.controller.state, FinishedState)
    assert h.controller.failure_count == 1
    assert h.workers.launches[-1][1].kind is RestoreKind.REPLICAS


def test_repeated_failures_exhaust_the_budget_with_backoff_on_the_clock():
    nodes = [(f"n{i}", "T4", 1) for i in range(6)]
    policy = FailurePolicy(
        max_failures=3, initial_backoff_s=2, backoff_multiplier=3, max_backoff_s=10
    )
    h = make_harness(nodes, total_steps=50, checkpoint_interval_steps=4, failure=policy)
    c = h.controller
    recovery_waits = []
    for victim in ["n0", "n1", "n2"]:
        _running_at(h, c.next_step + 2)
        h.cluster.kill(victim)
        c.step()
        state = c.state
        assert isinstance(state, RecoveringState)
        before = list(h.clock.sleeps)
        c.step()  # read survivors, stop; the backoff is left to wait, outside step()
        assert h.clock.sleeps == before  # a step never sleeps
        recovery_waits.append(round(state.retry_at_s - state.since_s, 6))
        expected = max(0.0, state.retry_at_s - state.since_s - h.workers.fetch_s)
        assert c.wait_s() == pytest.approx(expected)
        if expected > 0:  # still recovering, ready: a node event now is seen at the next step
            assert isinstance(c.state, RecoveringState) and c.state.ready
            h.step()
    assert recovery_waits == [0, 2, 6]  # at once, then 2, 2*3 (cap 10 not reached)
    _running_at(h, c.next_step + 2)
    h.cluster.kill("n3")
    c.step()
    state = c.state
    assert isinstance(state, FailedState)
    assert "failure budget spent: 4 failures, the budget allows 3" in state.reason
    # The survivors' state was saved on the way out: resume without losing a step.
    assert state.checkpoint_step == c.next_step
    assert h.store.saved[state.checkpoint_step][0] == {
        i: tuple(range(c.next_step)) for i in range(NUM_LAYERS)
    }
    failed = c.journal.of_kind(EventKind.FAILED)
    assert failed and f"resume from the checkpoint at step {c.next_step}" in failed[0].message
    assert h.workers.stops >= 4


def test_budget_spent_without_surviving_state_points_to_the_last_checkpoint():
    h = make_harness(
        [("a", "T4", 2)],
        total_steps=30,
        checkpoint_interval_steps=5,
        failure=FailurePolicy(max_failures=0),
    )
    _running_at(h, 12)
    h.cluster.kill("a")
    h.controller.step()
    state = h.controller.state
    assert isinstance(state, FailedState) and state.checkpoint_step == 10


def test_planner_error_while_planning_is_retried_after_a_poll_interval():
    h = make_harness(total_steps=5, poll_interval_s=1.5)
    h.planner.errors.append(TransientError("profile store unreachable"))
    c = h.controller
    c.step()  # -> planning
    assert c.step().name is ControllerStateName.PLANNING
    assert h.clock.sleeps == [] and c.wait_s() == pytest.approx(1.5)  # steps never sleep
    assert c.step().name is ControllerStateName.PLANNING  # too early: unchanged
    h.clock.sleep(c.wait_s())
    assert c.step().name is ControllerStateName.LAUNCHING
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState) and c.failure_count == 0
