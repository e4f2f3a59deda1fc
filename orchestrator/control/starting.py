"""The controller's start-up states: DISCOVERING, PLANNING and LAUNCHING.

DISCOVERING waits (looking again every ``poll_interval_s``) until the usable nodes hold at least
``min_devices`` devices, and on the very first step decides where the run starts: the latest
checkpoint if there is one (a restarted controller), else the seed. PLANNING asks the planner for
a plan on the usable nodes; when none fits it goes back to DISCOVERING to wait for a change.
LAUNCHING starts the worker group and restores its state. Each handler returns the next state.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.control.context import RunContext
from orchestrator.control.events import EventKind, PlanReason
from orchestrator.control.measure import PlanMeasurements
from orchestrator.control.ports import PlanProposal, ReportsReform, WorkerLost
from orchestrator.control.recovery import RestoreKind, RestoreSource, with_layer_sources
from orchestrator.control.states import (
    ControllerState,
    DiscoveringState,
    LaunchingState,
    PlanningState,
    RunningState,
)
from orchestrator.errors import InfeasibleError, TransientError
from orchestrator.policies.straggler import StragglerDetector


def discover(ctx: RunContext, s: DiscoveringState) -> ControllerState:
    """Wait for enough usable devices, then plan."""
    if s.restore is None:
        reason, restore = initial_restore(ctx)
        s = replace(s, reason=reason, restore=restore)
    if ctx.now_s() < s.retry_at_s:
        return s
    try:
        snap, _ = ctx.poll()
    except TransientError as exc:
        return wait_for_devices(ctx, s, f"cluster probe failed: {exc}")
    usable = snap.usable(ctx.ledger.excluded_nodes)
    if usable.num_devices < ctx.config.min_devices:
        why = f"{usable.num_devices} usable devices, need {ctx.config.min_devices}"
        return wait_for_devices(ctx, s, why)
    infeasible = ctx.ledger.last_infeasible_nodes
    if s.waiting_for.startswith("no plan fits") and infeasible == usable.node_ids:
        return wait_for_devices(ctx, s, s.waiting_for)  # nothing changed since it did not fit
    assert s.restore is not None
    return PlanningState(ctx.now_s(), reason=s.reason, restore=s.restore)


def wait_for_devices(ctx: RunContext, s: DiscoveringState, why: str) -> ControllerState:
    """Look again one poll interval from now, or fail once the discovery timeout has passed."""
    now_s = ctx.now_s()
    waited_s = now_s - s.since_s
    if waited_s >= ctx.config.discovery_timeout_s:
        return ctx.fail(f"waited {waited_s:.0f} s for devices: {why}", s.restore)
    return replace(s, waiting_for=why, retry_at_s=now_s + ctx.config.poll_interval_s)


def initial_restore(ctx: RunContext) -> tuple[PlanReason, RestoreSource]:
    """Where a new controller starts: the latest checkpoint and its run state, else the seed."""
    ref = ctx.checkpoints.latest()
    if ref is None:
        return PlanReason.INITIAL, RestoreSource.fresh()
    meta = ref.manifest.get("meta", ref.manifest)
    assert isinstance(meta, dict)
    led = ctx.ledger
    led.failure_count = int(meta.get("failure_count", 0))
    led.lost_steps_total = int(meta.get("lost_steps_total", 0))
    led.slowdown_by_node.update(meta.get("slowdown_by_node") or {})
    led.next_step = ref.step
    led.last_checkpoint_step = ref.step
    ctx.record(
        EventKind.RECOVERY,
        f"controller restart: resuming from the checkpoint at step {ref.step}",
        checkpoint_step=ref.step,
        failure_count=led.failure_count,
    )
    return PlanReason.RESTART, RestoreSource.from_checkpoint(ref, next_step=ref.step)


def plan(ctx: RunContext, s: PlanningState) -> ControllerState:
    """Choose a plan on the usable nodes and record it with its numbers."""
    if ctx.now_s() < s.retry_at_s:
        return s
    try:
        snap, _ = ctx.poll()
        proposal = ctx.plan_for(snap)
    except TransientError as exc:
        ctx.record(EventKind.REPLAN, f"planning deferred: {exc}", error=str(exc))
        return replace(s, retry_at_s=ctx.now_s() + ctx.config.poll_interval_s)
    except InfeasibleError as exc:
        ctx.ledger.last_infeasible_nodes = snap.usable(ctx.ledger.excluded_nodes).node_ids
        ctx.record(EventKind.REPLAN, f"no plan fits: {exc}", error=str(exc))
        return DiscoveringState(ctx.now_s(), s.reason, s.restore, f"no plan fits: {exc}")
    ctx.record(
        EventKind.PLAN_CHOSEN,
        f"plan chosen ({s.reason}): {proposal.plan.num_devices} devices, predicted "
        f"{proposal.predicted_step_s:.3f} s/step (bound {proposal.bound_step_s:.3f})",
        reason=s.reason,
        predicted_step_s=proposal.predicted_step_s,
        bound_step_s=proposal.bound_step_s,
        devices=proposal.plan.device_counts(),
        plan=proposal.plan.model_dump(mode="json"),
        slowdown_by_node=ctx.ledger.slowdown_by_node,
    )
    return LaunchingState(ctx.now_s(), s.reason, proposal, s.restore)


def launch(ctx: RunContext, s: LaunchingState) -> ControllerState:
    """Start the worker group with its restored state; a loss here is a failure like any."""
    led = ctx.ledger
    restore = with_layer_sources(s.restore, s.proposal.plan.num_layers)
    led.switch_cost.begin(s.since_s)
    try:
        ctx.workers.launch(s.proposal.plan, restore)
    except (WorkerLost, TransientError) as exc:
        ctx.stop_workers()
        # State that was kept in the workers is gone with them: recovery looks again.
        held = s.restore.kind is RestoreKind.REPLICAS and not s.restore.states
        return ctx.on_failure(exc, s.name, restore=None if held else s.restore)
    led.proposal = s.proposal
    led.next_step = restore.resume_step
    led.last_lost_steps = restore.lost_steps
    led.lost_steps_total += restore.lost_steps
    # The current step time is the median over the straggler window, so a slowdown the detector
    # confirms is also what the switch rule sees.
    led.measurements = PlanMeasurements(
        s.proposal.predicted_step_s,
        calibration_steps=ctx.config.calibration_steps,
        recent_window=ctx.config.straggler_window_steps,
    )
    led.stragglers = new_detector(ctx, s.proposal)
    moved = ctx.workers.last_reform if isinstance(ctx.workers, ReportsReform) else None
    led.switch_cost.launched(in_place=moved is not None and moved.actors_started == 0)
    ctx.record(
        EventKind.PLAN_CHOSEN,
        f"plan launched ({s.reason}) at step {restore.resume_step}, restored from "
        f"{restore.kind}"
        + (f", {restore.lost_steps} steps lost" if restore.lost_steps else "")
        + (f"; re-formed in place: {moved.line()}" if moved is not None else ""),
        reason=s.reason,
        bytes_moved=None if moved is None else moved.bytes_moved,
        actors_started=None if moved is None else moved.actors_started,
        actors_warm=None if moved is None else moved.actors_warm,
        **{f"reform_{k}": float(v) for k, v in ((moved.seconds if moved else None) or {}).items()},
        **restore.summary(),
    )
    p = s.proposal
    ctx.journal.notify(
        "on_plan",
        lambda cb: cb.on_plan(p.plan, p.predicted_step_s, p.bound_step_s, s.reason),
    )
    if restore.kind is RestoreKind.CHECKPOINT:
        load_s = ctx.now_s() - s.since_s
        ctx.journal.notify("on_checkpoint", lambda cb: cb.on_checkpoint("load", load_s))
    return RunningState(ctx.now_s(), s.reason, s.proposal)


def new_detector(ctx: RunContext, proposal: PlanProposal) -> StragglerDetector:
    """A straggler detector for a freshly launched plan."""
    detector = StragglerDetector(
        window=ctx.config.straggler_window_steps, threshold=ctx.config.straggler_threshold
    )
    detector.baseline_s = {k: v for k, v in proposal.stage_compute_s.items() if v > 0}
    return detector
