"""What the controller's state handlers work with: the ports, the config, the journal, the ledger.

:class:`RunContext` holds them and the actions every state shares (probe the cluster, ask the
planner, save a checkpoint, account for a committed step, count a failure). Actions that end or
redirect the run (:meth:`RunContext.fail`, :meth:`RunContext.on_failure`,
:meth:`RunContext.finish`) *return* the next state; only
:meth:`~orchestrator.control.controller.Controller.step` enters it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from orchestrator.control.config import ControllerConfig
from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.journal import Journal
from orchestrator.control.ledger import RunLedger
from orchestrator.control.ports import (
    CheckpointStore,
    Clock,
    ClusterProbe,
    KeepsSurvivors,
    PlanEstimator,
    Planner,
    PlanProposal,
    StagesCheckpoints,
    WorkerGroupPort,
    WorkerLost,
    WritesCheckpoints,
)
from orchestrator.control.recovery import (
    CheckpointRef,
    LayerState,
    RestoreKind,
    RestoreSource,
    lowest_holders,
)
from orchestrator.control.states import FailedState, FinishedState, RecoveringState
from orchestrator.errors import InfeasibleError, SpecError, TransientError
from orchestrator.policies.failure import GiveUp
from orchestrator.policies.readmit import ReadmitPolicy
from orchestrator.policies.rejoin import RejoinPolicy
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.spec.snapshot import ClusterSnapshot, SnapshotDiff, diff_snapshots


@dataclass
class RunContext:
    """The ports, settings, journal and ledger of one run (see the module docstring)."""

    config: ControllerConfig
    probe: ClusterProbe
    workers: WorkerGroupPort
    checkpoints: CheckpointStore
    planner: Planner
    clock: Clock
    journal: Journal
    ledger: RunLedger
    rejoin: RejoinPolicy = field(default_factory=RejoinPolicy)
    readmit: ReadmitPolicy = field(default_factory=ReadmitPolicy)  # slow nodes without work

    def now_s(self) -> float:
        return self.clock.now_s()

    def record(self, kind: EventKind, message: str, **data: object) -> None:
        self.journal.record(self.now_s(), kind, message, **data)

    # -- the cluster and the planner -------------------------------------------------------

    def poll(self) -> tuple[ClusterSnapshot, SnapshotDiff]:
        """Probe the cluster, record what changed, and remember the snapshot."""
        led = self.ledger
        snap = self.probe.snapshot()
        first = led.snapshot is None
        diff = diff_snapshots(led.snapshot, snap)
        led.snapshot = snap
        led.last_poll_s = self.now_s()
        led.excluded_nodes.update(diff.lost)
        if first:
            self.record(
                EventKind.NODE_JOINED,
                f"discovered {len(snap.nodes)} nodes, {snap.num_devices} usable devices",
                devices_by_type=snap.devices_by_type(),
                nodes=sorted(snap.node_ids),
            )
        else:
            for node in diff.joined:
                self.record(
                    EventKind.NODE_JOINED,
                    f"node {node.node_id} joined: {node.num_devices}x {node.device_type}",
                    node=node.node_id,
                    device_type=node.device_type,
                    num_devices=node.num_devices,
                )
            for node_id in diff.lost:
                self.record(EventKind.NODE_LOST, f"node {node_id} left the cluster", node=node_id)
        for node_id in diff.draining:
            self.record(
                EventKind.PREEMPTION_NOTICE,
                f"node {node_id} is draining (deadline {snap.draining[node_id]})",
                node=node_id,
                deadline_s=snap.draining[node_id],
            )
        if first or not diff.empty:
            alive, draining = snap.devices_by_type(), snap.devices_by_type(draining=True)
            self.journal.notify("on_devices", lambda cb: cb.on_devices(alive, draining))
        if snap.emulated != led.emulated:
            led.emulated = emulated = snap.emulated
            self.journal.notify("on_emulated", lambda cb: cb.on_emulated(emulated))
        return snap, self._readmit(snap, diff)

    def _readmit(self, snap: ClusterSnapshot, diff: SnapshotDiff) -> SnapshotDiff:
        """Admit excluded nodes healthy again for the cool-down; they count as joins."""
        led = self.ledger
        healthy = snap.node_ids - set(snap.draining)
        back = self.rejoin.readmit(led.excluded_nodes, healthy, self.now_s())
        if not back:
            return diff
        led.excluded_nodes.difference_update(back)
        for node_id in back:
            self.record(
                EventKind.NODE_JOINED,
                f"node {node_id} rejoins: listed healthy for {self.rejoin.cooldown_s:.0f} s "
                "after it was excluded",
                node=node_id,
                rejoined=True,
            )
        nodes = tuple(n for n in snap.nodes if n.node_id in back)
        return dataclasses.replace(diff, joined=(*diff.joined, *nodes))

    def plan_for(self, snap: ClusterSnapshot) -> PlanProposal:
        """Ask the planner for a plan on the usable part of ``snap``."""
        usable = snap.usable(self.ledger.excluded_nodes)
        return self.planner(usable, dict(self.ledger.slowdown_by_node))

    def predict_running(self, snap: ClusterSnapshot, plan: Plan) -> float | None:
        """``plan`` (stages pinned to their nodes) costed under today's measured slowdowns, or
        None where the planner cannot cost a given plan or the plan no longer fits."""
        if not isinstance(self.planner, PlanEstimator):
            return None
        usable = snap.usable(self.ledger.excluded_nodes)
        try:
            predicted_s = self.planner.estimate(plan, usable, dict(self.ledger.slowdown_by_node))
        except (InfeasibleError, SpecError, KeyError, ValueError):
            return None
        return predicted_s if predicted_s > 0 else None

    # -- state of the workers --------------------------------------------------------------

    def run_meta(self) -> dict[str, object]:
        """The run state a checkpoint carries, for a restarted controller."""
        led = self.ledger
        return {
            "failure_count": led.failure_count,
            "lost_steps_total": led.lost_steps_total,
            "slowdown_by_node": dict(led.slowdown_by_node),
            "plan": led.proposal.plan.model_dump(mode="json") if led.proposal else None,
        }

    @property
    def holders_write(self) -> bool:
        """Whether checkpoints are written by the layers' holders into the store's staging place
        (a worker port that :class:`WritesCheckpoints` and a store that
        :class:`StagesCheckpoints`); else every layer is read into this process and saved."""
        return isinstance(self.workers, WritesCheckpoints) and isinstance(
            self.checkpoints, StagesCheckpoints
        )

    def save_checkpoint(self) -> bool:
        """Save every layer's state at ``next_step``: written by the holders where the ports
        allow (:attr:`holders_write`), else read from the workers and saved here.

        Raises :class:`WorkerLost` (nothing is published then); any other error is recorded and
        the run goes on.
        """
        step = self.ledger.next_step
        started_s = self.now_s()
        save: Callable[[], CheckpointRef]
        if self.holders_write:
            _, sources = self.read_all_layers(read=False)
            save = partial(self._write_by_holders, step, sources)
        else:
            states, _ = self.read_all_layers()
            save = partial(self.checkpoints.save, step, states, self.run_meta())
        try:
            ref = save()
        except WorkerLost:
            raise
        except Exception as exc:  # a full disk must not kill a healthy run
            self.record(
                EventKind.CHECKPOINT,
                f"checkpoint at step {step} failed: {exc}",
                step=step,
                error=str(exc),
            )
            return False
        duration_s = self.now_s() - started_s
        self.ledger.last_checkpoint_step = ref.step
        self.record(
            EventKind.CHECKPOINT,
            f"checkpoint saved at step {ref.step}",
            step=ref.step,
            duration_s=duration_s,
        )
        self.journal.notify("on_checkpoint", lambda cb: cb.on_checkpoint("save", duration_s))
        return True

    def _write_by_holders(self, step: int, sources: dict[int, int]) -> CheckpointRef:
        """The holders of ``sources`` write their layers into a staging place; it is committed
        only when every writer reported, and dropped on any error (nothing half published)."""
        store, workers = self.checkpoints, self.workers
        assert isinstance(store, StagesCheckpoints) and isinstance(workers, WritesCheckpoints)
        staging = store.begin(step)
        try:
            written = workers.write_checkpoint(staging, sources)
            return store.commit(step, staging, written, self.run_meta())
        except BaseException:
            store.abort(staging)
            raise

    @property
    def keeps_survivors(self) -> bool:
        """Whether the worker port re-forms its live workers in place across a change of plan
        (then a REPLICAS restore without states means: the state stays in the workers)."""
        return isinstance(self.workers, KeepsSurvivors) and self.workers.keeps_survivors

    def read_all_layers(
        self, avoid_ranks: set[int] | frozenset[int] = frozenset(), *, read: bool = True
    ) -> tuple[dict[int, LayerState], dict[int, int]]:
        """Every layer's state from the running group, and the rank each came from
        (``read=False``: only the ranks; the states stay in the workers).

        Raises :class:`WorkerLost` when some layer has no live holder: a partial read must never
        become a checkpoint or a restore.
        """
        assert self.ledger.proposal is not None
        holders = self.workers.layer_holders()
        sources = lowest_holders(holders, avoid_ranks=avoid_ranks)
        missing = [i for i in range(self.ledger.proposal.plan.num_layers) if i not in sources]
        if missing:
            placement = self.workers.placement()
            alive = {r for ranks in holders.values() for r in ranks}
            dead = set(placement) - alive
            raise WorkerLost(dead, {placement[r] for r in dead}, f"no live holder of {missing}")
        if not read:
            return {}, sources
        return self.workers.fetch_layer_states(sources), sources

    def ranks_on(self, nodes: set[str] | frozenset[str]) -> set[int]:
        """Ranks of the running group placed on any of ``nodes``."""
        return {rank for rank, node in self.workers.placement().items() if node in nodes}

    def stop_workers(self) -> None:
        try:
            self.workers.stop()
        except Exception as exc:  # stop is best effort: the workers may be gone already
            self.journal.logger.warning("stopping workers failed: %s", exc)

    # -- steps -----------------------------------------------------------------------------

    def commit(self, report: StepReport) -> None:
        """Account for a committed step."""
        led = self.ledger
        assert report.step == led.next_step, (report.step, led.next_step)
        assert led.proposal is not None
        predicted_s = led.proposal.predicted_step_s
        led.next_step += 1
        led.measurements.observe(report.step_duration_s)
        self.journal.notify("on_step", lambda cb: cb.on_step(report, predicted_s))
        cost_s = led.switch_cost.first_step_done(
            self.now_s(), predicted_s * led.measurements.calibration
        )
        if cost_s is not None:
            self.record(
                EventKind.PLAN_CHOSEN,
                f"plan change overhead measured: {cost_s:.2f} s without training "
                f"(switch cost estimate now {led.switch_cost.estimate_s:.2f} s)",
                switch_cost_s=cost_s,
                estimate_s=led.switch_cost.estimate_s,
            )
        if led.pending_recovery is not None:
            cause, since_s = led.pending_recovery
            led.pending_recovery = None
            led.recovered_at = (self.now_s(), led.next_step)
            duration_s = self.now_s() - since_s
            lost = led.last_lost_steps
            self.record(
                EventKind.RECOVERY,
                f"recovered: step {report.step} done {duration_s:.2f} s after the failure, "
                f"{lost} steps lost",
                recovery_s=duration_s,
                lost_steps=lost,
                step=report.step,
                cause=cause,
            )
            self.journal.notify("on_recovery", lambda cb: cb.on_recovery(cause, duration_s, lost))

    # -- transitions shared by every state -------------------------------------------------

    def fail(self, reason: str, restore: RestoreSource | None = None) -> FailedState:
        """The run stops with ``reason``; the freshest state we hold is kept as a checkpoint."""
        checkpoint_step = self._salvage(restore)
        self.stop_workers()
        resume = (
            f"resume from the checkpoint at step {checkpoint_step}"
            if checkpoint_step is not None
            else "no checkpoint to resume from"
        )
        self.record(
            EventKind.FAILED,
            f"run failed: {reason}; {resume}",
            reason=reason,
            checkpoint_step=checkpoint_step,
            steps_done=self.ledger.next_step,
        )
        return FailedState(self.now_s(), reason=reason, checkpoint_step=checkpoint_step)

    def on_failure(
        self,
        error: WorkerLost | TransientError,
        where: ControllerStateName,
        *,
        restore: RestoreSource | None = None,
        prior: RecoveringState | None = None,
    ) -> RecoveringState | FailedState:
        """Count a failure (seen ``where``) against the budget: RECOVERING, or FAILED when spent."""
        led = self.ledger
        now_s = self.now_s()
        # A timeout names the ranks that hung (no nodes); a loss names ranks and nodes.
        ranks = frozenset(getattr(error, "ranks", ()))
        nodes = frozenset(getattr(error, "nodes", ()))
        led.excluded_nodes.update(nodes)
        led.failure_count += 1
        led.switch_cost.cancel()
        cause = f"{error} (while {where})"
        self.record(
            EventKind.FAILURE,
            f"failure {led.failure_count} at step {led.next_step}: {cause}",
            failure_count=led.failure_count,
            step=led.next_step,
            state=str(where),
            lost_ranks=sorted(ranks),
            lost_nodes=sorted(nodes),
        )
        if led.pending_recovery is None:
            led.pending_recovery = (cause, now_s)
        trained = (
            None
            if led.recovered_at is None
            else (led.next_step - led.recovered_at[1], now_s - led.recovered_at[0])
        )
        if self.config.failure.starts_burst(now_s - led.last_failure_s, trained):
            led.burst_count = 0  # long past, or recovered and trained stably since: a new burst
        led.burst_count += 1
        led.last_failure_s = now_s
        led.recovered_at = None
        decision = self.config.failure.decide(led.failure_count, cause, led.burst_count)
        if isinstance(decision, GiveUp):
            return self.fail(decision.reason, restore or (prior.restore if prior else None))
        if prior is not None:  # a failure while recovering: the earlier losses still count
            ranks, nodes = ranks | prior.lost_ranks, nodes | prior.lost_nodes
            restore = restore or prior.restore
        self.record(
            EventKind.FAILURE,
            f"retrying in {decision.after_s:.1f} s "
            f"({decision.failures_left} failures left in the budget)",
            backoff_s=decision.after_s,
            failures_left=decision.failures_left,
        )
        return RecoveringState(
            since_s=now_s,
            lost_nodes=nodes,
            lost_ranks=ranks,
            cause=cause,
            retry_at_s=now_s + decision.after_s,
            restore=restore,
        )

    def finish(self) -> FinishedState | RecoveringState | FailedState:
        """All steps done: save the final state, stop the workers."""
        led = self.ledger
        try:
            if led.last_checkpoint_step != led.next_step:
                self.save_checkpoint()
        except WorkerLost as exc:
            # Every step is committed; only the final checkpoint is missing. Recover to save it.
            return self.on_failure(exc, ControllerStateName.RUNNING)
        self.stop_workers()
        self.record(
            EventKind.FINISHED,
            f"finished {led.next_step} steps: {led.failure_count} failures, "
            f"{led.lost_steps_total} steps lost",
            steps=led.next_step,
            failure_count=led.failure_count,
            lost_steps_total=led.lost_steps_total,
        )
        return FinishedState(self.now_s(), steps=led.next_step)

    def _salvage(self, restore: RestoreSource | None) -> int | None:
        """Save state read from survivors if it is newer than the latest checkpoint."""
        latest = self.checkpoints.latest()
        latest_step = latest.step if latest else None
        if restore is None or restore.kind is not RestoreKind.REPLICAS:
            return latest_step
        if latest_step is not None and latest_step >= restore.resume_step:
            return latest_step
        states = restore.states
        try:
            if not states and self.keeps_survivors and self.holders_write:
                # The state is still in the workers: they write it.
                _, sources = self.read_all_layers(read=False)
                ref = self._write_by_holders(restore.resume_step, sources)
            else:
                if not states and self.keeps_survivors:  # the state is still in the workers
                    states, _ = self.read_all_layers()
                if not states:
                    return latest_step
                ref = self.checkpoints.save(restore.resume_step, states, self.run_meta())
        except (WorkerLost, TransientError) as exc:
            self.journal.logger.warning("could not save the survivors' state: %s", exc)
            return latest_step
        except Exception as exc:
            self.record(EventKind.CHECKPOINT, f"final checkpoint failed: {exc}", error=str(exc))
            return latest_step
        self.record(
            EventKind.CHECKPOINT, f"saved survivors' state at step {ref.step}", step=ref.step
        )
        return ref.step
