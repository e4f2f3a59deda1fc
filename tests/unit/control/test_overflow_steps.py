"""fp16 steps whose update was skipped on an overflow: not committed, reported, run again."""

from __future__ import annotations

from control_fakes import NUM_LAYERS, make_harness

from orchestrator.control.events import EventKind
from orchestrator.control.running import MAX_CONSECUTIVE_OVERFLOWS
from orchestrator.control.states import FailedState, FinishedState


def test_an_overflowed_step_is_reported_and_run_again_not_committed() -> None:
    h = make_harness(total_steps=6, checkpoint_interval_steps=0)
    h.workers.overflows = {2: 2}  # step 2 overflows twice, then goes through
    h.states_until(lambda c: c.done)
    c = h.controller
    assert isinstance(c.state, FinishedState) and c.state.steps == 6
    skipped = [e for e in c.events if e.kind is EventKind.STEP_SKIPPED]
    assert [e.data["step"] for e in skipped] == [2, 2]
    assert [e.data["loss_scale"] for e in skipped] == [2.0**16, 2.0**15]
    assert skipped[-1].data["skipped_total"] == 2
    # Every step's update is applied exactly once: the skipped runs left no trace.
    assert h.final_layer_states() == {layer: tuple(range(6)) for layer in range(NUM_LAYERS)}


def test_overflowing_at_every_scale_fails_the_run_naming_the_cause() -> None:
    h = make_harness(total_steps=6, checkpoint_interval_steps=0)
    h.workers.overflows = {1: 10 * MAX_CONSECUTIVE_OVERFLOWS}
    h.states_until(lambda c: c.done)
    state = h.controller.state
    assert isinstance(state, FailedState)
    assert "not finite at any scale" in state.reason and "bf16" in state.reason
    skipped = [e for e in h.controller.events if e.kind is EventKind.STEP_SKIPPED]
    assert len(skipped) == MAX_CONSECUTIVE_OVERFLOWS
