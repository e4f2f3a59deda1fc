"""The elastic controller on a real local Ray cluster: SIGKILL a node, drain one, add one.

One run on a pool of three one-GPU nodes (fake GPUs, emulated speed), every layer replicated on
every device (``ReplicaPerDevice``), the controller stepped in this process with the real Ray
ports: after step 4 a node is SIGKILLed (``crash_node``: the raylet and its workers); after step 8
another gets a preemption notice through Ray's drain API; after step 12 a new node joins (its
worker warms while training goes on, so the run is ended a few steps after the join's switch
rather than at a fixed step). The step counter never goes back, no step is lost, and the final
parameters and every loss equal uninterrupted single-process training on the same data order.
The survivor's actor (same Ray actor id, same process id) trains through every change of plan,
and each re-formation reports the bytes it moved.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import ray
from elastic_helpers import (
    ReplicaPerDevice,
    add_pool_node,
    drain,
    elastic_spec,
    max_relative_error,
    reference,
    remove_pool,
    tiny_job_spec,
)

from orchestrator.control.events import EventKind
from orchestrator.runtime.elastic.session import build_session
from orchestrator.runtime.local_nodes import crash_node

MAX_STEPS = 400  # the run is ended 3 steps after the join's plan launched


def _drive_past_the_join(session, actions, last, limit_s: float = 400.0) -> int:
    """Step the controller, calling ``actions[k]`` once ``k`` steps are committed; once the
    join's plan has launched, end the run 3 steps later (``last`` just before); the steps run."""
    c = session.controller
    pending = dict(sorted(actions.items()))
    end_at: int | None = None
    started = time.monotonic()
    while not c.done:
        c.step()
        for at in [k for k in pending if c.next_step >= k]:
            pending.pop(at)()
        if end_at is None and any(
            e.kind is EventKind.PLAN_CHOSEN and e.data.get("reason") == "join" for e in c.events
        ):
            end_at = c.next_step + 3
            c.ctx.config = dataclasses.replace(c.ctx.config, total_steps=end_at)
        if end_at is not None and last is not None and c.next_step >= end_at - 1:
            last()
            last = None
        assert time.monotonic() - started < limit_s, f"run not done after {limit_s:.0f} s"
    assert end_at is not None, "the join never switched"
    return end_at


@pytest.mark.slow
def test_kill_drain_and_join_lose_no_step(ray_cluster) -> None:
    pool = "recovery"
    nodes = [add_pool_node(ray_cluster, pool) for _ in range(3)]
    job = tiny_job_spec(
        "elastic-recovery",
        MAX_STEPS,
        elasticity={"switch_threshold": 0.0, "initial_backoff_s": 0.0, "poll_interval_s": 0.3},
    )
    session = build_session(elastic_spec(job, pool), serve=False)
    session.controller.planner = ReplicaPerDevice()
    killed, drained = nodes[0].node_id, nodes[1].node_id
    joined: list = []

    survivor: dict[str, tuple[str, int]] = {}
    placement: dict[int, str] = {}

    def actor_on(node_id: str) -> tuple[str, int]:
        """(actor id, process id) of the worker on ``node_id``."""
        group = session.workers._group
        assert group is not None
        pairs = zip(group._actors, group.workers, strict=True)
        [actor] = [a for a, w in pairs if w.node_id == node_id]
        return actor._actor_id.hex(), ray.get(actor.ping.remote())

    def kill() -> None:
        survivor["before"] = actor_on(nodes[2].node_id)
        crash_node(ray_cluster, nodes[0])

    def preempt() -> None:
        drain(ray_cluster, drained, time.time() + 120.0)

    def join() -> None:
        joined.append(add_pool_node(ray_cluster, pool))

    try:

        def last() -> None:  # before the run ends and stops its workers
            survivor["after"] = actor_on(nodes[2].node_id)
            placement.update(session.workers.placement())

        steps = _drive_past_the_join(session, {4: kill, 8: preempt, 12: join}, last)
        summary = session.summary()
        final = session.checkpoints.load(steps)
    finally:
        session.workers.stop()
        remove_pool(ray_cluster, nodes + joined)

    assert summary.finished, summary.reason
    # The step counter never goes back: every step ran exactly once, in order.
    assert summary.step_indices == tuple(range(steps))
    assert summary.lost_steps_total == 0
    assert summary.failure_count == 1
    events = session.controller.events
    failure = next(e for e in events if e.kind is EventKind.FAILURE)
    assert failure.data["lost_nodes"] == [killed], failure.message
    restores = [e.data for e in events if e.kind is EventKind.RECOVERY and "restore" in e.data]
    assert restores and restores[0]["restore"] == "replicas" and restores[0]["lost_steps"] == 0
    notices = [e for e in events if e.kind is EventKind.PREEMPTION_NOTICE]
    assert any(e.data.get("node") == drained for e in notices), [e.message for e in events]
    assert any(e.kind is EventKind.REPLAN and e.data.get("trigger") == "join" for e in events), [
        e.message for e in events
    ]
    # The final plan runs on the surviving node and the new one, nowhere else.
    assert set(placement.values()) == {nodes[2].node_id, joined[0].node_id}

    # The survivor kept its actor and process through the crash, the drain and the join.
    assert survivor["after"] == survivor["before"], survivor
    launches = [e for e in events if e.kind is EventKind.PLAN_CHOSEN and "bytes_moved" in e.data]
    reformed = [e for e in launches if e.data["bytes_moved"] is not None]
    assert len(reformed) >= 3, [e.message for e in launches]  # crash, drain, join
    assert all("re-formed in place" in e.message for e in reformed)
    # Whole-model replicas: the crash moves nothing, the join sends one replica to the new node.
    assert reformed[0].data["bytes_moved"] == 0, reformed[0].message
    assert reformed[-1].data["bytes_moved"] > 0, reformed[-1].message

    want_losses, want_params = reference(job, steps)
    for got, want in zip(summary.losses, want_losses, strict=True):
        assert abs(got - want) <= 1e-4 * abs(want), (summary.losses, want_losses)
    assert max_relative_error(final, want_params) < 1e-4
