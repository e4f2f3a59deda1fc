"""The controller's RUNNING, RECOVERING and RESIZING states, and the decisions taken in them.

RUNNING polls the cluster about once a ``poll_interval_s``; between polls it runs one training
step per :meth:`Controller.step`. A lost node that hosts workers is a failure even before a step
notices; a preemption notice starts an evacuation; a join (or a straggler found in the step
timings) asks the planner for a candidate and applies the switch rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.control import classified
from orchestrator.control.config import ControllerConfig
from orchestrator.control.events import EventKind
from orchestrator.control.ports import PlanProposal, WorkerLost
from orchestrator.control.recovery import (
    RestoreKind,
    RestoreSource,
    choose_restore,
)
from orchestrator.control.snapshot import ClusterSnapshot, SnapshotDiff
from orchestrator.control.states import (
    LaunchingState,
    PlanningState,
    RecoveringState,
    ResizingState,
    RunningState,
)
from orchestrator.errors import InfeasibleError, TransientError
from orchestrator.policies.preemption import TreatAsLost
from orchestrator.policies.replan import ReplanDecision
from orchestrator.policies.straggler import Straggler, StragglerDetector
from orchestrator.spec.plan import Plan

if TYPE_CHECKING:
    from orchestrator.control.controller import Controller


def new_detector(config: ControllerConfig, proposal: PlanProposal) -> StragglerDetector:
    """A straggler detector for a freshly launched plan."""
    detector = StragglerDetector(
        window=config.straggler_window_steps, threshold=config.straggler_threshold
    )
    detector.baseline_s = {k: v for k, v in proposal.stage_compute_s.items() if v > 0}
    return detector


def stage_ranks(plan: Plan) -> dict[tuple[int, int], int]:
    """(replica, stage) -> rank: replica-major, stage-minor (the worker topology's order)."""
    keys = [(r, s) for r, rep in enumerate(plan.replicas) for s in range(len(rep.stages))]
    return {key: rank for rank, key in enumerate(keys)}


# -- RUNNING -----------------------------------------------------------------------------------


def run_one(c: Controller, s: RunningState) -> None:
    """Poll when due and react; otherwise run one training step."""
    if c.next_step >= c.config.total_steps:
        c.finish()
        return
    if c.now_s() - c.last_poll_s >= c.config.poll_interval_s:
        try:
            snap, diff = c.poll()
        except TransientError as exc:
            c.journal.logger.warning("cluster probe failed, training on: %s", exc)
        else:
            if _react(c, s, snap, diff):
                return
    try:
        report = c.workers.step(c.next_step)
    except (WorkerLost, TransientError) as exc:
        c.on_failure(exc)
        return
    except Exception as exc:  # a lost peer, out of memory, or a bug in the model or the data
        classified.on_step_error(c, s, exc)
        return
    c.commit(report)
    interval = c.config.checkpoint_interval_steps
    try:
        if interval and c.next_step % interval == 0 and c.next_step < c.config.total_steps:
            c.save_checkpoint()
    except WorkerLost as exc:
        c.on_failure(exc)
        return
    stragglers = c.stragglers.observe(report.stage_timings)
    if stragglers:
        _on_stragglers(c, s, stragglers)


def _ranks_on(c: Controller, nodes: set[str]) -> set[int]:
    return {rank for rank, node in c.workers.placement().items() if node in nodes}


def _react(c: Controller, s: RunningState, snap: ClusterSnapshot, diff: SnapshotDiff) -> bool:
    """Act on what the poll saw; True when the state changed."""
    lost = set(diff.lost) | (c.excluded_nodes & set(c.workers.placement().values()))
    lost_ranks = _ranks_on(c, lost)
    if lost_ranks:
        c.on_failure(WorkerLost(lost_ranks, lost, "node lost (seen by the cluster probe)"))
        return True
    draining = {n: d for n, d in snap.draining.items() if _ranks_on(c, {n})}
    if draining:
        decision = c.config.preemption.decide(c.now_s(), draining)
        if isinstance(decision, TreatAsLost):
            c.record(
                EventKind.PREEMPTION_NOTICE,
                f"preemption deadline of {list(decision.node_ids)} passed "
                f"{decision.overdue_s:.1f} s ago; treating them as lost",
                nodes=list(decision.node_ids),
                overdue_s=decision.overdue_s,
            )
            nodes = set(decision.node_ids)
            c.on_failure(WorkerLost(_ranks_on(c, nodes), nodes, "preemption deadline passed"))
            return True
        c.record(
            EventKind.PREEMPTION_NOTICE,
            f"evacuating {list(decision.node_ids)} before the deadline",
            nodes=list(decision.node_ids),
            slack_s=decision.slack_s,
        )
        c.enter(ResizingState(c.now_s(), "preemption", None, frozenset(decision.node_ids)))
        return True
    if diff.joined or diff.changed:
        return _consider_switch(c, s, snap, "join")
    return False


def _consider_switch(c: Controller, s: RunningState, snap: ClusterSnapshot, trigger: str) -> bool:
    """Ask the planner for a candidate and apply the switch rule; True when switching."""
    try:
        candidate = c.plan_for(snap)
    except (InfeasibleError, TransientError) as exc:
        c.record(EventKind.REPLAN_SKIPPED, f"{trigger}: no candidate plan: {exc}", error=str(exc))
        return False
    if candidate.plan == s.proposal.plan:
        c.record(
            EventKind.REPLAN_SKIPPED,
            f"{trigger}: the planner keeps the current plan",
            trigger=trigger,
            predicted_step_s=candidate.predicted_step_s,
        )
        return False
    decision = c.config.replan.decide(
        trigger=trigger,
        current_step_s=c.measurements.current_step_s,
        candidate_predicted_step_s=candidate.predicted_step_s,
        calibration=c.measurements.calibration,
        remaining_steps=c.config.total_steps - c.next_step,
        switch_cost_s=c.switch_cost.estimate_s,
    )
    if isinstance(decision, ReplanDecision):
        c.record(EventKind.REPLAN, decision.reason, trigger=trigger, **decision.numbers)
        c.enter(ResizingState(c.now_s(), trigger, candidate))
        return True
    c.record(EventKind.REPLAN_SKIPPED, decision.reason, trigger=trigger, **decision.numbers)
    return False


def _on_stragglers(c: Controller, s: RunningState, found: list[Straggler]) -> None:
    ranks = stage_ranks(s.proposal.plan)
    placement = c.workers.placement()
    factor_by_node: dict[str, float] = {}
    for st in found:
        stage = s.proposal.plan.replicas[st.replica].stages[st.stage]
        node = stage.node or placement.get(ranks[(st.replica, st.stage)])
        c.record(
            EventKind.STRAGGLER,
            f"replica {st.replica} stage {st.stage} ({st.device_type} on {node}) runs "
            f"{st.slowdown_factor:.2f}x slower than planned",
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
        c.stragglers.rebase((st.replica, st.stage), st.measured_s)
    for node, factor in factor_by_node.items():
        c.slowdown_by_node[node] = c.slowdown_by_node.get(node, 1.0) * factor
    if c.snapshot is not None:
        _consider_switch(c, s, c.snapshot, "straggler")


# -- RECOVERING --------------------------------------------------------------------------------


def recover(c: Controller, s: RecoveringState) -> None:
    """Read what survives (or pick the checkpoint), stop the old group, wait, re-plan."""
    restore = s.restore
    if restore is None:
        try:
            restore = _capture_after_failure(c, s)
        except (WorkerLost, TransientError) as exc:
            c.on_failure(exc, prior=s)
            return
    c.stop_workers()
    c.record(
        EventKind.RECOVERY,
        f"restore from {restore.kind}: resume at step {restore.resume_step}, "
        f"{restore.lost_steps} steps lost",
        **restore.summary(),
    )
    wait_s = s.retry_at_s - c.now_s()
    if wait_s > 0:
        c.clock.sleep(wait_s)
    c.enter(PlanningState(c.now_s(), "failure", restore))


def _capture_after_failure(c: Controller, s: RecoveringState) -> RestoreSource:
    """Choose the restore source for every layer and read the survivors' states."""
    assert c.proposal is not None, "a failure before any launch carries its restore"
    num_layers = c.proposal.plan.num_layers
    dead = set(s.lost_ranks) | _ranks_on(c, set(s.lost_nodes) | c.excluded_nodes)
    choice = choose_restore(
        num_layers=num_layers,
        holders=c.workers.layer_holders(),
        lost_ranks=dead,
        checkpoint=c.checkpoints.latest(),
        next_step=c.next_step,
    )
    if choice.kind is RestoreKind.REPLICAS:
        states = c.workers.fetch_layer_states(choice.ranks_by_layer)
        return RestoreSource(
            RestoreKind.REPLICAS,
            resume_step=c.next_step,
            states=states,
            layer_sources={layer: f"rank {r}" for layer, r in choice.ranks_by_layer.items()},
        )
    c.record(
        EventKind.RECOVERY,
        f"no surviving replica holds layers {list(choice.missing_layers)}; "
        + ("falling back to the checkpoint" if choice.checkpoint else "no checkpoint: restart"),
        missing_layers=list(choice.missing_layers),
        lost_steps=choice.lost_steps,
    )
    if choice.checkpoint is not None:
        return RestoreSource.from_checkpoint(choice.checkpoint, c.next_step, num_layers)
    return RestoreSource.fresh(num_layers, lost_steps=c.next_step)


# -- RESIZING ----------------------------------------------------------------------------------


def resize(c: Controller, s: ResizingState) -> None:
    """Read every layer from the running group, stop it, and launch (or re-plan) without loss."""
    c.switch_cost.begin(s.since_s)
    try:
        states, sources = c.read_all_layers(_ranks_on(c, set(s.evacuate_nodes)))
    except (WorkerLost, TransientError) as exc:
        c.on_failure(exc)
        return
    c.stop_workers()
    c.excluded_nodes.update(s.evacuate_nodes)
    restore = RestoreSource(
        RestoreKind.REPLICAS,
        resume_step=c.next_step,
        states=states,
        layer_sources={layer: f"rank {r}" for layer, r in sources.items()},
    )
    if s.proposal is None:
        c.enter(PlanningState(c.now_s(), s.reason, restore))
    else:
        c.enter(LaunchingState(c.now_s(), s.reason, s.proposal, restore))
