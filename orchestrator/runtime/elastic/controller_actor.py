"""The elastic controller as a named Ray actor per run, and the driver side that follows it.

The actor (``num_cpus=0``, named ``orchestrator-controller-<job name>`` in the ``orchestrator``
namespace, pinned to the driver's node so its metrics port and checkpoint paths are the driver's)
hosts a :class:`~orchestrator.runtime.elastic.session.Session`: the controller with the Ray ports,
the telemetry server and callbacks. ``run()`` steps the controller until FINISHED or FAILED on
one thread; ``progress()``, ``status()`` and ``post_node_event()`` answer on others.

The driver (:func:`run_elastic`) creates the actor or, if one of that name is alive, attaches to
it (``get_if_exists``), prints its progress lines while ``run()`` is pending and returns its
summary. The actor belongs to the driver: when the driver dies, Ray ends the actor and its
workers, and a restarted driver starts a new controller, which resumes from the latest checkpoint
and the run state stored with it (failures so far, lost steps, measured slowdowns).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray

from orchestrator.errors import PermanentError
from orchestrator.runtime.elastic.session import ElasticJob, Session, build_session

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
        self._result: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def run(self) -> dict[str, Any]:
        """Step the controller to the end (once; later calls return the same summary)."""
        with self._lock:
            if self._result is None:
                self._result = self._session.run()
            return self._result

    def progress(self, cursor: int) -> tuple[list[str], int]:
        """Progress lines after ``cursor``, and the new cursor."""
        return self._session.progress.since(cursor)

    def status(self) -> dict[str, Any]:
        """The run's figures so far (the summary's shape)."""
        return self._session.summary()

    def metrics_url(self) -> str | None:
        telemetry = self._session.telemetry
        return telemetry.url if telemetry is not None else None

    def post_node_event(self, node: str, event: str, deadline_s: float | None = None) -> None:
        """Tell the probe of a node event (the same as ``POST /v1/node-events``)."""
        self._session.probe.post_node_event(node, event, deadline_s)


def start_controller(spec: ElasticJob) -> Any:
    """Create the run's controller actor on this node, or attach to the live one of that name."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return ControllerActor.options(  # type: ignore[attr-defined]
        name=actor_name(spec.job.name),
        namespace=NAMESPACE,
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(spec)


def follow(actor: Any, out: Printer, poll_s: float = 0.5) -> dict[str, Any]:
    """Print the actor's progress while its ``run()`` is pending; return the run's summary."""
    done = actor.run.remote()
    cursor = 0
    while True:
        ready, _ = ray.wait([done], timeout=poll_s)
        lines, cursor = ray.get(actor.progress.remote(cursor))
        for line in lines:
            out(line)
        if ready:
            return dict(ray.get(done))


def run_elastic(
    spec: ElasticJob, out: Printer = print, *, keep_actor: bool = False
) -> dict[str, Any]:
    """Run ``spec`` through its controller actor; raise :class:`RunFailedError` if it failed.

    ``keep_actor``: leave the finished actor alive (tests read its status); else it is ended.
    """
    actor = start_controller(spec)
    url = ray.get(actor.metrics_url.remote())
    if url:
        out(f"metrics: {url}/metrics")
    try:
        summary = follow(actor, out)
    finally:
        if not keep_actor:
            ray.kill(actor, no_restart=True)
    if summary["state"] != "finished":
        checkpoint = summary.get("checkpoint_step")
        resume = (
            f"; resume from the checkpoint at step {checkpoint}"
            if checkpoint is not None
            else "; no checkpoint to resume from"
        )
        raise RunFailedError(f"run failed: {summary['reason']}{resume}")
    return summary
