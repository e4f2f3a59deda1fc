"""A node killed mid-step under a pipelined plan: the survivors are freed and kept.

Three one-GPU pool nodes run a plan of two replicas: replica 0 a two-stage pipeline (layers
[0, 3) on node 0, [3, 6) on node 1), replica 1 the whole model on node 2. Node 1 (stage 1 of the
pipeline) is SIGKILLed while a step is in flight, so node 0's rank waits in a point-to-point
exchange with it and node 2's in the gradient all-reduce. Every layer still has a live copy
(node 2 holds them all), so the recovery must restore from the survivors' state: no step lost,
both survivors' actors kept (same actor, same process), none started, and no survivor left to
wait out the grace for a stuck step (``INFLIGHT_GRACE_S``). The run then trains on to the end and
matches uninterrupted single-process training.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest
import ray
from elastic_helpers import (
    ReplicaPerDevice,
    add_pool_node,
    drive,
    elastic_spec,
    max_relative_error,
    reference,
    remove_pool,
    tiny_job_spec,
)
from ray_plans import GLOBAL_BATCH, NUM_PLANNER_LAYERS

from orchestrator.control.events import EventKind
from orchestrator.control.ports import PlanProposal
from orchestrator.runtime.elastic.session import build_session
from orchestrator.runtime.elastic.survivors import INFLIGHT_GRACE_S
from orchestrator.runtime.local_nodes import crash_node
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.snapshot import ClusterSnapshot

STEPS = 12
KILL_AT_STEP = 5
CUT = 3  # the pipeline's stage 0 holds layers [0, 3), stage 1 [3, 6)


class PipelineThenReplicas:
    """With all three nodes: the pipelined plan of the module docstring; with fewer: a
    whole-model replica per device."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.fallback = ReplicaPerDevice()

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        alive = {n.node_id: n.device_type for n in snapshot.nodes}
        if set(self.nodes) - set(alive):
            return self.fallback(snapshot, slowdown_by_node)
        n0, n1, n2 = self.nodes
        half = GLOBAL_BATCH // 2
        replicas = (
            ReplicaSpec(
                batch_size=half,
                stages=(
                    StageSpec(layers=(0, CUT), device_type=alive[n0], node=n0),
                    StageSpec(layers=(CUT, NUM_PLANNER_LAYERS), device_type=alive[n1], node=n1),
                ),
            ),
            ReplicaSpec(
                batch_size=GLOBAL_BATCH - half,
                stages=(StageSpec(layers=(0, NUM_PLANNER_LAYERS), device_type=alive[n2], node=n2),),
            ),
        )
        plan = Plan(global_batch_size=GLOBAL_BATCH, microbatch_size=2, replicas=replicas)
        return PlanProposal(plan, predicted_step_s=1.0, bound_step_s=0.5)


@pytest.mark.slow
def test_a_stage_killed_mid_step_frees_and_keeps_the_survivors(ray_cluster) -> None:
    pool = "pipeline-kill"
    nodes = [add_pool_node(ray_cluster, pool) for _ in range(3)]
    ids = [n.node_id for n in nodes]
    job = tiny_job_spec(
        "elastic-pipeline-kill",
        STEPS,
        elasticity={"switch_threshold": 0.0, "initial_backoff_s": 0.0, "poll_interval_s": 0.3},
    )
    session = build_session(elastic_spec(job, pool), serve=False)
    session.controller.planner = PipelineThenReplicas(ids)
    before: dict[str, tuple[str, int]] = {}
    after: dict[str, tuple[str, int]] = {}
    killed_at: list[float] = []

    def actors() -> dict[str, tuple[str, int]]:
        """Node -> (actor id, process id) of its worker."""
        group = session.workers._group
        assert group is not None
        return {
            w.node_id: (a._actor_id.hex(), ray.get(a.ping.remote()))
            for a, w in zip(group._actors, group.workers, strict=True)
        }

    def kill_mid_step() -> None:
        before.update(actors())

        def crash() -> None:
            killed_at.append(time.time())
            crash_node(ray_cluster, nodes[1])

        # The next step starts as soon as this returns; the kill lands inside it.
        threading.Timer(0.15, crash).start()

    def last() -> None:
        after.update(actors())

    try:
        drive(session, {KILL_AT_STEP: kill_mid_step, STEPS - 1: last}, limit_s=400.0)
        summary = session.summary()
        final = session.checkpoints.load(STEPS)
    finally:
        session.workers.stop()
        remove_pool(ray_cluster, nodes)

    assert summary.finished, summary.reason
    assert killed_at, "the kill never ran"
    events = session.controller.events
    messages = [e.message for e in events]
    failure = next(e for e in events if e.kind is EventKind.FAILURE)
    assert failure.data["lost_nodes"] == [ids[1]], failure.message
    restores = [e.data for e in events if e.kind is EventKind.RECOVERY and "restore" in e.data]
    assert restores and restores[0]["restore"] == "replicas", messages
    assert summary.lost_steps_total == 0 and summary.step_indices == tuple(range(STEPS))
    # Both survivors kept: the same actors and processes before the kill and at the end, none
    # started for the recovery, and the recovery did not wait out a stuck step's grace.
    assert {ids[0], ids[2]} <= set(before) and set(after) == {ids[0], ids[2]}, (before, after)
    assert after == {n: before[n] for n in after}, (before, after)
    launch = next(
        e
        for e in events
        if e.kind is EventKind.PLAN_CHOSEN and e.time_s >= killed_at[0] and "launched" in e.message
    )
    assert launch.data["actors_started"] == 0, launch.message
    assert "2 actors kept" in launch.message, launch.message
    done = next(e for e in events if e.kind is EventKind.RECOVERY and "recovery_s" in e.data)
    assert done.data["recovery_s"] < INFLIGHT_GRACE_S, done.message
    _, want_params = reference(job, STEPS)
    assert max_relative_error(final, want_params) < 1e-4
