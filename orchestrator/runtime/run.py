"""Run a job with a fixed plan on the current Ray cluster (what ``orchestrator run`` does).

Order matters: everything that can be checked without actors is checked first (the job spec, the
model factory, the plan file, the plan against the live cluster), so a mistake is one line and no
actor ever starts. Then the worker group launches (from the newest good checkpoint if there is
one), steps, checkpoints every ``checkpoint.interval_steps`` and at the end, and stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.control.callbacks import ControllerCallback
from orchestrator.control.events import ControllerStateName, StepReport
from orchestrator.errors import SpecError, UserError
from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.discovery import RayNode, cluster_from_nodes, discover_nodes
from orchestrator.runtime.group import GroupOptions, WorkerGroup
from orchestrator.runtime.jobs import worker_job
from orchestrator.runtime.validation import validate_model, validate_plan_for_cluster
from orchestrator.spec.job import JobSpec
from orchestrator.spec.loading import load_plan
from orchestrator.spec.plan import Plan
from orchestrator.spec.profiles import ProfileSet

Printer = Callable[[str], None]


@dataclass(frozen=True)
class RunSummary:
    """What a finished run reports."""

    steps_run: int
    first_loss: float
    last_loss: float
    mean_step_s: float
    emulated: bool
    last_checkpoint: Path | None


@dataclass(frozen=True)
class ChosenPlan:
    plan: Plan
    predicted_step_s: float
    bound_step_s: float
    source: str  # "file <path>" or "planner"


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` ("auto": the one this process runs in)."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        raise UserError(
            f"cannot connect to a Ray cluster at {address!r}: {str(exc).splitlines()[0]}",
            field="cluster.address",
            fix="start one with `ray start --head`, or set cluster.address / --address",
        ) from None


def load_profiles(job: JobSpec, job_file: Path) -> ProfileSet | None:
    if job.profiles is None:
        return None
    return ProfileSet.load([job.resolve_path(job.profiles, job_file)]).for_model(
        job.model.shape.name
    )


def choose_plan(
    job: JobSpec, job_file: Path, nodes: Sequence[RayNode], plan_file: Path | None
) -> ChosenPlan:
    """The job's plan file (estimated by the cost model), or the planner's choice."""
    from orchestrator.costmodel import estimate_plan
    from orchestrator.planner import make_plan

    cluster = cluster_from_nodes(nodes)
    # The workers run tensor-parallel degree 1 only, so the planner must not choose more.
    training = job.training.planner_spec().model_copy(update={"max_tensor_parallel": 1})
    profiles = load_profiles(job, job_file)
    path = plan_file or (job.resolve_path(job.plan, job_file) if job.plan else None)
    if path is None:
        result = make_plan(cluster, job.model.shape, training, profiles)
        return ChosenPlan(
            result.plan, result.estimate.step_time_s, result.bound_step_time_s, "planner"
        )
    plan = load_plan(path)
    if plan.global_batch_size != training.global_batch_size:
        raise SpecError(
            f"plan {path} has global_batch_size {plan.global_batch_size} but the job's training "
            f"has {training.global_batch_size}",
            field="training.global_batch_size",
            fix="make them equal, or re-plan for this job",
        )
    validate_plan_for_cluster(plan, nodes, job.model.shape.num_planner_layers)
    estimate = estimate_plan(
        plan, cluster, job.model.shape, training, profiles, schedule=job.training.schedule.value
    )
    return ChosenPlan(plan, estimate.step_time_s, float("nan"), f"file {path}")


def describe_plan(plan: Plan) -> list[str]:
    lines = []
    for i, replica in enumerate(plan.replicas):
        stages = " ".join(f"[{s.layers[0]},{s.layers[1]})@{s.device_type}" for s in replica.stages)
        lines.append(f"  replica {i}: batch {replica.batch_size}, stages {stages}")
    return lines


class _SafeCallbacks:
    """Calls each callback, never letting a broken exporter fail the run."""

    def __init__(self, callbacks: Sequence[ControllerCallback], out: Printer) -> None:
        self._callbacks = list(callbacks)
        self._out = out

    def __call__(self, hook: str, *args: Any) -> None:
        for cb in self._callbacks:
            try:
                getattr(cb, hook)(*args)
            except Exception as exc:  # telemetry must not stop training
                self._out(f"warning: callback {type(cb).__name__}.{hook} failed: {exc}")


def run_job(
    job: JobSpec,
    job_file: Path,
    *,
    plan_file: Path | None = None,
    steps: int | None = None,
    callbacks: Sequence[ControllerCallback] = (),
    out: Printer = print,
    metrics_port: int | None = None,
) -> RunSummary:
    """Check, launch, train ``steps`` (default: the job's), checkpoint, stop.

    Without a plan file the run is elastic: the controller actor plans, watches the cluster and
    re-plans (``orchestrator.runtime.elastic``); it serves its own metrics on ``metrics_port``
    (``callbacks`` apply to the fixed-plan run only). With a plan file the plan is fixed.
    """
    wjob = worker_job(job, job_file)
    num_layers = job.model.shape.num_planner_layers
    # The factory is imported and its layer count checked before anything touches Ray.
    validate_model(wjob, num_layers)
    connect(job.cluster.address)
    if plan_file is None and job.plan is None:
        return _run_elastic(job, job_file, wjob, steps, metrics_port, out)
    nodes = discover_nodes()
    chosen = choose_plan(job, job_file, nodes, plan_file)
    validate_plan_for_cluster(chosen.plan, nodes, num_layers)
    notify = _SafeCallbacks(callbacks, out)
    emulated_types = sorted({n.device_type for n in nodes if n.emulated})
    tag = " (emulated)" if emulated_types else ""
    out(
        f"job {job.name}: {len(nodes)} nodes, devices "
        + ", ".join(f"{t} x{c}" for t, c in sorted(cluster_from_nodes(nodes).device_counts.items()))
        + (f"; emulated speeds on {', '.join(emulated_types)}" if emulated_types else "")
    )
    out(f"plan ({chosen.source}): predicted step {chosen.predicted_step_s:.4f} s{tag}")
    for line in describe_plan(chosen.plan):
        out(line)
    states, start_step = _resume(job, job_file, notify, out)
    total = steps if steps is not None else job.training.steps
    if start_step >= total:
        out(f"nothing to do: the checkpoint is at step {start_step} of {total}")
        return RunSummary(0, float("nan"), float("nan"), 0.0, False, None)
    options = GroupOptions(
        placement_timeout_s=job.cluster.placement_timeout_s,
        rendezvous_timeout_s=job.cluster.rendezvous_timeout_s,
    )
    group = WorkerGroup(wjob, options)
    notify("on_state", ControllerStateName.LAUNCHING)
    try:
        group.launch(chosen.plan, states, start_step)
        notify("on_emulated", group.emulated)
        notify("on_plan", chosen.plan, chosen.predicted_step_s, chosen.bound_step_s, "initial")
        notify("on_state", ControllerStateName.RUNNING)
        reports, last_ckpt = _train(job, job_file, group, start_step, total, notify, out, tag)
        notify("on_state", ControllerStateName.FINISHED)
    except BaseException:
        notify("on_state", ControllerStateName.FAILED)
        raise
    finally:
        group.stop()
    if not reports:
        return RunSummary(0, float("nan"), float("nan"), 0.0, group.emulated, last_ckpt)
    summary = RunSummary(
        steps_run=len(reports),
        first_loss=reports[0].loss,
        last_loss=reports[-1].loss,
        mean_step_s=sum(r.step_duration_s for r in reports) / len(reports),
        emulated=group.emulated,
        last_checkpoint=last_ckpt,
    )
    out(
        f"done: {summary.steps_run} steps, loss {summary.first_loss:.4f} -> "
        f"{summary.last_loss:.4f}, mean step {summary.mean_step_s:.4f} s{tag}"
    )
    return summary


def _run_elastic(
    job: JobSpec,
    job_file: Path,
    wjob: WorkerJob,
    steps: int | None,
    metrics_port: int | None,
    out: Printer,
) -> RunSummary:
    from orchestrator.runtime.elastic.controller_actor import run_elastic
    from orchestrator.runtime.elastic.session import ElasticJob

    spec = ElasticJob(
        job_json=job.model_dump_json(),
        job_file=str(Path(job_file).resolve()),
        worker_job=wjob,
        steps=steps,
        metrics_port=metrics_port,
    )
    summary = run_elastic(spec, out)
    path = summary["checkpoint_path"]
    result = RunSummary(
        steps_run=summary["steps_run"],
        first_loss=summary["first_loss"] if summary["steps_run"] else float("nan"),
        last_loss=summary["last_loss"] if summary["steps_run"] else float("nan"),
        mean_step_s=summary["mean_step_s"],
        emulated=summary["emulated"],
        last_checkpoint=Path(path) if path else None,
    )
    tag = " (emulated)" if result.emulated else ""
    out(
        f"done: {summary['steps']} steps ({result.steps_run} run here), loss "
        f"{result.first_loss:.4f} -> {result.last_loss:.4f}, mean step {result.mean_step_s:.4f} s"
        f"{tag}; {summary['failure_count']} failures, {summary['lost_steps_total']} steps lost"
    )
    return result


def _resume(
    job: JobSpec, job_file: Path, notify: _SafeCallbacks, out: Printer
) -> tuple[dict[int, dict[str, Any]] | None, int]:
    if job.checkpoint is None or not job.checkpoint.resume:
        return None, 0
    from orchestrator.worker.checkpoint import load_latest

    started = time.perf_counter()
    found = load_latest(job.resolve_path(job.checkpoint.dir, job_file))
    if found is None:
        return None, 0
    for problem in found.skipped:
        out(f"checkpoint {problem.path} skipped: {problem.reason}")
    out(f"resuming from {found.path} (step {found.step})")
    notify("on_checkpoint", "load", time.perf_counter() - started)
    return found.layer_states, found.step


def _train(
    job: JobSpec,
    job_file: Path,
    group: WorkerGroup,
    start_step: int,
    total: int,
    notify: _SafeCallbacks,
    out: Printer,
    tag: str,
) -> tuple[list[StepReport], Path | None]:
    reports: list[StepReport] = []
    last_ckpt: Path | None = None
    interval = job.checkpoint.interval_steps if job.checkpoint else 0
    for step in range(start_step, total):
        report = group.step()
        reports.append(report)
        notify("on_step", report, float("nan"))
        out(
            f"step {step + 1}/{total} loss {report.loss:.4f} step {report.step_duration_s:.4f} s "
            f"{report.throughput_samples_per_s:.1f} samples/s{tag}"
        )
        done = step + 1
        if job.checkpoint and ((interval and done % interval == 0) or done == total):
            last_ckpt = _save(job, job_file, group, done, notify, out)
    return reports, last_ckpt


def _save(
    job: JobSpec,
    job_file: Path,
    group: WorkerGroup,
    done: int,
    notify: _SafeCallbacks,
    out: Printer,
) -> Path:
    from orchestrator.worker.checkpoint import save_checkpoint

    assert job.checkpoint is not None and group.plan is not None
    started = time.perf_counter()
    states = group.fetch_layer_states()
    path = save_checkpoint(job.resolve_path(job.checkpoint.dir, job_file), done, states, group.plan)
    notify("on_checkpoint", "save", time.perf_counter() - started)
    out(f"checkpoint: step {done} -> {path}")
    return path
