"""The controller stepped one transition at a time on fakes and a fake clock (no Ray here:
see control_fakes.py; the Ray adapters are tested on real local clusters in tests/ray)."""

from __future__ import annotations

import json
import logging

from control_fakes import NUM_LAYERS, FakeCheckpointStore, make_harness

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.recovery import RestoreKind
from orchestrator.control.states import DiscoveringState, FailedState, FinishedState
from orchestrator.errors import InfeasibleError


class Recorder(ControllerCallback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_state(self, state):
        self.calls.append(("state", state))

    def on_plan(self, plan, predicted_step_s, bound_step_s, reason):
        self.calls.append(("plan", reason))

    def on_step(self, report, predicted_step_s):
        self.calls.append(("step", report.step))

    def on_checkpoint(self, operation, duration_s):
        self.calls.append(("checkpoint", operation))

    def on_devices(self, alive_by_type, draining_by_type):
        self.calls.append(("devices", dict(alive_by_type)))

    def on_emulated(self, emulated):
        self.calls.append(("emulated", emulated))


class Broken(ControllerCallback):
    def on_step(self, report, predicted_step_s):
        raise RuntimeError("exporter down")

    def on_event(self, event):
        raise ValueError("bad label")


def test_happy_path_goes_discovering_planning_launching_running_finished():
    h = make_harness(total_steps=12, checkpoint_interval_steps=5)
    c = h.controller
    assert c.state.name is ControllerStateName.DISCOVERING
    assert [str(h.step().name) for _ in range(3)] == ["planning", "launching", "running"]
    h.states_until(lambda c: c.done)
    assert isinstance(c.state, FinishedState) and c.state.steps == 12
    assert h.workers.steps_run == list(range(12))
    assert sorted(h.store.saved) == [5, 10, 12]  # every 5 steps, and at the end
    assert h.final_layer_states() == {layer: tuple(range(12)) for layer in range(NUM_LAYERS)}
    assert h.workers.stops == 1
    ((_launched_plan, restore),) = h.workers.launches
    assert restore.kind is RestoreKind.FRESH and restore.resume_step == 0
    assert [e.kind for e in c.events].count(EventKind.FINISHED) == 1


def test_callbacks_hear_states_plans_steps_and_checkpoints():
    recorder = Recorder()
    h = make_harness(total_steps=6, checkpoint_interval_steps=3, callbacks=(recorder,))
    h.states_until(lambda c: c.done)
    states = [a for kind, a in recorder.calls if kind == "state"]
    assert states == ["planning", "launching", "running", "finished"]
    assert ("plan", "initial") in recorder.calls
    assert [a for kind, a in recorder.calls if kind == "step"] == list(range(6))
    assert [a for kind, a in recorder.calls if kind == "checkpoint"] == ["save", "save"]
    assert ("devices", {"A100-80": 4}) in recorder.calls
    assert ("emulated", False) in recorder.calls


def test_a_raising_callback_never_fails_the_run(caplog):
    h = make_harness(total_steps=5, callbacks=(Broken(), Recorder()))
    with caplog.at_level(logging.ERROR, logger="orchestrator.control"):
        h.states_until(lambda c: c.done)
    assert isinstance(h.controller.state, FinishedState)
    assert h.controller.journal.callback_errors >= 5
    assert any("Broken.on_step raised" in r.getMessage() for r in caplog.records)


def test_every_event_is_logged_with_a_json_able_extra(caplog):
    h = make_harness(total_steps=5)
    with caplog.at_level(logging.INFO, logger="orchestrator.control"):
        h.states_until(lambda c: c.done)
    logged = [r.event for r in caplog.records if hasattr(r, "event") and "time_s" in r.event]
    assert len(logged) == len(h.controller.events)
    for record in logged:
        json.dumps(record)  # raises if not JSON-able
    plan_chosen = next(r for r in logged if r["kind"] == "plan_chosen")
    assert plan_chosen["predicted_step_s"] > 0 and plan_chosen["devices"] == {"A100-80": 4}


def test_waits_for_minimum_devices_then_plans_when_a_node_joins():
    h = make_harness([("a", "T4", 1)], min_devices=2, poll_interval_s=1.0)
    c = h.controller
    for _ in range(3):
        assert isinstance(h.step(), DiscoveringState)
    assert c.state.waiting_for == "1 usable devices, need 2"
    assert h.clock.sleeps == [1.0, 1.0, 1.0]  # one poll interval between looks
    h.cluster.add("b", "T4", 1)
    assert h.step().name is ControllerStateName.PLANNING


def test_gives_up_waiting_for_devices_after_the_discovery_timeout():
    h = make_harness([("a", "T4", 1)], min_devices=4, poll_interval_s=10, discovery_timeout_s=35)
    h.states_until(lambda c: c.done)
    state = h.controller.state
    assert isinstance(state, FailedState)
    assert "waited 40 s for devices: 1 usable devices, need 4" in state.reason
    assert state.checkpoint_step is None


def test_no_plan_fits_waits_for_a_change_then_plans():
    h = make_harness([("a", "T4", 1)])
    h.planner.errors.append(InfeasibleError("model needs 40 GiB, T4 has 15 GiB", field="model"))
    c = h.controller
    h.step()  # discovering -> planning
    assert h.step().name is ControllerStateName.DISCOVERING  # no plan fits
    assert "no plan fits" in c.state.waiting_for
    calls = len(h.planner.calls)
    h.step()  # same nodes: wait a poll interval, do not ask the planner again
    assert len(h.planner.calls) == calls and c.state.name is ControllerStateName.DISCOVERING
    h.cluster.add("b", "A100-80", 2)
    assert h.step().name is ControllerStateName.PLANNING
    assert h.step().name is ControllerStateName.LAUNCHING


def test_probe_errors_while_discovering_are_retried():
    h = make_harness()
    h.cluster.probe_errors = 2
    c = h.controller
    assert h.step().name is ControllerStateName.DISCOVERING
    assert "probe failed" in c.state.waiting_for
    h.step()
    assert h.step().name is ControllerStateName.PLANNING


def test_controller_restart_resumes_from_the_checkpoint_and_run_state():
    store = FakeCheckpointStore()
    first = make_harness(total_steps=20, checkpoint_interval_steps=5, store=store)
    first.states_until(lambda c: c.next_step == 13)
    first.controller.ledger.failure_count = 2  # as if two failures had happened
    first.states_until(lambda c: c.next_step == 16)  # checkpoint at 15 carries the run state
    # The driver dies here. A new controller on the same store and cluster takes over.
    second = make_harness(total_steps=20, checkpoint_interval_steps=5, store=store)
    c = second.controller
    second.states_until(lambda c: c.state.name is ControllerStateName.RUNNING)
    ((_, restore),) = second.workers.launches
    assert restore.kind is RestoreKind.CHECKPOINT and restore.checkpoint_step == 15
    assert c.next_step == 15 and c.failure_count == 2
    assert any("controller restart" in e.message for e in c.events)
    second.states_until(lambda c: c.done)
    assert second.workers.steps_run == list(range(15, 20))
    assert second.final_layer_states() == {i: tuple(range(20)) for i in range(NUM_LAYERS)}


def test_a_failed_checkpoint_save_is_recorded_and_training_goes_on():
    h = make_harness(total_steps=8, checkpoint_interval_steps=4)
    h.store.fail_saves = 1
    h.states_until(lambda c: c.done)
    assert isinstance(h.controller.state, FinishedState)
    assert any("failed: No space left" in e.message for e in h.controller.events)
    assert sorted(h.store.saved) == [8]


def test_a_bug_in_the_step_fails_the_run_with_the_error_and_the_checkpoint():
    h = make_harness(total_steps=20, checkpoint_interval_steps=5)
    h.workers.step_errors[7] = ZeroDivisionError("division by zero in the loss")
    h.states_until(lambda c: c.done)
    state = h.controller.state
    assert isinstance(state, FailedState)
    assert state.reason == "step 7 raised ZeroDivisionError: division by zero in the loss"
    assert state.checkpoint_step == 7  # the last committed step, read from the workers
    assert h.controller.failure_count == 0  # not a node failure: no retry
