"""A node event acts on the step in flight, not at the next poll.

Two one-GPU pool nodes, a replica on each (``ReplicaPerDevice``), the controller stepped in this
process with the real Ray ports and a cluster poll only every 60 s. While a step runs, another
thread posts ``node_lost`` for one node (as ``POST /v1/node-events`` does): the step in flight is
abandoned (never committed), the run recovers from the surviving replica with no step lost, and
trains on without the node. The seconds from the event to the abandonment are printed (a figure,
not an assertion: timing tests are not allowed to judge speed).
"""

from __future__ import annotations

import threading
import time

import pytest
from elastic_helpers import (
    ReplicaPerDevice,
    add_pool_node,
    drive,
    elastic_spec,
    remove_pool,
    tiny_job_spec,
)

from orchestrator.control.events import EventKind
from orchestrator.runtime.elastic.session import build_session

STEPS = 10


@pytest.mark.slow
def test_a_posted_node_loss_abandons_the_step_in_flight(ray_cluster) -> None:
    pool = "node-event"
    nodes = [add_pool_node(ray_cluster, pool) for _ in range(2)]
    job = tiny_job_spec(
        "elastic-node-event",
        STEPS,
        elasticity={"initial_backoff_s": 0.0, "poll_interval_s": 60.0},
    )
    session = build_session(elastic_spec(job, pool), serve=False)
    session.controller.planner = ReplicaPerDevice()
    lost = nodes[1].node_id
    posted: list[float] = []

    def post_soon() -> None:
        def post() -> None:
            time.sleep(0.05)  # into the next step
            posted.append(time.time())
            session.probe.post_node_event(lost[:12], "node_lost")

        threading.Thread(target=post, daemon=True).start()

    try:
        drive(session, {4: post_soon}, limit_s=300.0)
        c = session.controller
        assert c.done and c.next_step == STEPS
        failures = [e.message for e in c.journal.of_kind(EventKind.FAILURE)]
        assert c.failure_count == 1 and any("abandoned" in m for m in failures), failures
        assert c.lost_steps_total == 0
        steps = [r.step for r in session.progress.reports]
        assert steps == list(range(STEPS))  # the abandoned step was never committed
        last_plan = session.controller.ledger.proposal.plan
        assert {s.node for r in last_plan.replicas for s in r.stages} == {nodes[0].node_id}
        (abandoned,) = [m for m in failures if "abandoned" in m]
        assert lost in abandoned  # the posted node, named by a prefix, resolved to its id
        print(abandoned)  # "... step k abandoned X s after a node event reported it lost ..."
    finally:
        session.workers.stop()
        remove_pool(ray_cluster, nodes)
