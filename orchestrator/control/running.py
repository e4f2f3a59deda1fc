"""The controller's RUNNING, RECOVERING and RESIZING states, and the decisions taken in them.

RUNNING polls the cluster about once a ``poll_interval_s``, and at the next step boundary after
a node event was posted (``take_news`` on the probe); between polls it runs one training step
per :meth:`Controller.step`. A lost node that hosts workers is a failure even before a step
notices; a preemption notice starts an evacuation; a join (or a straggler found in the step
timings) asks the planner for a candidate and applies the switch rule. When the switch pays and
the worker port can warm the candidate's new workers (``prepare``), training goes on under the
current plan until they are ready (``RunningState.pending``), and the switch happens at the
first step boundary after that. Each handler returns the next state.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.control import classified, readmission
from orchestrator.control.context import RunContext
from orchestrator.control.events import EventKind, PlanReason
from orchestrator.control.ports import PreparesWorkers, TellsNews, WarmState, WorkerLost
from orchestrator.control.recovery import (
    RestoreKind,
    RestoreSource,
    choose_restore,
)
from orchestrator.control.states import (
    ControllerState,
    LaunchingState,
    PendingSwitch,
    PlanningState,
    RecoveringState,
    ResizingState,
    RunningState,
)
from orchestrator.errors import InfeasibleError, TransientError
from orchestrator.policies.preemption import TreatAsLost
from orchestrator.policies.replan import ReplanDecision
from orchestrator.policies.straggler import Speedup, Straggler
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.spec.snapshot import ClusterSnapshot, SnapshotDiff

# -- RUNNING -----------------------------------------------------------------------------------


# How long a switch waits for its new workers to warm up before it goes ahead without them (the
# re-formation then starts what is missing itself).
WARM_TIMEOUT_S = 120.0


def run_one(ctx: RunContext, s: RunningState) -> ControllerState:
    """Switch when a pending switch's workers are warm; poll when due (or when a node event was
    posted) and react; otherwise run one training step."""
    led = ctx.ledger
    if led.next_step >= ctx.config.total_steps:
        return ctx.finish()
    if s.pending is not None:
        after = _pending_switch(ctx, s, s.pending)
        if after is not s:
            return after
    if ctx.now_s() - led.last_poll_s >= ctx.config.poll_interval_s or _news(ctx):
        try:
            snap, diff = ctx.poll()
        except TransientError as exc:
            ctx.journal.logger.warning("cluster probe failed, training on: %s", exc)
        else:
            reaction = _react(ctx, s, snap, diff)
            if reaction is not None:
                return reaction
    try:
        report = ctx.workers.step(led.next_step)
    except (WorkerLost, TransientError) as exc:
        return ctx.on_failure(exc, s.name)
    except Exception as exc:  # a lost peer, out of memory, or a bug in the model or the data
        return classified.on_step_error(ctx, s, exc)
    if report.overflow_skipped:
        return _on_overflow(ctx, s, report)
    led.consecutive_overflows = 0
    ctx.commit(report)
    interval = ctx.config.checkpoint_interval_steps
    try:
        if interval and led.next_step % interval == 0 and led.next_step < ctx.config.total_steps:
            ctx.save_checkpoint()
    except WorkerLost as exc:
        return ctx.on_failure(exc, s.name)
    stragglers = led.stragglers.observe(report.stage_timings)
    if stragglers:
        return _on_stragglers(ctx, s, stragglers) or s
    sped_up = _speedups(ctx, s)
    if sped_up:
        return _on_speedups(ctx, s, sped_up) or s
    return readmission.after_step(ctx, s, report) or s


def _news(ctx: RunContext) -> bool:
    """Whether a node event was posted since the last look (probes that can tell)."""
    return isinstance(ctx.probe, TellsNews) and ctx.probe.take_news()


def _pending_switch(ctx: RunContext, s: RunningState, p: PendingSwitch) -> ControllerState:
    """RESIZING once the pending switch's new workers are warm (or the wait timed out); the
    state without it when they failed; ``s`` itself while they warm (train on)."""
    if not isinstance(ctx.workers, PreparesWorkers):  # only such a port starts a pending switch
        return replace(s, pending=None)
    status = ctx.workers.prepared(p.proposal.plan)
    waited_s = ctx.now_s() - p.since_s
    warming = status.state is WarmState.WARMING
    if warming and waited_s < WARM_TIMEOUT_S and ctx.now_s() < p.switch_by_s:
        return s
    if status.state is WarmState.FAILED and p.evacuate_nodes:  # evacuate all the same
        ctx.journal.logger.warning("warming the evacuation's workers failed: %s", status.detail)
    elif status.state is WarmState.FAILED:
        ctx.record(
            EventKind.REPLAN_SKIPPED,
            f"{p.trigger}: the new plan's workers did not warm up ({status.detail}); "
            "keeping the current plan",
            trigger=p.trigger,
            error=status.detail,
        )
        return replace(s, pending=None)
    seconds = dict(status.seconds or {})
    ready = status.state is WarmState.READY
    ctx.record(
        EventKind.WARM_READY,
        (
            f"{p.trigger}: the new plan's workers are warm after {waited_s:.2f} s of training "
            "on; switching at this step boundary"
            if ready
            else f"{p.trigger}: the new plan's workers not warm after {waited_s:.1f} s; "
            "switching without waiting longer"
            + (" (the preemption deadline is near)" if ctx.now_s() >= p.switch_by_s else "")
        ),
        trigger=p.trigger,
        warm_s=waited_s,
        ready=ready,
        **seconds,
    )
    return ResizingState(ctx.now_s(), p.trigger, p.proposal, p.evacuate_nodes)


# fp16 halves its loss scale on each overflow; this many in a row (2^16 down to 2^-4) means the
# gradients are not finite at any scale: a diverged run or bad data, not a scale to find.
MAX_CONSECUTIVE_OVERFLOWS = 20


def _on_overflow(ctx: RunContext, s: RunningState, report: StepReport) -> ControllerState:
    """An fp16 step whose update every rank skipped: not committed, reported, run again (same
    step, same samples) at the lowered scale, so the run still makes its every update."""
    led = ctx.ledger
    led.overflow_skipped_total += 1
    led.consecutive_overflows += 1
    ctx.record(
        EventKind.STEP_SKIPPED,
        f"step {report.step}: fp16 gradients overflowed at loss scale {report.loss_scale:g}; "
        "update skipped, the step runs again at half the scale",
        step=report.step,
        loss_scale=report.loss_scale,
        skipped_total=led.overflow_skipped_total,
    )
    if led.consecutive_overflows >= MAX_CONSECUTIVE_OVERFLOWS:
        return ctx.fail(
            f"step {report.step} overflowed in fp16 {led.consecutive_overflows} times in a row "
            f"(loss scale now {report.loss_scale / 2:g}); the gradients are not finite at any "
            "scale: check the data and the learning rate, or train in bf16"
        )
    return s


def _react(
    ctx: RunContext, s: RunningState, snap: ClusterSnapshot, diff: SnapshotDiff
) -> ControllerState | None:
    """Act on what the poll saw: the next state, or None to train on."""
    placed = set(ctx.workers.placement().values())
    lost = set(diff.lost) | (ctx.ledger.excluded_nodes & placed)
    lost_ranks = ctx.ranks_on(lost)
    if lost_ranks:
        error = WorkerLost(lost_ranks, lost, "node lost (seen by the cluster probe)")
        return ctx.on_failure(error, s.name)
    if s.pending is not None and _plan_nodes(s.pending.proposal.plan) & lost:
        ctx.record(
            EventKind.REPLAN_SKIPPED,
            f"{s.pending.trigger}: a node of the new plan left while its workers warmed up",
            trigger=s.pending.trigger,
            nodes=sorted(_plan_nodes(s.pending.proposal.plan) & lost),
        )
        s = replace(s, pending=None)
        if not (diff.joined or diff.changed):
            return s
    draining = {n: d for n, d in snap.draining.items() if ctx.ranks_on({n})}
    if draining:
        decision = ctx.config.preemption.decide(ctx.now_s(), draining)
        if isinstance(decision, TreatAsLost):
            ctx.record(
                EventKind.PREEMPTION_NOTICE,
                f"preemption deadline of {list(decision.node_ids)} passed "
                f"{decision.overdue_s:.1f} s ago; treating them as lost",
                nodes=list(decision.node_ids),
                overdue_s=decision.overdue_s,
            )
            nodes = set(decision.node_ids)
            error = WorkerLost(ctx.ranks_on(nodes), nodes, "preemption deadline passed")
            return ctx.on_failure(error, s.name)
        leaving = frozenset(decision.node_ids)
        if s.pending is not None and s.pending.evacuate_nodes >= leaving:
            return None  # decided at an earlier poll; its workers are warming
        ctx.record(
            EventKind.PREEMPTION_NOTICE,
            f"evacuating {list(decision.node_ids)} before the deadline",
            nodes=list(decision.node_ids),
            slack_s=decision.slack_s,
        )
        return _evacuate(ctx, s, snap, leaving, decision.slack_s)
    if diff.joined or diff.changed:
        return _consider_switch(ctx, s, snap, PlanReason.JOIN)
    return None


def _evacuate(
    ctx: RunContext,
    s: RunningState,
    snap: ClusterSnapshot,
    nodes: frozenset[str],
    slack_s: float | None,
) -> ResizingState | RunningState:
    """Leave the draining ``nodes``: with a port that can warm workers, plan without them now
    and, when that plan needs new workers, warm them while training goes on (switching by the
    deadline, less the expected switch, whether they are warm or not); else RESIZING re-plans."""
    if not isinstance(ctx.workers, PreparesWorkers):
        return ResizingState(ctx.now_s(), PlanReason.PREEMPTION, None, nodes)
    try:
        candidate = ctx.plan_for(snap)  # the usable nodes: the draining ones left out
    except (InfeasibleError, TransientError):
        return ResizingState(ctx.now_s(), PlanReason.PREEMPTION, None, nodes)
    warming = _prepare(ctx, candidate.plan)
    if not warming:
        return ResizingState(ctx.now_s(), PlanReason.PREEMPTION, candidate, nodes)
    led = ctx.ledger
    # Time left for warming: the slack to the deadline, less the switch and one step.
    spare_s = (
        float("inf")
        if slack_s is None
        else slack_s - led.switch_cost.estimate_s - led.measurements.current_step_s
    )
    ctx.record(
        EventKind.WARMING,
        f"{PlanReason.PREEMPTION}: starting {warming} workers of the plan without "
        f"{sorted(nodes)} while the current plan trains"
        + (f" (at most {max(0.0, spare_s):.1f} s)" if slack_s is not None else ""),
        trigger=PlanReason.PREEMPTION,
        workers=warming,
        nodes=sorted(nodes),
    )
    pending = PendingSwitch(
        candidate, PlanReason.PREEMPTION, ctx.now_s(), nodes, ctx.now_s() + spare_s
    )
    return replace(s, pending=pending)


def _plan_nodes(plan: Plan) -> set[str]:
    return {st.node for rep in plan.replicas for st in rep.stages if st.node is not None}


def _consider_switch(
    ctx: RunContext, s: RunningState, snap: ClusterSnapshot, trigger: PlanReason
) -> ResizingState | RunningState | None:
    """Ask the planner for a candidate and apply the switch rule: RESIZING; RUNNING with the
    switch pending while its new workers warm up; or None to keep on (a switch pending from
    before is dropped then: the cluster changed since it was decided)."""
    led = ctx.ledger
    keep = replace(s, pending=None) if s.pending is not None else None
    try:
        candidate = ctx.plan_for(snap)
    except (InfeasibleError, TransientError) as exc:
        ctx.record(EventKind.REPLAN_SKIPPED, f"{trigger}: no candidate plan: {exc}", error=str(exc))
        return keep
    if candidate.plan == s.proposal.plan:
        ctx.record(
            EventKind.REPLAN_SKIPPED,
            f"{trigger}: the planner keeps the current plan",
            trigger=trigger,
            predicted_step_s=candidate.predicted_step_s,
        )
        return keep
    decision = ctx.config.replan.decide(
        trigger=trigger,
        current_step_s=led.measurements.current_step_s,
        candidate_predicted_step_s=candidate.predicted_step_s,
        calibration=_calibration_now(ctx, s, snap),
        remaining_steps=ctx.config.total_steps - led.next_step,
        switch_cost_s=led.switch_cost.estimate_s,
    )
    if not isinstance(decision, ReplanDecision):
        ctx.record(EventKind.REPLAN_SKIPPED, decision.reason, trigger=trigger, **decision.numbers)
        return keep
    ctx.record(EventKind.REPLAN, decision.reason, trigger=trigger, **decision.numbers)
    warming = _prepare(ctx, candidate.plan)
    if not warming:
        return ResizingState(ctx.now_s(), trigger, candidate)
    ctx.record(
        EventKind.WARMING,
        f"{trigger}: starting {warming} workers of the new plan while the current plan trains",
        trigger=trigger,
        workers=warming,
    )
    return replace(s, pending=PendingSwitch(candidate, trigger, ctx.now_s()))


def _prepare(ctx: RunContext, plan: Plan) -> int:
    """Ask a port that can warm workers to start the plan's new ones; how many it started."""
    if not isinstance(ctx.workers, PreparesWorkers):
        return 0
    try:
        return ctx.workers.prepare(plan)
    except Exception as exc:  # warming is an optimisation: the switch's re-formation judges it
        ctx.journal.logger.warning("warming the new plan's workers failed: %s", exc)
        return 0


def _calibration_now(ctx: RunContext, s: RunningState, snap: ClusterSnapshot) -> float:
    """Measured / predicted for the running plan, with the plan costed again under the speeds
    believed now. After a straggler or a speed-up the launch's calibration compares steps with
    a prediction made under other speeds; costing the running plan the way the candidate is
    costed makes the switch rule's gain depend on the model's ranking of the two plans, scaled
    by how far the model is off right now."""
    led = ctx.ledger
    if led.measurements.recent_steps == 0:
        return led.measurements.calibration
    pinned = _pinned(ctx, s.proposal.plan)
    predicted_s = ctx.predict_running(snap, pinned)
    if predicted_s is None:
        return led.measurements.calibration
    return led.measurements.current_step_s / predicted_s


def _pinned(ctx: RunContext, plan: Plan) -> Plan:
    """``plan`` with every stage pinned to the node it runs on."""
    nodes = _stage_nodes(ctx, plan)
    replicas = tuple(
        r.model_copy(
            update={
                "stages": tuple(
                    st.model_copy(update={"node": nodes.get((i, j)) or st.node})
                    for j, st in enumerate(r.stages)
                )
            }
        )
        for i, r in enumerate(plan.replicas)
    )
    return plan.model_copy(update={"replicas": replicas})


def _on_stragglers(
    ctx: RunContext, s: RunningState, found: list[Straggler]
) -> ResizingState | RunningState | None:
    led = ctx.ledger
    nodes = _stage_nodes(ctx, s.proposal.plan)
    factor_by_node: dict[str, float] = {}
    for st in found:
        node = nodes.get((st.replica, st.stage))
        ctx.record(
            EventKind.STRAGGLER,
            f"replica {st.replica} stage {st.stage} ({st.device_type} on {node}) runs "
            f"{st.slowdown_factor:.2f}x slower than the other stages, each against its "
            "baseline",
            replica=st.replica,
            stage=st.stage,
            node=node,
            slowdown_factor=st.slowdown_factor,
            baseline_s=st.baseline_s,
            measured_s=st.measured_s,
        )
        if node is not None:  # several slow stages on one node: one factor for the node
            factor_by_node[node] = max(factor_by_node.get(node, 1.0), st.slowdown_factor)
        # Accept the measured speed as the new normal, so the same slowness fires only once.
        led.stragglers.rebase((st.replica, st.stage), st.measured_s)
    for node, factor in factor_by_node.items():
        led.slowdown_by_node[node] = led.slowdown_by_node.get(node, 1.0) * factor
    if led.snapshot is None:
        return None
    return _consider_switch(ctx, s, led.snapshot, PlanReason.STRAGGLER)


def _stage_nodes(ctx: RunContext, plan: Plan) -> dict[tuple[int, int], str | None]:
    """(replica, stage) -> the node it runs on (its pin, else where its rank was placed)."""
    placement = ctx.workers.placement()
    first = plan.first_ranks()
    return {
        (r, s): stage.node or placement.get(first[(r, s)]) for r, s, stage in plan.ranked_stages()
    }


def _speedups(ctx: RunContext, s: RunningState) -> list[Speedup]:
    """Speed-ups of stages on nodes planned as slow (only those can be given work back)."""
    slow = {n for n, f in ctx.ledger.slowdown_by_node.items() if f > 1.0}
    if not slow:
        return []
    keys = {k for k, n in _stage_nodes(ctx, s.proposal.plan).items() if n in slow}
    return ctx.ledger.stragglers.speedups(keys)


def _on_speedups(
    ctx: RunContext, s: RunningState, found: list[Speedup]
) -> ResizingState | RunningState | None:
    """A node planned as slow runs faster again: lower (or drop) its measured slowdown and ask
    for a plan that gives it work back, under the same switch rule."""
    led = ctx.ledger
    nodes = _stage_nodes(ctx, s.proposal.plan)
    factor_by_node: dict[str, float] = {}
    for sp in found:
        node = nodes.get((sp.replica, sp.stage))
        ctx.record(
            EventKind.SPEEDUP,
            f"replica {sp.replica} stage {sp.stage} ({sp.device_type} on {node}) runs "
            f"{1.0 / sp.factor:.2f}x faster than it measured (beyond the other stages)",
            replica=sp.replica,
            stage=sp.stage,
            node=node,
            factor=sp.factor,
            before_s=sp.before_s,
            measured_s=sp.measured_s,
        )
        if node is not None:  # several stages on one node: the least speed-up counts
            factor_by_node[node] = max(factor_by_node.get(node, 0.0), sp.factor)
        led.stragglers.rebase((sp.replica, sp.stage), sp.measured_s)
    for node, factor in factor_by_node.items():
        left = led.slowdown_by_node.get(node, 1.0) * factor
        # Within the detection threshold of full speed is full speed: what is left is noise.
        if left < ctx.config.straggler_threshold:
            led.slowdown_by_node.pop(node, None)
        else:
            led.slowdown_by_node[node] = left
    if led.snapshot is None:
        return None
    return _consider_switch(ctx, s, led.snapshot, PlanReason.SPEEDUP)


# -- RECOVERING --------------------------------------------------------------------------------


def recover(ctx: RunContext, s: RecoveringState) -> ControllerState:
    """Read what survives (or pick the checkpoint), stop the old group, wait out the backoff
    (without blocking: the state says when it may proceed), re-plan."""
    if not s.ready:
        restore = s.restore
        if restore is None:
            try:
                restore = _capture_after_failure(ctx, s)
            except (WorkerLost, TransientError) as exc:
                return ctx.on_failure(exc, s.name, prior=s)
        if not ctx.keeps_survivors:
            ctx.stop_workers()
        ctx.record(
            EventKind.RECOVERY,
            f"restore from {restore.kind}: resume at step {restore.resume_step}, "
            f"{restore.lost_steps} steps lost",
            **restore.summary(),
        )
        s = replace(s, restore=restore, ready=True)
    if ctx.now_s() < s.retry_at_s:
        return s
    assert s.restore is not None
    return PlanningState(ctx.now_s(), PlanReason.FAILURE, s.restore)


def _capture_after_failure(ctx: RunContext, s: RecoveringState) -> RestoreSource:
    """Choose the restore source for every layer and read the survivors' states."""
    assert ctx.ledger.proposal is not None, "a failure before any launch carries its restore"
    num_layers = ctx.ledger.proposal.plan.num_layers
    dead = set(s.lost_ranks) | ctx.ranks_on(set(s.lost_nodes) | ctx.ledger.excluded_nodes)
    choice = choose_restore(
        num_layers=num_layers,
        holders=ctx.workers.layer_holders(),
        lost_ranks=dead,
        checkpoint=ctx.checkpoints.latest(),
        next_step=ctx.ledger.next_step,
    )
    if choice.kind is RestoreKind.REPLICAS:
        # A port that keeps its survivors keeps their state too: nothing is read here.
        sources = choice.ranks_by_layer
        states = {} if ctx.keeps_survivors else ctx.workers.fetch_layer_states(sources)
        return RestoreSource(
            RestoreKind.REPLICAS,
            resume_step=ctx.ledger.next_step,
            states=states,
            layer_sources={layer: f"rank {r}" for layer, r in choice.ranks_by_layer.items()},
        )
    ctx.record(
        EventKind.RECOVERY,
        f"no surviving replica holds layers {list(choice.missing_layers)}; "
        + ("falling back to the checkpoint" if choice.checkpoint else "no checkpoint: restart"),
        missing_layers=list(choice.missing_layers),
        lost_steps=choice.lost_steps,
    )
    if choice.checkpoint is not None:
        return RestoreSource.from_checkpoint(choice.checkpoint, ctx.ledger.next_step, num_layers)
    return RestoreSource.fresh(num_layers, lost_steps=ctx.ledger.next_step)


# -- RESIZING ----------------------------------------------------------------------------------


def resize(ctx: RunContext, s: ResizingState) -> ControllerState:
    """Read every layer from the running group, stop it, and launch (or re-plan) without loss."""
    ctx.ledger.switch_cost.begin(s.since_s)
    try:
        states, sources = ctx.read_all_layers(
            ctx.ranks_on(set(s.evacuate_nodes)), read=not ctx.keeps_survivors
        )
    except (WorkerLost, TransientError) as exc:
        return ctx.on_failure(exc, s.name)
    if not ctx.keeps_survivors:
        ctx.stop_workers()
    ctx.ledger.excluded_nodes.update(s.evacuate_nodes)
    restore = RestoreSource(
        RestoreKind.REPLICAS,
        resume_step=ctx.ledger.next_step,
        states=states,
        layer_sources={layer: f"rank {r}" for layer, r in sources.items()},
    )
    if s.proposal is None:
        return PlanningState(ctx.now_s(), s.reason, restore)
    return LaunchingState(ctx.now_s(), s.reason, s.proposal, restore)
