"""The controller's start-up states: DISCOVERING, PLANNING and LAUNCHING.

DISCOVERING waits (polling every ``poll_interval_s``) until the usable nodes hold at least
``min_devices`` devices, and on the very first step decides where the run starts: the latest
checkpoint if there is one (a restarted controller), else the seed. PLANNING asks the planner for
a plan on the usable nodes; when none fits it goes back to DISCOVERING to wait for a change.
LAUNCHING starts the worker group and restores its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.control import running
from orchestrator.control.events import EventKind
from orchestrator.control.measure import PlanMeasurements
from orchestrator.control.ports import WorkerLost
from orchestrator.control.recovery import RestoreKind, RestoreSource, with_layer_sources
from orchestrator.control.states import (
    DiscoveringState,
    LaunchingState,
    PlanningState,
    RunningState,
)
from orchestrator.errors import InfeasibleError, TransientError

if TYPE_CHECKING:
    from orchestrator.control.controller import Controller


def discover(c: Controller, s: DiscoveringState) -> None:
    """Wait for enough usable devices, then plan."""
    if s.restore is None:
        s = DiscoveringState(s.since_s, *initial_restore(c))
        c.state = s
    try:
        snap, _ = c.poll()
    except TransientError as exc:
        wait_for_devices(c, s, f"cluster probe failed: {exc}")
        return
    usable = snap.usable(c.excluded_nodes)
    if usable.num_devices < c.config.min_devices:
        wait_for_devices(c, s, f"{usable.num_devices} usable devices, need {c.config.min_devices}")
        return
    if s.waiting_for.startswith("no plan fits") and c.last_infeasible_nodes == usable.node_ids:
        wait_for_devices(c, s, s.waiting_for)  # nothing changed since it did not fit
        return
    assert s.restore is not None
    c.enter(PlanningState(c.now_s(), reason=s.reason, restore=s.restore))


def wait_for_devices(c: Controller, s: DiscoveringState, why: str) -> None:
    """Sleep one poll interval, or fail once the discovery timeout has passed."""
    waited_s = c.now_s() - s.since_s
    if waited_s >= c.config.discovery_timeout_s:
        c.fail(f"waited {waited_s:.0f} s for devices: {why}", s.restore)
        return
    c.state = DiscoveringState(s.since_s, s.reason, s.restore, waiting_for=why)
    c.clock.sleep(c.config.poll_interval_s)


def initial_restore(c: Controller) -> tuple[str, RestoreSource]:
    """Where a new controller starts: the latest checkpoint and its run state, else the seed."""
    ref = c.checkpoints.latest()
    if ref is None:
        return "initial", RestoreSource.fresh()
    meta = ref.manifest.get("meta", ref.manifest)
    assert isinstance(meta, dict)
    c.failure_count = int(meta.get("failure_count", 0))
    c.lost_steps_total = int(meta.get("lost_steps_total", 0))
    c.slowdown_by_node.update(meta.get("slowdown_by_node") or {})
    c.next_step = ref.step
    c.last_checkpoint_step = ref.step
    c.record(
        EventKind.RECOVERY,
        f"controller restart: resuming from the checkpoint at step {ref.step}",
        checkpoint_step=ref.step,
        failure_count=c.failure_count,
    )
    return "restart", RestoreSource.from_checkpoint(ref, next_step=ref.step)


def plan(c: Controller, s: PlanningState) -> None:
    """Choose a plan on the usable nodes and record it with its numbers."""
    try:
        snap, _ = c.poll()
        proposal = c.plan_for(snap)
    except TransientError as exc:
        c.record(EventKind.REPLAN, f"planning deferred: {exc}", error=str(exc))
        c.clock.sleep(c.config.poll_interval_s)
        return
    except InfeasibleError as exc:
        c.last_infeasible_nodes = snap.usable(c.excluded_nodes).node_ids
        c.record(EventKind.REPLAN, f"no plan fits: {exc}", error=str(exc))
        c.enter(DiscoveringState(c.now_s(), s.reason, s.restore, f"no plan fits: {exc}"))
        return
    c.record(
        EventKind.PLAN_CHOSEN,
        f"plan chosen ({s.reason}): {proposal.plan.num_devices} devices, predicted "
        f"{proposal.predicted_step_s:.3f} s/step (bound {proposal.bound_step_s:.3f})",
        reason=s.reason,
        predicted_step_s=proposal.predicted_step_s,
        bound_step_s=proposal.bound_step_s,
        devices=proposal.plan.device_counts(),
        plan=proposal.plan.model_dump(mode="json"),
        slowdown_by_node=c.slowdown_by_node,
    )
    c.enter(LaunchingState(c.now_s(), s.reason, proposal, s.restore))


def launch(c: Controller, s: LaunchingState) -> None:
    """Start the worker group with its restored state; a loss here is a failure like any."""
    restore = with_layer_sources(s.restore, s.proposal.plan.num_layers)
    c.switch_cost.begin(s.since_s)
    try:
        c.workers.launch(s.proposal.plan, restore)
    except (WorkerLost, TransientError) as exc:
        c.stop_workers()
        c.on_failure(exc, restore=s.restore)
        return
    c.proposal = s.proposal
    c.next_step = restore.resume_step
    c.last_lost_steps = restore.lost_steps
    c.lost_steps_total += restore.lost_steps
    # The current step time is the median over the straggler window, so a slowdown the detector
    # confirms is also what the switch rule sees.
    c.measurements = PlanMeasurements(
        s.proposal.predicted_step_s,
        calibration_steps=c.config.calibration_steps,
        recent_window=c.config.straggler_window_steps,
    )
    c.stragglers = running.new_detector(c.config, s.proposal)
    c.record(
        EventKind.PLAN_CHOSEN,
        f"plan launched ({s.reason}) at step {restore.resume_step}, restored from "
        f"{restore.kind}" + (f", {restore.lost_steps} steps lost" if restore.lost_steps else ""),
        reason=s.reason,
        **restore.summary(),
    )
    c.journal.notify(
        "on_plan",
        s.proposal.plan,
        s.proposal.predicted_step_s,
        s.proposal.bound_step_s,
        s.reason,
    )
    if restore.kind is RestoreKind.CHECKPOINT:
        c.journal.notify("on_checkpoint", "load", c.now_s() - s.since_s)
    c.enter(RunningState(c.now_s(), s.reason, s.proposal))
