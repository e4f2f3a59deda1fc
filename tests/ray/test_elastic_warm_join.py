"""A join warms its new worker while the current plan trains; a posted drain acts at the next
step boundary.

One one-GPU pool node trains alone (``ReplicaPerDevice``), the controller stepped in this
process with the real Ray ports and a cluster poll only every 60 s, so only posted events make
it look. A second node is added and announced (``node_joined``, as ``POST /v1/node-events``
does): the controller decides the switch, starts the joiner's actor (which imports torch and
builds its engine) and trains on under the old plan until the actor is warm; the switch then
adopts that actor and starts none. Then a preemption notice for the first node is posted during
a step: the step finishes and the evacuation starts at that step boundary, not at the next poll.
The run ends on the joined node alone with every step committed once, in order. The seconds of
each part are printed (figures, not assertions: timing tests are not allowed to judge speed).
"""

from __future__ import annotations

import threading
import time

import pytest
from elastic_helpers import (
    ReplicaPerDevice,
    add_pool_node,
    elastic_spec,
    remove_pool,
    tiny_job_spec,
)

from orchestrator.control.events import EventKind, RunEvent
from orchestrator.runtime.elastic.session import build_session
from orchestrator.runtime.elastic.updates import StepDone

LIMIT_S = 400.0


def _events(session, kind: EventKind) -> list[RunEvent]:
    return session.controller.journal.of_kind(kind)


def _launches(session) -> list[RunEvent]:
    return [e for e in _events(session, EventKind.PLAN_CHOSEN) if "launched" in e.message]


def _step_until(session, predicate, what: str) -> None:
    c = session.controller
    started = time.monotonic()
    while not predicate():
        assert not c.done, f"run ended before {what}: {c.events[-1].message}"
        c.step()
        assert time.monotonic() - started < LIMIT_S, f"{what} not seen in {LIMIT_S:.0f} s"


@pytest.mark.slow
def test_a_warmed_join_switches_without_starting_an_actor_and_a_drain_acts_at_once(
    ray_cluster,
) -> None:
    pool = "warm-join"
    nodes = [add_pool_node(ray_cluster, pool)]
    job = tiny_job_spec(
        "elastic-warm-join",
        100_000,  # the test stops the run once it has seen what it checks
        elasticity={"initial_backoff_s": 0.0, "poll_interval_s": 60.0},
    )
    session = build_session(elastic_spec(job, pool), serve=False)
    session.controller.planner = ReplicaPerDevice()
    c = session.controller
    try:
        _step_until(session, lambda: c.next_step >= 3, "step 3")
        nodes.append(add_pool_node(ray_cluster, pool))
        joiner = nodes[1].node_id
        time.sleep(2.0)  # Ray lists a new node 1-2 s after it started
        session.probe.post_node_event(joiner, "node_joined")
        _step_until(session, lambda: len(_launches(session)) >= 2, "the switch")
        [decision] = [e for e in _events(session, EventKind.REPLAN) if e.data["trigger"] == "join"]
        [warming] = _events(session, EventKind.WARMING)
        [ready] = _events(session, EventKind.WARM_READY)
        switch = _launches(session)[1]
        assert decision.time_s <= warming.time_s <= ready.time_s <= switch.time_s
        assert warming.data["workers"] == 1 and ready.data["ready"] is True
        # Training went on under the old plan while the joiner warmed.
        during = [
            u.report.step
            for u in session.progress.updates
            if isinstance(u, StepDone) and warming.time_s < u.time_s < ready.time_s
        ]
        assert during, "no step committed while the joiner warmed"
        first_new = switch.data["resume_step"]
        assert first_new > max(during), (first_new, during)
        # The switch adopted the warm actor: none started at switch time.
        assert switch.data["actors_started"] == 0 and switch.data["actors_warm"] == 1, switch
        report = session.workers.last_reform
        assert report is not None and report.actors_warm == 1 and report.actors_started == 0
        placement = session.workers.placement()
        assert set(placement.values()) == {nodes[0].node_id, joiner}
        print(
            f"join: warm {ready.data['warm_s']:.2f} s while training went on "
            f"(start {ready.data['start_s']:.2f} s, import {ready.data['import_s']:.2f} s, "
            f"engine {ready.data['build_s']:.2f} s); switch: {switch.message}; "
            f"{len(during)} steps trained while warming"
        )
        # A drain posted during a step: acted on at the step boundary (poll 60 s away).
        _step_until(session, lambda: c.next_step >= first_new + 2, "steps of the new plan")
        posted: list[tuple[float, int]] = []

        def post() -> None:
            time.sleep(0.05)  # into the next step
            posted.append((time.time(), c.next_step))
            session.probe.post_node_event(nodes[0].node_id, "preemption_notice", time.time() + 120)

        threading.Thread(target=post, daemon=True).start()
        _step_until(session, lambda: any(
            "evacuating" in e.message for e in _events(session, EventKind.PREEMPTION_NOTICE)
        ), "the evacuation")  # fmt: skip
        [(posted_s, steps_then)] = posted
        [evacuating] = [
            e for e in _events(session, EventKind.PREEMPTION_NOTICE) if "evacuating" in e.message
        ]
        assert evacuating.data["nodes"] == [nodes[0].node_id]
        # The step in flight finished and was committed; no later step started before it.
        assert c.next_step <= steps_then + 1, (c.next_step, steps_then)
        _step_until(session, lambda: len(_launches(session)) >= 3, "the plan without the node")
        _step_until(session, lambda: c.next_step >= steps_then + 4, "steps after the drain")
        assert set(session.workers.placement().values()) == {joiner}
        assert c.failure_count == 0 and c.lost_steps_total == 0
        steps = [r.step for r in session.progress.reports]
        assert steps == list(range(len(steps)))  # each step committed once, in order
        print(f"drain: posted -> evacuation {evacuating.time_s - posted_s:.3f} s")
    finally:
        session.workers.stop()
        remove_pool(ray_cluster, nodes)
