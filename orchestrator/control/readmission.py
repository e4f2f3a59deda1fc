"""Slow nodes a re-plan left without work: tried again after a cool-down (policies/readmit.py).

Called from RUNNING after each committed step. Three moments:

- *track*: which nodes planned as slow have no work in the running plan (their cool-down runs);
- *try*: a due node is planned at its labelled speed; the switch rule decides, and a switch
  taken puts the node on trial (a ``readmit`` event, plan reason ``readmit``);
- *judge*: each step of the trial's plan is handed to the policy; once the plan has run its
  warm-up step, its settling steps and a straggler window (``TrialWindow``), the node's stages
  against the other stages over that window (each stage's median compute time over the trial
  plan's prediction), or the whole step against the expected one where the node runs every
  measured stage, say whether the node is back or still slow (it then gets its slowdown back
  and the planner is asked again, so it is dropped again with a longer cool-down).
"""

from __future__ import annotations

from orchestrator.control.context import RunContext
from orchestrator.control.events import EventKind, PlanReason
from orchestrator.control.states import ResizingState, RunningState
from orchestrator.errors import InfeasibleError, TransientError
from orchestrator.policies.readmit import ReadmitPolicy, Rule
from orchestrator.policies.replan import ReplanDecision
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport


def stage_nodes(ctx: RunContext, plan: Plan) -> dict[tuple[int, int], str]:
    """(replica, stage) -> the node it runs on (its pin, else where its rank was placed)."""
    placement = ctx.workers.placement()
    first = plan.first_ranks()
    return {
        (r, s): node
        for r, s, stage in plan.ranked_stages()
        if (node := stage.node or placement.get(first[(r, s)])) is not None
    }


def nodes_with_work(ctx: RunContext, plan: Plan) -> set[str]:
    """Nodes that run a stage of ``plan`` (its pin, else where its rank was placed)."""
    return set(stage_nodes(ctx, plan).values())


def predicted_stage_s(ctx: RunContext) -> dict[tuple[int, int], float]:
    """The running plan's own per-stage predicted compute times (the cost model's per-stage
    busy time where the planner gave it, else the detector's baselines)."""
    led = ctx.ledger
    if led.proposal is None:
        return {}
    return dict(led.proposal.predicted_stage_s or led.proposal.stage_compute_s)


def after_step(ctx: RunContext, s: RunningState, report: StepReport) -> ResizingState | None:
    """Judge a trial (``report``: the step just committed), track idle slow nodes, try a due
    one: the switch to make, or None."""
    policy = ctx.readmit
    led = ctx.ledger
    plan = s.proposal.plan
    if policy.trial is not None:
        if led.proposal is None or led.proposal.plan != policy.trial.plan:
            # Another plan replaced the trial's (a failure, a join) before its verdict: the node
            # was not shown to be fast, so it is planned with its slowdown again.
            trial_node = policy.trial.node
            found_slow = led.slowdown_by_node.get(trial_node, 1.0) > 1.0
            trial = policy.abandon(found_slow=found_slow)
            if trial is not None:
                led.slowdown_by_node.setdefault(trial_node, trial.slowdown)
        else:
            policy.observe(
                {(t.replica, t.stage): t.compute_s for t in report.stage_timings},
                report.step_duration_s,
            )
            return _judge(ctx, s, policy)
    slow = {n for n, f in led.slowdown_by_node.items() if f > 1.0}
    if led.snapshot is None or not (slow or policy.idle_since_s):
        return None  # the common case: nothing planned as slow, nothing to look at per step
    usable = led.snapshot.usable(led.excluded_nodes).node_ids
    working = nodes_with_work(ctx, plan)
    idle = {n for n in slow if n in usable} - working
    policy.track(idle, ctx.now_s())
    due = policy.due(ctx.now_s())
    return _try(ctx, s, policy, due) if due is not None else None


def _switch(
    ctx: RunContext, s: RunningState, calibration: float, node: str, slowdown: float | None
) -> tuple[ResizingState | None, str, dict[str, float]]:
    """Ask the planner (``node`` at ``slowdown``, None: its labelled speed) and apply the switch
    rule with ``calibration``: the switch (or None), why not, and the rule's numbers. A trial's
    own calibration is not used: its measured steps include the node being judged."""
    led = ctx.ledger
    assert led.snapshot is not None
    trigger = PlanReason.READMIT if slowdown is None else PlanReason.STRAGGLER
    try:
        candidate = ctx.plan_for(led.snapshot)
    except (InfeasibleError, TransientError) as exc:
        return None, f"no candidate plan: {exc}", {}
    if slowdown is None and node not in _pinned_nodes(candidate.plan):
        return None, "the planner gives it no work", {}
    if slowdown is not None and candidate.plan == s.proposal.plan:
        return None, "the planner keeps the current plan", {}
    decision = ctx.config.replan.decide(
        trigger=trigger,
        current_step_s=led.measurements.current_step_s,
        candidate_predicted_step_s=candidate.predicted_step_s,
        calibration=calibration,
        remaining_steps=ctx.config.total_steps - led.next_step,
        switch_cost_s=led.switch_cost.estimate_s,
    )
    if not isinstance(decision, ReplanDecision):
        return None, decision.reason, decision.numbers
    ctx.record(EventKind.REPLAN, decision.reason, trigger=trigger, **decision.numbers)
    return ResizingState(ctx.now_s(), trigger, candidate), "", decision.numbers


def _try(
    ctx: RunContext, s: RunningState, policy: ReadmitPolicy, node: str
) -> ResizingState | None:
    """Plan ``node`` at its labelled speed; switch under the switch rule, or wait again."""
    led = ctx.ledger
    slowdown = led.slowdown_by_node.pop(node)
    cooldown_s = policy.cooldown_for(node)
    calibration = led.measurements.calibration
    switch, why, numbers = _switch(ctx, s, calibration, node, None)
    if switch is None:
        led.slowdown_by_node[node] = slowdown
        policy.postpone(node, ctx.now_s())
        ctx.record(
            EventKind.REPLAN_SKIPPED,
            f"readmit: node {node} idle {cooldown_s:.0f} s; at its labelled speed {why}; "
            f"it stays planned {slowdown:.2f}x slower and is tried again in {cooldown_s:.0f} s",
            trigger=PlanReason.READMIT,
            node=node,
            cooldown_s=cooldown_s,
            **numbers,
        )
        return None
    expected_s = numbers["expected_new_step_s"]
    assert switch.proposal is not None
    policy.begin(node, slowdown, expected_s, ctx.now_s(), switch.proposal.plan, calibration)
    ctx.record(
        EventKind.READMIT,
        f"node {node} left without work for {cooldown_s:.0f} s is tried again at its labelled "
        f"speed (it was planned {slowdown:.2f}x slower): expected {expected_s:.3f} s/step",
        node=node,
        slowdown_factor=slowdown,
        cooldown_s=cooldown_s,
        expected_step_s=expected_s,
    )
    return switch


def _judge(ctx: RunContext, s: RunningState, policy: ReadmitPolicy) -> ResizingState | None:
    """The trial plan runs: after a straggler window, is the node back or still slow?"""
    led = ctx.ledger
    trial = policy.trial
    if trial is None:
        return None
    on_node = {k for k, n in stage_nodes(ctx, s.proposal.plan).items() if n == trial.node}
    # Held against the trial plan's own predictions: the ledger's proposal is the trial's here.
    verdict = policy.judge_measured(predicted_stage_s(ctx), on_node)
    if verdict is None:
        return None
    t = verdict.trial
    numbers: dict[str, object] = {
        "node": t.node,
        "rule": verdict.rule,
        "measured_step_s": verdict.measured_step_s,
        "expected_step_s": t.expected_step_s,
        "ratio": verdict.ratio,
        "still_slow": verdict.still_slow,
        "settle_steps": policy.settling_steps,  # not judged, after the warm-up step
        "settling_ratio": verdict.settling_ratio,  # the same rule over those (not acted on)
    }
    if verdict.rule == Rule.STAGES:
        numbers.update(node_ratio=verdict.node_ratio, others_ratio=verdict.others_ratio)
        why = (
            f"its stages {verdict.node_ratio:.2f}x their prediction, the other stages "
            f"{verdict.others_ratio:.2f}x ({verdict.ratio:.2f}x relative)"
        )
    else:
        why = (
            f"{verdict.measured_step_s:.3f} s/step measured, {t.expected_step_s:.3f} expected "
            f"({verdict.ratio:.2f}x)"
        )
    if not verdict.still_slow:
        ctx.record(
            EventKind.READMIT, f"node {t.node} is back at its labelled speed: {why}", **numbers
        )
        return None
    led.slowdown_by_node[t.node] = t.slowdown
    ctx.record(
        EventKind.READMIT,
        f"node {t.node} is still slow: {why}; planned {t.slowdown:.2f}x "
        f"slower again, next try after {verdict.next_cooldown_s:.0f} s without work",
        cooldown_s=verdict.next_cooldown_s,
        slowdown_factor=t.slowdown,
        **numbers,
    )
    if led.snapshot is None:
        return None
    switch, why, rule = _switch(ctx, s, t.calibration, t.node, t.slowdown)
    if switch is None:
        ctx.record(
            EventKind.REPLAN_SKIPPED, f"straggler: {why}", trigger=PlanReason.STRAGGLER, **rule
        )
    return switch


def _pinned_nodes(plan: Plan) -> set[str]:
    return {st.node for r in plan.replicas for st in r.stages if st.node is not None}
