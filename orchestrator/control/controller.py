"""The elastic controller: one explicit state machine, stepped one transition at a time.

::

                 +-------------+  enough usable devices   +----------+
     start ----> | DISCOVERING | -----------------------> | PLANNING |<-------------------+
                 +-------------+ <----------------------- +----------+                    |
                     |  ^          no plan fits (wait)         | plan chosen              |
       timeout       |  |                                      v                          |
       (too few      |  |                              +-----------+   workers lost     |
        devices)     |  |                              | LAUNCHING | -------------+     |
                     v  |                              +-----------+              |     |
                 +--------+    budget spent            | launched                 v     |
                 | FAILED | <------------------+       v                  +------------+|
                 +--------+                    |  +---------+  lost       | RECOVERING |+
                     ^                         +--| RUNNING | ----------> +------------+
                     |  step raised a bug         +---------+    ^   read survivors or checkpoint,
                     +--------------------------- |  |  ^  |     |   wait the backoff, re-plan
                                                  |  |  |  |     |
                     join / straggler: switch     |  |  |  | all steps done
                     pays; preemption notice      v  |  |  v
                                           +----------+ |  +----------+
                                           | RESIZING |-+  | FINISHED |
                                           +----------+    +----------+
                      read every layer, stop, launch the new plan (no lost steps); a worker
                      lost while resizing goes to RECOVERING

:meth:`Controller.step` does one transition or one training step; :meth:`Controller.run` loops
until FINISHED or FAILED. The controller reaches the world only through the ports in
``control/ports.py``; every decision goes to the run's event list, the structured log and the
callbacks (see ``control/journal.py``). Steps are counted from 0: after ``next_step`` committed
steps, the next step to run is ``next_step``; a checkpoint "at step c" holds the state after c
steps.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from orchestrator.control import running, starting
from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.config import ControllerConfig
from orchestrator.control.events import EventKind, RunEvent, StepReport
from orchestrator.control.journal import Journal
from orchestrator.control.measure import PlanMeasurements, SwitchCostMeter
from orchestrator.control.ports import (
    CheckpointStore,
    Clock,
    ClusterProbe,
    Planner,
    PlanProposal,
    WorkerGroupPort,
    WorkerLost,
)
from orchestrator.control.recovery import (
    LayerState,
    RestoreKind,
    RestoreSource,
    lowest_holders,
)
from orchestrator.control.snapshot import ClusterSnapshot, SnapshotDiff, diff_snapshots
from orchestrator.control.states import (
    ControllerState,
    DiscoveringState,
    FailedState,
    FinishedState,
    LaunchingState,
    PlanningState,
    RecoveringState,
    ResizingState,
    RunningState,
)
from orchestrator.errors import TransientError
from orchestrator.policies.failure import GiveUp
from orchestrator.policies.rejoin import RejoinPolicy
from orchestrator.policies.straggler import StragglerDetector


class Controller:
    """Drives one training run through the states above."""

    def __init__(
        self,
        *,
        config: ControllerConfig,
        probe: ClusterProbe,
        workers: WorkerGroupPort,
        checkpoints: CheckpointStore,
        planner: Planner,
        clock: Clock,
        callbacks: Sequence[ControllerCallback] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.probe = probe
        self.workers = workers
        self.checkpoints = checkpoints
        self.planner = planner
        self.clock = clock
        self.journal = Journal(callbacks, logger)
        self.next_step = 0
        self.failure_count = 0
        self.burst_count = 0  # failures of the current burst (see policies/failure.py)
        self.last_failure_s = float("-inf")
        self.lost_steps_total = 0
        self.snapshot: ClusterSnapshot | None = None
        self.excluded_nodes: set[str] = set()  # not planned on until they rejoin (policies/rejoin)
        self.rejoin = RejoinPolicy(config.rejoin_cooldown_s)
        self.slowdown_by_node: dict[str, float] = {}
        self.proposal: PlanProposal | None = None  # the plan the workers run (or last ran)
        self.measurements = PlanMeasurements(predicted_step_s=0.0)
        self.switch_cost = SwitchCostMeter(config.initial_switch_cost_s)
        self.stragglers = StragglerDetector()
        self.last_poll_s = float("-inf")
        self.last_checkpoint_step: int | None = None
        self.pending_recovery: tuple[str, float] | None = None  # (cause, failure seen at)
        self._emulated: bool | None = None
        self.last_infeasible_nodes: frozenset[str] = frozenset()  # usable nodes when no plan fit
        self.last_lost_steps = 0  # lost steps of the restore behind the pending recovery
        self.state: ControllerState = DiscoveringState(since_s=clock.now_s(), reason="initial")
        self._handlers: dict[type, Callable[[ControllerState], None]] = {
            DiscoveringState: lambda s: starting.discover(self, s),  # type: ignore[arg-type]
            PlanningState: lambda s: starting.plan(self, s),  # type: ignore[arg-type]
            LaunchingState: lambda s: starting.launch(self, s),  # type: ignore[arg-type]
            RunningState: lambda s: running.run_one(self, s),  # type: ignore[arg-type]
            RecoveringState: lambda s: running.recover(self, s),  # type: ignore[arg-type]
            ResizingState: lambda s: running.resize(self, s),  # type: ignore[arg-type]
        }

    # -- public API ------------------------------------------------------------------------

    @property
    def events(self) -> list[RunEvent]:
        """Every decision and observation so far, oldest first."""
        return self.journal.events

    @property
    def done(self) -> bool:
        return self.state.name.is_terminal

    def step(self) -> ControllerState:
        """Do one transition or one training step; return the state after it."""
        if not self.done:
            self._handlers[type(self.state)](self.state)
        return self.state

    def run(self, max_steps: int | None = None) -> ControllerState:
        """Step until FINISHED or FAILED (or ``max_steps`` calls to :meth:`step`)."""
        calls = 0
        while not self.done and (max_steps is None or calls < max_steps):
            self.step()
            calls += 1
        return self.state

    # -- helpers shared with control/running.py -------------------------------------------

    def now_s(self) -> float:
        return self.clock.now_s()

    def enter(self, state: ControllerState) -> None:
        """Replace the state; tell the callbacks when its name changes."""
        previous = self.state.name
        self.state = state
        if state.name is not previous:
            self.journal.logger.debug(
                "state %s -> %s",
                previous,
                state.name,
                extra={"event": {"kind": "state", "from": str(previous), "to": str(state.name)}},
            )
            self.journal.notify("on_state", state.name)

    def record(self, kind: EventKind, message: str, **data: object) -> None:
        self.journal.record(self.now_s(), kind, message, **data)

    def poll(self) -> tuple[ClusterSnapshot, SnapshotDiff]:
        """Probe the cluster, record what changed, and remember the snapshot."""
        snap = self.probe.snapshot()
        first = self.snapshot is None
        diff = diff_snapshots(self.snapshot, snap)
        self.snapshot = snap
        self.last_poll_s = self.now_s()
        self.excluded_nodes.update(diff.lost)
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
            self.journal.notify(
                "on_devices", snap.devices_by_type(), snap.devices_by_type(draining=True)
            )
        if snap.emulated != self._emulated:
            self._emulated = snap.emulated
            self.journal.notify("on_emulated", snap.emulated)
        return snap, self._readmit(snap, diff)

    def _readmit(self, snap: ClusterSnapshot, diff: SnapshotDiff) -> SnapshotDiff:
        """Admit excluded nodes healthy again for the cool-down; they count as joins."""
        healthy = snap.node_ids - set(snap.draining)
        back = self.rejoin.readmit(self.excluded_nodes, healthy, self.now_s())
        if not back:
            return diff
        self.excluded_nodes.difference_update(back)
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
        usable = snap.usable(self.excluded_nodes)
        return self.planner(usable, dict(self.slowdown_by_node))

    def run_meta(self) -> dict[str, object]:
        """The run state a checkpoint carries, for a restarted controller."""
        return {
            "failure_count": self.failure_count,
            "lost_steps_total": self.lost_steps_total,
            "slowdown_by_node": dict(self.slowdown_by_node),
            "plan": self.proposal.plan.model_dump(mode="json") if self.proposal else None,
        }

    def save_checkpoint(self) -> bool:
        """Read every layer from the workers and save it at ``next_step``.

        Raises :class:`WorkerLost`; any other error is recorded and the run goes on.
        """
        assert self.proposal is not None
        started_s = self.now_s()
        states, _ = self.read_all_layers()
        try:
            ref = self.checkpoints.save(self.next_step, states, self.run_meta())
        except Exception as exc:  # a full disk must not kill a healthy run
            self.record(
                EventKind.CHECKPOINT,
                f"checkpoint at step {self.next_step} failed: {exc}",
                step=self.next_step,
                error=str(exc),
            )
            return False
        duration_s = self.now_s() - started_s
        self.last_checkpoint_step = ref.step
        self.record(
            EventKind.CHECKPOINT,
            f"checkpoint saved at step {ref.step}",
            step=ref.step,
            duration_s=duration_s,
        )
        self.journal.notify("on_checkpoint", "save", duration_s)
        return True

    def read_all_layers(
        self, avoid_ranks: set[int] | frozenset[int] = frozenset()
    ) -> tuple[dict[int, LayerState], dict[int, int]]:
        """Every layer's state from the running group, and the rank each came from.

        Raises :class:`WorkerLost` when some layer has no live holder: a partial read must never
        become a checkpoint or a restore.
        """
        assert self.proposal is not None
        holders = self.workers.layer_holders()
        sources = lowest_holders(holders, avoid_ranks=avoid_ranks)
        missing = [i for i in range(self.proposal.plan.num_layers) if i not in sources]
        if missing:
            placement = self.workers.placement()
            alive = {r for ranks in holders.values() for r in ranks}
            dead = set(placement) - alive
            raise WorkerLost(dead, {placement[r] for r in dead}, f"no live holder of {missing}")
        return self.workers.fetch_layer_states(sources), sources

    def fail(self, reason: str, restore: RestoreSource | None = None) -> None:
        """Stop the run with ``reason``; keep the freshest state we hold as a checkpoint."""
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
            steps_done=self.next_step,
        )
        self.enter(FailedState(self.now_s(), reason=reason, checkpoint_step=checkpoint_step))

    def on_failure(
        self,
        error: WorkerLost | TransientError,
        *,
        restore: RestoreSource | None = None,
        prior: RecoveringState | None = None,
    ) -> None:
        """Count a failure against the budget and go to RECOVERING, or FAILED when spent."""
        now_s = self.now_s()
        ranks = frozenset(getattr(error, "ranks", ()))
        nodes = frozenset(getattr(error, "nodes", ()))
        self.excluded_nodes.update(nodes)
        self.failure_count += 1
        self.switch_cost.cancel()
        where = str(self.state.name)
        cause = f"{error} (while {where})"
        self.record(
            EventKind.FAILURE,
            f"failure {self.failure_count} at step {self.next_step}: {cause}",
            failure_count=self.failure_count,
            step=self.next_step,
            state=where,
            lost_ranks=sorted(ranks),
            lost_nodes=sorted(nodes),
        )
        if self.pending_recovery is None:
            self.pending_recovery = (cause, now_s)
        if now_s - self.last_failure_s > self.config.failure.reset_after_s:
            self.burst_count = 0  # the previous failure is long past: a new burst
        self.burst_count += 1
        self.last_failure_s = now_s
        decision = self.config.failure.decide(self.failure_count, cause, self.burst_count)
        if isinstance(decision, GiveUp):
            self.fail(decision.reason, restore or (prior.restore if prior else None))
            return
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
        self.enter(
            RecoveringState(
                since_s=now_s,
                lost_nodes=nodes,
                lost_ranks=ranks,
                cause=cause,
                retry_at_s=now_s + decision.after_s,
                restore=restore,
            )
        )

    def commit(self, report: StepReport) -> None:
        """Account for a committed step."""
        assert report.step == self.next_step, (report.step, self.next_step)
        assert self.proposal is not None
        self.next_step += 1
        self.measurements.observe(report.step_duration_s)
        self.journal.notify("on_step", report, self.proposal.predicted_step_s)
        expected_s = self.proposal.predicted_step_s * self.measurements.calibration
        cost_s = self.switch_cost.first_step_done(self.now_s(), expected_s)
        if cost_s is not None:
            self.record(
                EventKind.PLAN_CHOSEN,
                f"plan change overhead measured: {cost_s:.2f} s without training "
                f"(switch cost estimate now {self.switch_cost.estimate_s:.2f} s)",
                switch_cost_s=cost_s,
                estimate_s=self.switch_cost.estimate_s,
            )
        if self.pending_recovery is not None:
            cause, since_s = self.pending_recovery
            self.pending_recovery = None
            duration_s = self.now_s() - since_s
            lost = self.last_lost_steps
            self.record(
                EventKind.RECOVERY,
                f"recovered: step {report.step} done {duration_s:.2f} s after the failure, "
                f"{lost} steps lost",
                recovery_s=duration_s,
                lost_steps=lost,
                step=report.step,
                cause=cause,
            )
            self.journal.notify("on_recovery", cause, duration_s, lost)

    def finish(self) -> None:
        """All steps done: save the final state, stop the workers."""
        try:
            if self.last_checkpoint_step != self.next_step:
                self.save_checkpoint()
        except WorkerLost as exc:
            # Every step is committed; only the final checkpoint is missing. Recover to save it.
            self.on_failure(exc)
            return
        self.stop_workers()
        self.record(
            EventKind.FINISHED,
            f"finished {self.next_step} steps: {self.failure_count} failures, "
            f"{self.lost_steps_total} steps lost",
            steps=self.next_step,
            failure_count=self.failure_count,
            lost_steps_total=self.lost_steps_total,
        )
        self.enter(FinishedState(self.now_s(), steps=self.next_step))

    # -- internals ---------------------------------------------------------------------------

    def _salvage(self, restore: RestoreSource | None) -> int | None:
        """Save state read from survivors if it is newer than the latest checkpoint."""
        latest = self.checkpoints.latest()
        latest_step = latest.step if latest else None
        if restore is None or restore.kind is not RestoreKind.REPLICAS or not restore.states:
            return latest_step
        if latest_step is not None and latest_step >= restore.resume_step:
            return latest_step
        try:
            ref = self.checkpoints.save(restore.resume_step, restore.states, self.run_meta())
        except Exception as exc:
            self.record(EventKind.CHECKPOINT, f"final checkpoint failed: {exc}", error=str(exc))
            return latest_step
        self.record(
            EventKind.CHECKPOINT, f"saved survivors' state at step {ref.step}", step=ref.step
        )
        return ref.step

    def stop_workers(self) -> None:
        try:
            self.workers.stop()
        except Exception as exc:  # stop is best effort: the workers may be gone already
            self.journal.logger.warning("stopping workers failed: %s", exc)
