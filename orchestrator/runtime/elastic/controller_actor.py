"""The controller as a named Ray actor per run, and the driver side that follows it.

The actor (``num_cpus=0``, named ``orchestrator-controller-<job name>`` in the ``orchestrator``
namespace, pinned to the driver's node so its metrics port and checkpoint paths are the driver's)
hosts a :class:`~orchestrator.runtime.elastic.session.Session`: the controller with the Ray ports,
the telemetry server and callbacks. ``run()`` steps the controller until FINISHED or FAILED on
one thread; ``progress()``, ``status()`` and ``post_node_event()`` answer on others.

The driver (:func:`run_elastic`) checks everything that needs no actor, creates the actor (and
refuses, naming the fix, while a live run of the same job name holds it: two drivers must never
share one controller), prints its progress lines while ``run()`` is pending and returns its
:class:`~orchestrator.runtime.elastic.summary.RunSummary`. The actor belongs to the driver: when
the driver dies, Ray ends the actor and its workers, and a restarted driver starts a new
controller, which resumes from the latest checkpoint and the run state stored with it (failures
so far, lost steps, measured slowdowns). Fixed-plan and planned runs take this one path.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

from orchestrator.errors import PermanentError, UserError
from orchestrator.runtime.discovery import RayNode, connect, discover_nodes, one_backend
from orchestrator.runtime.elastic.session import ElasticJob, Session, build_session
from orchestrator.runtime.elastic.summary import RunSummary
from orchestrator.runtime.elastic.updates import RunUpdate
from orchestrator.runtime.validation import validate_model, validate_plan_for_cluster

NAMESPACE = "orchestrator"
Printer = Callable[[str], None]


class RunFailedError(PermanentError):
    """The elastic run ended FAILED (failure budget spent, no devices, or a bug in a step)."""


def actor_name(job_name: str) -> str:
    return f"orchestrator-controller-{job_name}"


@ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)
class ControllerActor:
    """Hosts one run's controller (see the module docstring)."""

    def __init__(self, spec: ElasticJob) -> None:
        self._session: Session = build_session(spec)
        self._result: RunSummary | None = None
        self._lock = threading.Lock()

    def run(self) -> RunSummary:
        """Step the controller to the end (once; later calls return the same summary)."""
        with self._lock:
            if self._result is None:
                self._result = self._session.run()
            return self._result

    def progress(self, cursor: int, steps: bool = True) -> tuple[list[str], int]:
        """Progress lines after ``cursor`` (the one-per-step lines only if ``steps``), and the
        new cursor."""
        return self._session.progress.since(cursor, steps=steps)

    def updates(self, cursor: int) -> tuple[list[RunUpdate], int]:
        """Typed updates after ``cursor``, and the new cursor."""
        return self._session.progress.updates_since(cursor)

    def status(self) -> RunSummary:
        """The run's figures so far."""
        return self._session.summary()

    def metrics_url(self) -> str | None:
        telemetry = self._session.telemetry
        return telemetry.url if telemetry is not None else None

    def post_node_event(self, node: str, event: str, deadline_s: float | None = None) -> None:
        """Tell the probe of a node event (the same as ``POST /v1/node-events``)."""
        self._session.probe.post_node_event(node, event, deadline_s)

    def emulate_slowdown(self, node: str, factor: float) -> dict[str, Any]:
        """Make an emulated node run ``factor`` times slower than its labelled speed while the
        run goes on (1.0: back to it), standing in for thermal throttling. ``node``: Ray node
        id, unique id prefix, host name or name label. Emulation only: workers on real GPUs
        ignore it. Returns the node id and the ranks running there now."""
        from orchestrator.runtime.elastic.probe import resolve_node

        node_id = resolve_node(node)
        ranks = self._session.workers.set_throttle(node_id, factor)
        return {"node_id": node_id, "factor": factor, "ranks": ranks, "emulated": True}


def start_controller(spec: ElasticJob, *, wait_for_old_s: float = 10.0) -> Any:
    """Create the run's controller actor on this node.

    A live actor of the same name belongs to another driver's run (or to a driver that just died,
    whose actor Ray ends within seconds: waited for up to ``wait_for_old_s``); attaching to it
    would mix two runs, so that is refused with the fix.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = actor_name(spec.job.name)
    deadline_s = time.monotonic() + wait_for_old_s
    while _alive(name) and time.monotonic() < deadline_s:
        time.sleep(0.5)
    if _alive(name):
        raise UserError(
            f"a run of job {spec.job.name!r} is still live (Ray actor {name!r} in namespace "
            f"{NAMESPACE!r})",
            field="name",
            fix="wait for it to end, stop its driver, or give this job another name",
        )
    here = ray.get_runtime_context().get_node_id()
    return ControllerActor.options(  # type: ignore[attr-defined]
        name=name,
        namespace=NAMESPACE,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(spec)


def _alive(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


class RunHandle:
    """A run on its controller actor, for programs that follow it (the driver, the demo, the
    benchmarks): typed updates and progress lines while it runs, its summary at the end."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._done = actor.run.remote()
        self._line_cursor = 0
        self._update_cursor = 0

    @classmethod
    def start(cls, spec: ElasticJob) -> RunHandle:
        """Start the run's controller actor (see :func:`start_controller`) and its ``run()``."""
        return cls(start_controller(spec))

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the run to end; True when it has."""
        ready, _ = ray.wait([self._done], timeout=timeout_s)
        return bool(ready)

    def lines(self, *, steps: bool = True) -> list[str]:
        """Progress lines since the last call, with the one-per-step lines unless ``steps`` is
        False (for people: never parse them). The lines of a plan come before its
        :class:`PlanApplied` update: after seeing the update, the next call includes them."""
        lines, self._line_cursor = ray.get(self.actor.progress.remote(self._line_cursor, steps))
        return list(lines)

    def updates(self) -> list[RunUpdate]:
        """Typed updates since the last call: PlanApplied, StepDone and RunEvent, in order."""
        updates, self._update_cursor = ray.get(self.actor.updates.remote(self._update_cursor))
        return list(updates)

    def status(self) -> RunSummary:
        """The run's figures so far."""
        summary: RunSummary = ray.get(self.actor.status.remote())
        return summary

    def result(self) -> RunSummary:
        """The run's summary (waits for the end)."""
        summary: RunSummary = ray.get(self._done)
        return summary

    def metrics_url(self) -> str | None:
        url: str | None = ray.get(self.actor.metrics_url.remote())
        return url

    def stop(self) -> None:
        """End the controller actor (and so its workers); safe to call twice."""
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.actor, no_restart=True)


def follow(handle: RunHandle, out: Printer, poll_s: float = 0.5) -> RunSummary:
    """Print the run's progress lines until it ends; return its summary."""
    while True:
        done = handle.wait(poll_s)
        for line in handle.lines():
            out(line)
        if done:
            return handle.result()


def check_and_connect(spec: ElasticJob) -> list[RayNode]:
    """Every check that needs no actor: the model factory (before Ray is touched), then the
    fixed plan against the live nodes. Returns the live nodes."""
    job = spec.job
    num_layers = job.model.shape.num_planner_layers
    validate_model(spec.worker_job, num_layers)
    connect(job.cluster.address)
    nodes = discover_nodes()
    plan = spec.plan
    if plan is not None:
        validate_plan_for_cluster(plan, nodes, num_layers)
    return nodes


def describe_cluster(job_name: str, nodes: list[RayNode]) -> str:
    """One line: the job, its nodes and devices, and which device types are emulated."""
    devices: Counter[str] = Counter()
    for n in nodes:
        devices[n.device_type or "unknown"] += n.num_devices
    emulated = sorted({n.device_type for n in nodes if n.emulated})
    _, mixed = one_backend(nodes)
    return (
        f"job {job_name}: {len(nodes)} nodes, devices "
        + ", ".join(f"{t} x{c}" for t, c in sorted(devices.items()))
        + (f"; emulated speeds on {', '.join(emulated)}" if emulated else "")
        + (f"; {mixed}" if mixed else "")
    )


def run_elastic(spec: ElasticJob, out: Printer = print, *, keep_actor: bool = False) -> RunSummary:
    """Check, then run ``spec`` through its controller actor; raise :class:`RunFailedError` if
    it failed. ``keep_actor``: leave the finished actor alive (tests read its status)."""
    nodes = check_and_connect(spec)
    out(describe_cluster(spec.job.name, nodes))
    handle = RunHandle.start(spec)
    url = handle.metrics_url()
    if url:
        out(f"metrics: {url}/metrics")
    try:
        summary = follow(handle, out)
    finally:
        if not keep_actor:
            handle.stop()
    if not summary.finished:
        resume = (
            f"; resume from the checkpoint at step {summary.checkpoint_step}"
            if summary.checkpoint_step is not None
            else "; no checkpoint to resume from"
        )
        raise RunFailedError(f"run failed: {summary.reason}{resume}")
    tag = " (emulated)" if summary.emulated else ""
    nan = float("nan")
    first = summary.first_loss if summary.first_loss is not None else nan
    last = summary.last_loss if summary.last_loss is not None else nan
    out(
        f"done: {summary.steps} steps ({summary.steps_run} run here), loss {first:.4f} -> "
        f"{last:.4f}, mean step {summary.mean_step_s:.4f} s{tag}; {summary.failure_count} "
        f"failures, {summary.lost_steps_total} steps lost"
    )
    return summary
