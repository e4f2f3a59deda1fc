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


def test_a_drain_ray_reports_itself_is_acted_on_within_the_watch_interval():
    import time

    draining: dict[str, int] = {}
    probe = RayClusterProbe(rows=lambda: [dict(r) for r in ROWS], draining=lambda: dict(draining))
    drains: list[tuple[str, float | None, float]] = []
    probe.on_drain = lambda node, deadline, at_s: drains.append((node, deadline, at_s))
    stop = probe.watch_drains(interval_s=0.01)
    try:
        time.sleep(0.05)
        assert drains == [] and probe.take_news() is False  # nothing draining yet
        draining["b" * 16] = 2_000_000_000_000  # Ray's deadline, ms since the epoch
        drained_s = time.time()
        while not drains and time.time() < drained_s + 5.0:
            time.sleep(0.005)
        [(node, deadline_s, seen_s)] = drains
        assert (node, deadline_s) == ("b" * 16, 2e9)
        assert seen_s - drained_s < 1.0  # well inside a poll period, not at the next snapshot
        assert probe.take_news() is True  # the controller polls at its next step boundary
        time.sleep(0.05)
        assert len(drains) == 1  # the same drain is told once
    finally:
        stop.set()
