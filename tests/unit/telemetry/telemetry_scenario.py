"""Shared pieces of the telemetry tests: two small plans and a scripted run through the hooks."""

from __future__ import annotations

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName, EventKind, RunEvent
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import MemoryUse, StageTiming, StepReport

State = ControllerStateName


def two_type_plan() -> Plan:
    """Replica 0: A100 -> L4 pipeline; replica 1: one A100 stage (tp 2). 4 devices in all."""
    return Plan(
        global_batch_size=16,
        microbatch_size=2,
        replicas=[
            {
                "batch_size": 10,
                "stages": [
                    {"layers": [0, 6], "device_type": "A100"},
                    {"layers": [6, 10], "device_type": "L4"},
                ],
            },
            {"batch_size": 6, "stages": [{"layers": [0, 10], "device_type": "A100", "tp": 2}]},
        ],
    )


def a100_only_plan() -> Plan:
    """After the L4 node is lost: one replica, one A100 stage."""
    return Plan(
        global_batch_size=16,
        microbatch_size=2,
        replicas=[{"batch_size": 16, "stages": [{"layers": [0, 10], "device_type": "A100"}]}],
    )


def step_report(
    step: int, step_s: float, *, two_stages: bool = True, eval_loss: float | None = None
) -> StepReport:
    # The A100 stage counts its memory (worker/memory_account.py); the L4 stage does not.
    memory = MemoryUse(400, 400, 800, 1000, 500, 2)
    timings = [StageTiming(0, 0, "A100", compute_s=0.6 * step_s, step_s=step_s, memory=memory)]
    if two_stages:
        timings.append(StageTiming(0, 1, "L4", compute_s=0.9 * step_s, step_s=step_s))
    return StepReport(
        step=step,
        loss=3.0 / step,
        step_duration_s=step_s,
        samples=16,
        stage_timings=tuple(timings),
        eval_loss=eval_loss,
        eval_after_steps=None if eval_loss is None else step + 1,
    )


def drive_scripted_run(callback: ControllerCallback) -> None:
    """A run as the controller reports it: plan, 3 steps (checkpoint after 1), L4 node lost,
    recovery from the checkpoint, steps 2 and 3 again, done.

    Figures: initial predicted 0.5 s vs bound 0.4 s (ratio 1.25); after the loss 0.8 s vs 0.5 s
    (ratio 1.6). Recovery took 4.5 s and lost 2 steps (steps 2 and 3 redone).
    """
    callback.on_emulated(True)
    callback.on_state(State.DISCOVERING)
    callback.on_devices({"A100": 3, "L4": 1}, {})
    callback.on_state(State.PLANNING)
    callback.on_plan(two_type_plan(), 0.5, 0.4, "initial")
    callback.on_event(
        RunEvent(
            0.1,
            EventKind.PLAN_CHOSEN,
            "plan chosen",
            {"predicted_step_s": 0.5, "bound_step_s": 0.4},
        )
    )
    callback.on_state(State.RUNNING)
    for step in (1, 2, 3):
        # Step 2 carries a validation loss (training.eval_every); later steps do not.
        callback.on_step(step_report(step, 0.55, eval_loss=2.5 if step == 2 else None), 0.5)
        if step == 1:
            callback.on_checkpoint("save", 0.2)
    callback.on_devices({"A100": 3}, {})
    callback.on_event(RunEvent(2.0, EventKind.NODE_LOST, "node lost", {"node": "l4-0"}))
    callback.on_state(State.RECOVERING)
    callback.on_checkpoint("load", 0.3)
    callback.on_plan(a100_only_plan(), 0.8, 0.5, "failure")
    callback.on_event(RunEvent(3.0, EventKind.REPLAN, "re-planned", {"reason": "failure"}))
    callback.on_state(State.RUNNING)
    for step in (2, 3):
        callback.on_step(step_report(step, 0.85, two_stages=False), 0.8)
    callback.on_recovery("failure", 4.5, 2)
    callback.on_event(
        RunEvent(6.5, EventKind.RECOVERY, "recovered", {"recovery_s": 4.5, "lost_steps": 2})
    )
    callback.on_state(State.FINISHED)
