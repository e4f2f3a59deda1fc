"""One elastic run in one process: the controller wired to the Ray ports, telemetry and progress.

:func:`build_session` builds everything the controller actor hosts (it runs in that actor, but
nothing here depends on being in one, so it can be driven in-process too):
:class:`~orchestrator.runtime.elastic.probe.RayClusterProbe`,
:class:`~orchestrator.runtime.elastic.group_port.RayWorkerGroupPort`, a checkpoint store,
:class:`~orchestrator.control.planning.MakePlanPlanner`, the telemetry server with its
``/metrics``, ``/v1/status`` and ``POST /v1/node-events`` (merged into the probe), the Prometheus,
status and log callbacks, and :class:`ProgressLines`, the lines the driver prints.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.controller import Controller
from orchestrator.control.events import EventKind, RunEvent, StepReport
from orchestrator.control.planning import MakePlanPlanner
from orchestrator.control.ports import CheckpointStore, SystemClock
from orchestrator.control.states import FailedState, FinishedState
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore, MemoryCheckpointStore
from orchestrator.runtime.elastic.group_port import ELASTIC_GROUP_OPTIONS, RayWorkerGroupPort
from orchestrator.runtime.elastic.probe import RayClusterProbe
from orchestrator.spec.job import DEFAULT_CHECKPOINT_INTERVAL_STEPS, JobSpec
from orchestrator.spec.plan import Plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElasticJob:
    """What the controller actor needs, as plain data (the driver resolved every path)."""

    job_json: str
    job_file: str  # absolute: checkpoint and profile paths are relative to it
    worker_job: WorkerJob
    steps: int | None = None
    metrics_port: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)

    @property
    def job(self) -> JobSpec:
        return JobSpec.model_validate_json(self.job_json)

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.job.training.steps


def describe_plan(plan: Plan) -> list[str]:
    """One line per replica: batch and stages ``[first,end)@type``."""
    lines = []
    for i, replica in enumerate(plan.replicas):
        stages = " ".join(f"[{s.layers[0]},{s.layers[1]})@{s.device_type}" for s in replica.stages)
        lines.append(f"  replica {i}: batch {replica.batch_size}, stages {stages}")
    return lines


class ProgressLines(ControllerCallback):
    """Human-readable lines of the run (steps, plans, decisions), for the driver to print, and
    the figures of the summary. Thread-safe: the driver reads while the controller writes."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.lines: list[str] = []
        self.reports: list[StepReport] = []
        self.emulated = False
        self._lock = threading.Lock()

    def _add(self, *lines: str) -> None:
        with self._lock:
            self.lines.extend(lines)

    def since(self, cursor: int) -> tuple[list[str], int]:
        with self._lock:
            return self.lines[cursor:], len(self.lines)

    @property
    def tag(self) -> str:
        return " (emulated)" if self.emulated else ""

    def on_emulated(self, emulated: bool) -> None:
        self.emulated = emulated
        if emulated:
            self._add("device speeds are emulated on CPUs (orchestrator.io/emulated-speed labels)")

    def on_plan(
        self, plan: Plan, predicted_step_s: float, bound_step_s: float, reason: str
    ) -> None:
        devices = ", ".join(f"{t} x{n}" for t, n in sorted(plan.device_counts().items()))
        self._add(
            f"plan (planner): {devices}; predicted step {predicted_step_s:.4f} s{self.tag} "
            f"[{reason}]",
            *describe_plan(plan),
        )

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        with self._lock:
            self.reports.append(report)
        self._add(
            f"step {report.step + 1}/{self.total_steps} loss {report.loss:.4f} "
            f"step {report.step_duration_s:.4f} s "
            f"{report.throughput_samples_per_s:.1f} samples/s{self.tag}"
        )

    def on_event(self, event: RunEvent) -> None:
        if event.kind is not EventKind.PLAN_CHOSEN or "launched" in event.message:
            self._add(f"[{event.kind.value}] {event.message}")


@dataclass
class Session:
    """A controller with its Ray ports and telemetry."""

    spec: ElasticJob
    controller: Controller
    probe: RayClusterProbe
    workers: RayWorkerGroupPort
    checkpoints: CheckpointStore
    progress: ProgressLines
    telemetry: Any = None  # orchestrator.telemetry.Telemetry, when serving

    def run(self) -> dict[str, Any]:
        """Run to FINISHED or FAILED; stop the telemetry server; return :meth:`summary`."""
        try:
            self.controller.run()
        finally:
            self.workers.stop()
            if self.telemetry is not None:
                self.telemetry.stop()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """JSON-able figures of the run (see :func:`summarise`)."""
        return summarise(self.controller, self.progress, self.checkpoints)


def summarise(c: Controller, progress: ProgressLines, store: CheckpointStore) -> dict[str, Any]:
    """State, steps, losses, recoveries (time and lost steps), plans and events of a run."""
    from orchestrator.telemetry.status import event_to_json

    reports = list(progress.reports)
    state = c.state
    latest = store.latest()
    return {
        "state": str(state.name),
        "reason": state.reason if isinstance(state, FailedState) else "",
        "steps": state.steps if isinstance(state, FinishedState) else c.next_step,
        "steps_run": len(reports),
        "first_loss": reports[0].loss if reports else None,
        "last_loss": reports[-1].loss if reports else None,
        "mean_step_s": statistics.fmean(r.step_duration_s for r in reports) if reports else 0.0,
        "step_indices": [r.step for r in reports],
        "losses": [r.loss for r in reports],
        "emulated": progress.emulated,
        "failure_count": c.failure_count,
        "lost_steps_total": c.lost_steps_total,
        "recoveries": [
            {k: e.data.get(k) for k in ("recovery_s", "lost_steps", "step", "cause")}
            for e in c.journal.of_kind(EventKind.RECOVERY)
            if "recovery_s" in e.data
        ],
        "switch_costs_s": list(c.switch_cost.observations_s),
        "checkpoint_step": latest.step if latest else None,
        "checkpoint_path": str(latest.manifest.get("path", "")) if latest else "",
        "events": [event_to_json(e) for e in c.events],
    }


def build_session(
    spec: ElasticJob,
    *,
    serve: bool = True,
    extra_callbacks: Sequence[ControllerCallback] = (),
) -> Session:
    """Wire the controller for ``spec`` (see the module docstring); ``extra_callbacks`` see every
    hook too (an exporter of the caller's, say)."""
    job = spec.job
    job_file = Path(spec.job_file)
    # Without a checkpoint section, snapshots are still taken (in memory, by the driver): a
    # crash of a plan without replicas then resumes from the last one, not from step 0.
    interval = (
        job.checkpoint.interval_steps if job.checkpoint else DEFAULT_CHECKPOINT_INTERVAL_STEPS
    )
    config = job.elasticity.to_config(
        total_steps=spec.total_steps, checkpoint_interval_steps=interval
    )
    store: CheckpointStore
    if job.checkpoint is not None:
        root = job.resolve_path(job.checkpoint.dir, job_file)
        store = DirCheckpointStore(root, resume=job.checkpoint.resume)
    else:
        store = MemoryCheckpointStore()
    probe = RayClusterProbe(node_selector=spec.node_selector)
    options = ELASTIC_GROUP_OPTIONS.__class__(
        placement_timeout_s=job.cluster.placement_timeout_s,
        rendezvous_timeout_s=job.cluster.rendezvous_timeout_s,
        failure_grace_s=ELASTIC_GROUP_OPTIONS.failure_grace_s,
        stop_timeout_s=ELASTIC_GROUP_OPTIONS.stop_timeout_s,
    )
    workers = RayWorkerGroupPort(spec.worker_job, store, options)
    training = job.training.planner_spec().model_copy(update={"max_tensor_parallel": 1})
    planner = MakePlanPlanner(job.model.shape, training, _profiles(job, job_file))
    progress = ProgressLines(spec.total_steps)
    telemetry = _telemetry(job, spec.metrics_port, probe) if serve else None
    callbacks: list[ControllerCallback] = [progress, *extra_callbacks]
    if telemetry is not None:
        callbacks = [*telemetry.callbacks, *callbacks]
    controller = Controller(
        config=config,
        probe=probe,
        workers=workers,
        checkpoints=store,
        planner=planner,
        clock=SystemClock(),
        callbacks=callbacks,
    )
    return Session(spec, controller, probe, workers, store, progress, telemetry)


def _profiles(job: JobSpec, job_file: Path) -> Any:
    if job.profiles is None:
        return None
    from orchestrator.spec.profiles import ProfileSet

    return ProfileSet.load([job.resolve_path(job.profiles, job_file)]).for_model(
        job.model.shape.name
    )


def _telemetry(job: JobSpec, port: int | None, probe: RayClusterProbe) -> Any:
    """The run's HTTP endpoint; a port that cannot be bound is a warning, never a failed run."""
    if port is None:
        return None
    from orchestrator.errors import UserError
    from orchestrator.telemetry import NodeEvent, Telemetry

    def on_node_event(event: NodeEvent) -> None:
        probe.post_node_event(event.node, event.event, event.deadline_unix_s)

    telemetry = Telemetry(
        job.name, host=job.metrics.host, port=port, node_event_handler=on_node_event
    )
    try:
        telemetry.start()
    except UserError as exc:
        log.warning("metrics not served: %s", exc)
        return None
    return telemetry
