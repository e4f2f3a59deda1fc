"""One elastic run in one process: the controller wired to the Ray ports, telemetry and progress.

:func:`build_session` builds everything the controller actor hosts (it runs in that actor, but
nothing here depends on being in one, so it can be driven in-process too):
:class:`~orchestrator.runtime.elastic.probe.RayClusterProbe`,
:class:`~orchestrator.runtime.elastic.group_port.RayWorkerGroupPort`, a checkpoint store,
the planner (:class:`~orchestrator.control.planning.MakePlanPlanner`, or
:class:`~orchestrator.control.planning.FixedPlanner` for a job with a plan file: a fixed plan is
the same run with a planner that always returns it), the telemetry server with its
``/metrics``, ``/v1/status`` and ``POST /v1/node-events`` (merged into the probe), the Prometheus,
status and log callbacks, and :class:`ProgressLines`, the lines the driver prints.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.config import ControllerConfig
from orchestrator.control.controller import Controller
from orchestrator.control.events import EventKind, PlanReason, RunEvent
from orchestrator.control.planning import FixedPlanner, MakePlanPlanner
from orchestrator.control.ports import CheckpointStore, Planner, SystemClock
from orchestrator.errors import SpecError, UserError
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.elastic.checkpoints import DirCheckpointStore, MemoryCheckpointStore
from orchestrator.runtime.elastic.group_port import ELASTIC_GROUP_OPTIONS, RayWorkerGroupPort
from orchestrator.runtime.elastic.probe import RayClusterProbe
from orchestrator.runtime.elastic.summary import RunSummary, summarise
from orchestrator.runtime.elastic.updates import PlanApplied, RunUpdate, StepDone
from orchestrator.runtime.jobs import worker_job
from orchestrator.spec.job import DEFAULT_CHECKPOINT_INTERVAL_STEPS, JobSpec
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileSet
from orchestrator.spec.reports import StepReport

# ``ElasticJob.from_file(metrics_port=JOB_METRICS_PORT)``: serve on the job's ``metrics.port``.
JOB_METRICS_PORT = -1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElasticJob:
    """What the controller actor needs, as plain data (the driver resolved every path).

    Build it with :meth:`from_file`. ``plan_json`` is the fixed plan of a job with a plan file
    (``plan_source`` says which file), ``None`` for a planned run.
    """

    job_json: str
    job_file: str  # absolute: checkpoint and profile paths are relative to it
    worker_job: WorkerJob
    steps: int | None = None
    metrics_port: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    plan_json: str | None = None
    plan_source: str = ""

    @classmethod
    def from_file(
        cls,
        job_file: Path | str,
        *,
        address: str | None = None,
        plan_file: Path | str | None = None,
        steps: int | None = None,
        metrics_port: int | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> ElasticJob:
        """Load the job at ``job_file`` and check it (see :meth:`from_spec`); ``address``
        overrides ``cluster.address``."""
        from orchestrator.runtime.jobs import load_job

        job = load_job(Path(job_file))
        if address:
            cluster = job.cluster.model_copy(update={"address": address})
            job = job.model_copy(update={"cluster": cluster})
        return cls.from_spec(
            job,
            job_file,
            plan_file=plan_file,
            steps=steps,
            metrics_port=metrics_port,
            node_selector=node_selector,
        )

    @classmethod
    def from_spec(
        cls,
        job: JobSpec,
        job_file: Path | str,
        *,
        plan_file: Path | str | None = None,
        steps: int | None = None,
        metrics_port: int | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> ElasticJob:
        """The run of ``job`` (paths in it are relative to ``job_file``), with its plan file (or
        ``plan_file``) loaded and checked against the job.

        ``metrics_port`` is where the run serves its metrics (``None``: nowhere;
        :data:`JOB_METRICS_PORT`: the job's ``metrics.port``). Raises
        :class:`~orchestrator.errors.UserError` naming the field and the fix.
        """
        from orchestrator.spec.loading import load_plan

        path = Path(job_file).resolve()
        if steps is not None and steps < 1:
            raise UserError(f"--steps {steps} must be >= 1", field="--steps", fix="pass 1 or more")
        plan_path = Path(plan_file) if plan_file else None
        if plan_path is None and job.plan is not None:
            plan_path = job.resolve_path(job.plan, path)
        plan = load_plan(plan_path) if plan_path is not None else None
        if plan is not None:
            plan.check_precision(job.training.explicit_precision, "plan.precision")
            plan = _auto_precision(plan, job)
        if plan is not None and plan.global_batch_size != job.training.global_batch_size:
            raise SpecError(
                f"plan {plan_path} has global_batch_size {plan.global_batch_size} but the job's "
                f"training has {job.training.global_batch_size}",
                field="training.global_batch_size",
                fix="make them equal, or re-plan for this job",
            )
        return cls(
            job_json=job.model_dump_json(),
            job_file=str(path),
            worker_job=worker_job(job, path),
            steps=steps,
            metrics_port=job.metrics.port if metrics_port == JOB_METRICS_PORT else metrics_port,
            node_selector=dict(node_selector or {}),
            plan_json=plan.model_dump_json() if plan is not None else None,
            plan_source=f"file {plan_path}" if plan_path is not None else "planner",
        )

    @property
    def job(self) -> JobSpec:
        return JobSpec.model_validate_json(self.job_json)

    @property
    def plan(self) -> Plan | None:
        """The fixed plan, or ``None`` when the controller plans."""
        return Plan.model_validate_json(self.plan_json) if self.plan_json else None

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.job.training.steps


def _auto_precision(plan: Plan, job: JobSpec) -> Plan:
    """A fixed plan without a precision, run under ``training.precision: auto``: the format
    every device type of its layout runs fast (catalog types), recorded so the workers run it."""
    from orchestrator.planner.auto_precision import with_auto_precision
    from orchestrator.spec.devices import DeviceCatalog

    catalog = DeviceCatalog.builtin()
    known = {n: catalog[n] for n in plan.device_counts() if n in catalog}
    return with_auto_precision(plan, job.training, known)


def describe_plan(plan: Plan) -> list[str]:
    """One line per replica: batch and stages ``[first,end)@type``."""
    lines = []
    for i, replica in enumerate(plan.replicas):
        stages = " ".join(f"[{s.layers[0]},{s.layers[1]})@{s.device_type}" for s in replica.stages)
        lines.append(f"  replica {i}: batch {replica.batch_size}, stages {stages}")
    return lines


class ProgressLines(ControllerCallback):
    """The run as typed updates (plans, steps, events) and as human-readable lines for the driver
    to print, and the figures of the summary. Thread-safe: the driver reads while the controller
    writes."""

    def __init__(self, total_steps: int, plan_source: str = "planner") -> None:
        self.total_steps = total_steps
        self.plan_source = plan_source
        self.lines: list[str] = []
        self._step_lines: set[int] = set()  # indices of the one-per-step lines
        self.updates: list[RunUpdate] = []
        self.reports: list[StepReport] = []
        self.emulated = False
        self._lock = threading.Lock()

    def _add(self, *lines: str, step: bool = False) -> None:
        with self._lock:
            if step:
                self._step_lines.update(range(len(self.lines), len(self.lines) + len(lines)))
            self.lines.extend(lines)

    def _update(self, update: RunUpdate) -> None:
        with self._lock:
            self.updates.append(update)

    def since(self, cursor: int, *, steps: bool = True) -> tuple[list[str], int]:
        """Lines after ``cursor`` (without the one-per-step lines unless ``steps``), and the
        new cursor."""
        with self._lock:
            end = len(self.lines)
            if steps:
                return self.lines[cursor:], end
            return [self.lines[i] for i in range(cursor, end) if i not in self._step_lines], end

    def updates_since(self, cursor: int) -> tuple[list[RunUpdate], int]:
        """Typed updates after ``cursor``, and the new cursor."""
        with self._lock:
            return self.updates[cursor:], len(self.updates)

    @property
    def tag(self) -> str:
        return " (emulated)" if self.emulated else ""

    def on_emulated(self, emulated: bool) -> None:
        self.emulated = emulated
        if emulated:
            self._add("device speeds are emulated on CPUs (orchestrator.io/emulated-speed labels)")

    def on_plan(
        self, plan: Plan, predicted_step_s: float, bound_step_s: float, reason: PlanReason
    ) -> None:
        devices = ", ".join(f"{t} x{n}" for t, n in sorted(plan.device_counts().items()))
        if plan.precision is not None:  # the format every rank computes in
            devices += f"; precision {plan.precision}"
        # The lines before the update: a reader that has seen the update gets them next.
        self._add(
            f"plan ({self.plan_source}): {devices}; predicted step {predicted_step_s:.4f} s"
            f"{self.tag} [{reason}]",
            *describe_plan(plan),
        )
        self._update(
            PlanApplied(
                time.time(),
                plan,
                predicted_step_s,
                bound_step_s,
                PlanReason(reason),
                self.plan_source,
                self.emulated,
            )
        )

    def on_step(self, report: StepReport, predicted_step_s: float) -> None:
        with self._lock:
            self.reports.append(report)
        self._update(StepDone(time.time(), report, self.total_steps))
        self._add(
            f"step {report.step + 1}/{self.total_steps} loss {report.loss:.4f} "
            f"step {report.step_duration_s:.4f} s "
            f"{report.throughput_samples_per_s:.1f} samples/s{self.tag}",
            step=True,
        )
        if report.eval_loss is not None:
            # Not a step line: those are one per step.
            self._add(f"eval loss {report.eval_loss:.4f} after step {report.eval_after_steps}")

    def on_checkpoint_skipped(self, path: Path, reason: str) -> None:
        """A published checkpoint failed verification; an older one is used instead."""
        self._add(f"checkpoint {path} skipped: {reason}")

    def on_event(self, event: RunEvent) -> None:
        self._update(event)
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

    def run(self) -> RunSummary:
        """Run to FINISHED or FAILED; stop the telemetry server; return :meth:`summary`."""
        # Ray's own drain notices are acted on within ~0.1 s, like posted ones (probe.py).
        watching = self.probe.watch_drains()
        try:
            self.controller.run()
        finally:
            watching.set()
            self.workers.stop()
            if self.telemetry is not None:
                self.telemetry.stop()
        return self.summary()

    def summary(self) -> RunSummary:
        """The run's figures so far."""
        progress = self.progress
        return summarise(
            self.controller, list(progress.reports), progress.emulated, self.checkpoints
        )


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
    config = ControllerConfig.from_spec(
        job.elasticity, total_steps=spec.total_steps, checkpoint_interval_steps=interval
    )
    progress = ProgressLines(spec.total_steps, spec.plan_source or "planner")
    store: CheckpointStore
    if job.checkpoint is not None:
        root = job.resolve_path(job.checkpoint.dir, job_file)
        store = DirCheckpointStore(
            root, resume=job.checkpoint.resume, on_skipped=progress.on_checkpoint_skipped
        )
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
    probe.on_lost = workers.abandon_on  # a posted loss ends the step in flight, not the next poll
    probe.on_drain = workers.drain_on  # a deadline before the step in flight ends abandons it
    planner = _planner(spec, job, job_file)
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


def _planner(spec: ElasticJob, job: JobSpec, job_file: Path) -> Planner:
    """The fixed plan's planner, or the search; either sees the job's profiles."""
    # Tensor-parallel stages run on the elastic workers too (a re-plan or a restore across tp
    # degrees joins and re-cuts the slices: tests/ray/test_sharded_tp.py), so tp is the job's.
    training = job.training.planner_spec()
    profiles = _profiles(job, job_file)
    plan = spec.plan
    if plan is None:
        return MakePlanPlanner(job.model.shape, training, profiles)
    from orchestrator.runtime.discovery import discover_nodes, pin_by_node_id

    return FixedPlanner(
        pin_by_node_id(plan, discover_nodes()),
        job.model.shape,
        training,
        profiles,
        schedule=job.training.schedule,
    )


def _profiles(job: JobSpec, job_file: Path) -> ProfileSet | None:
    if job.profiles is None:
        return None
    # Only files measured for this model, sequence length and dtype (`run` has named the others).
    return ProfileSet.load([job.resolve_path(job.profiles, job_file)]).fitting(job.model.shape)


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
