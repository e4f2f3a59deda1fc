"""Posted node events on the Ray probe: they wake the controller (``take_news``), tell the worker
group of losses and preemption deadlines at once, and a deadline before the step in flight ends
abandons it. The probe reads node rows through an injected function (no Ray needed here)."""

from __future__ import annotations

from orchestrator.runtime.elastic.probe import RayClusterProbe
from orchestrator.runtime.elastic.survivors import deadline_hits

ROWS = [
    {
        "NodeID": "a" * 16,
        "Alive": True,
        "NodeManagerHostname": "host-a",
        "Resources": {"GPU": 1.0, "CPU": 1.0},
        "Labels": {"orchestrator.io/device-type": "T4"},
    },
    {
        "NodeID": "b" * 16,
        "Alive": True,
        "NodeManagerHostname": "host-b",
        "Resources": {"GPU": 1.0, "CPU": 1.0},
        "Labels": {"orchestrator.io/device-type": "T4"},
    },
]


def _probe() -> RayClusterProbe:
    return RayClusterProbe(rows=lambda: [dict(r) for r in ROWS], draining=lambda: {})


def test_a_posted_event_is_news_once():
    probe = _probe()
    assert probe.take_news() is False
    probe.post_node_event("host-b", "preemption_notice", 2e9)
    assert probe.take_news() is True
    assert probe.take_news() is False  # taken
    snap = probe.snapshot()
    assert snap.draining == {"b" * 16: 2e9}
    probe.post_node_event("host-b", "node_joined")  # clears it, and is news too
    assert probe.take_news() is True
    assert probe.snapshot().draining == {}


def test_posted_losses_and_drains_reach_their_listeners_by_node_id():
    probe = _probe()
    lost: list[tuple[str, float]] = []
    drains: list[tuple[str, float | None, float]] = []
    probe.on_lost = lambda node, at_s: lost.append((node, at_s))
    probe.on_drain = lambda node, deadline, at_s: drains.append((node, deadline, at_s))
    probe.post_node_event("host-a", "preemption_notice", 1234.5)
    probe.post_node_event("bbbbbbbb", "node_lost")  # an id prefix of 8
    probe.post_node_event("nowhere", "node_lost")  # names no node: nobody is told
    assert [(n, d) for n, d, _ in drains] == [("a" * 16, 1234.5)]
    assert [n for n, _ in lost] == ["b" * 16]


def test_a_step_is_abandoned_only_where_the_deadline_falls_before_it_would_end():
    deadlines = {"a": 100.0, "b": 130.0, "c": 90.0}
    # The step should end at 110 s: a's deadline (100) is before it, b's (130) after; c holds
    # no rank of this step.
    assert deadline_hits(deadlines, {"a", "b"}, 110.0) == {"a"}
    assert deadline_hits(deadlines, {"a", "b"}, 99.0) == set()
    assert deadline_hits(deadlines, {"a", "b", "c"}, 130.0) == {"a", "b", "c"}
