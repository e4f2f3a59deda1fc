"""Joins whose new workers warm up while the current plan trains, and posted node events that
wake the controller, stepped on fakes with a fake clock (see control_fakes.py).

The fake port below can ``prepare`` a candidate plan: the workers on nodes the running group
does not use "warm up" for ``warm_s`` seconds of the fake clock, during which the controller
must keep training on the current plan; the switch then starts no worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from control_fakes import NUM_LAYERS, FakePlanner, FakeWorkerGroup, make_harness

from orchestrator.control.events import ControllerStateName, EventKind
from orchestrator.control.measure import SwitchCostMeter
from orchestrator.control.ports import WarmState, WarmStatus
from orchestrator.control.states import ResizingState, RunningState
from orchestrator.spec.plan import Plan
from orchestrator.spec.snapshot import ClusterSnapshot

RUNNING = ControllerStateName.RUNNING


@dataclass
class _Reform:
    actors_started: int
    actors_warm: int
    bytes_moved: int = 0
    seconds: dict | None = None

    def line(self) -> str:
        return f"{self.actors_warm} pre-warmed, {self.actors_started} started"


def _nodes_of(plan: Plan) -> set[str]:
    return {s.node for r in plan.replicas for s in r.stages if s.node is not None}


class WarmingWorkerGroup(FakeWorkerGroup):
    """A fake port that warms a candidate's new nodes for ``warm_s`` before they are ready."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.warm_s = 5.0
        self.fail_warm = False
        self.warm: dict[str, float] = {}  # node -> fake time it is warm
        self.prepared_for: list[Plan] = []
        self.last_reform: _Reform | None = None
        self.started_at_switch: list[int] = []
        self.ran_on: set[str] = set()  # nodes of the last plan launched (the fake stops them)

    def prepare(self, plan: Plan) -> int:
        self.prepared_for.append(plan)
        new = _nodes_of(plan) - set(self.rank_node.values())
        for node in new:
            self.warm.setdefault(node, self.clock.now_s() + self.warm_s)
        return len(new)

    def prepared(self, plan: Plan) -> WarmStatus:
        if self.fail_warm:
            return WarmStatus(WarmState.FAILED, "the joiner's actor died")
        new = _nodes_of(plan) - set(self.rank_node.values())
        if any(self.warm.get(n, float("inf")) > self.clock.now_s() for n in new):
            return WarmStatus(WarmState.WARMING)
        return WarmStatus(WarmState.READY, seconds={"total_s": self.warm_s})

    def launch(self, plan, restore) -> None:
        new = _nodes_of(plan) - self.ran_on
        cold = {n for n in new if self.warm.get(n, float("inf")) > self.clock.now_s()}
        first = not self.launches
        super().launch(plan, restore)
        self.ran_on = _nodes_of(plan)
        self.last_reform = None if first else _Reform(len(cold), len(new - cold))
        self.started_at_switch.append(len(cold))


def _harness(**config):
    h = make_harness([("t", "T4", 1)], **config)
    warming = WarmingWorkerGroup(h.cluster, h.clock, h.store)
    h.controller.ctx.workers = warming
    h.workers = warming
    return h


def _running_at(h, step):
    h.states_until(lambda c: c.next_step == step and c.state.name is RUNNING)


def test_a_join_trains_on_while_the_joiner_warms_and_switches_once_it_is_ready():
    # One T4: 16 s/step; two A100s join: 2 s/step. Warm-up 40 s: about 2.5 steps on the T4.
    h = _harness(total_steps=60, checkpoint_interval_steps=0)
    h.workers.warm_s = 40.0
    _running_at(h, 5)
    h.cluster.add("big", "A100-80", 2)
    h.clock.advance(1.0)  # the next step() polls
    c = h.controller
    state = h.step()
    assert isinstance(state, RunningState) and state.pending is not None
    assert _nodes_of(state.pending.proposal.plan) == {"t", "big"}
    (warming,) = c.journal.of_kind(EventKind.WARMING)
    assert warming.data["workers"] == 1
    # Training goes on under the old plan while the joiner warms: steps 5, 6, 7 on the T4 alone.
    h.states_until(lambda c: isinstance(c.state, ResizingState))
    assert c.next_step == 8
    assert len(h.workers.launches) == 1  # the old plan only
    (ready,) = c.journal.of_kind(EventKind.WARM_READY)
    assert ready.data["ready"] is True and ready.data["warm_s"] >= 40.0
    kinds = [e.kind for e in c.events]
    assert kinds.index(EventKind.REPLAN) < kinds.index(EventKind.WARMING)
    assert kinds.index(EventKind.WARMING) < kinds.index(EventKind.WARM_READY)
    h.states_until(lambda c: c.state.name is RUNNING)
    plan, restore = h.workers.launches[-1]
    assert _nodes_of(plan) == {"t", "big"} and restore.resume_step == 8
    assert h.workers.started_at_switch[-1] == 0  # the switch started no worker
    h.states_until(lambda c: c.done)
    assert c.lost_steps_total == 0
    assert h.final_layer_states() == {i: tuple(range(60)) for i in range(NUM_LAYERS)}
    # The switch's measured cost leaves the warm-up out: the fake's read of every layer (0.5 s)
    # and launch (2 s); and it is the estimate from now on.
    assert c.switch_cost.in_place_s == [pytest.approx(2.5)]
    assert c.switch_cost.estimate_s == pytest.approx(2.5)


def test_a_joiner_that_fails_to_warm_keeps_the_current_plan():
    h = _harness(total_steps=30, checkpoint_interval_steps=0)
    _running_at(h, 5)
    h.cluster.add("big", "A100-80", 2)
    h.clock.advance(1.0)
    h.step()
    h.workers.fail_warm = True
    state = h.step()
    assert isinstance(state, RunningState) and state.pending is None
    c = h.controller
    skipped = c.journal.of_kind(EventKind.REPLAN_SKIPPED)
    assert skipped and "did not warm up" in skipped[-1].message
    assert "actor died" in skipped[-1].data["error"]
    h.states_until(lambda c: c.done)
    assert len(h.workers.launches) == 1
    assert h.final_layer_states() == {i: tuple(range(30)) for i in range(NUM_LAYERS)}


def test_a_joiner_that_leaves_while_warming_drops_the_pending_switch():
    h = _harness(total_steps=30, checkpoint_interval_steps=0)
    h.workers.warm_s = 100.0
    _running_at(h, 5)
    h.cluster.add("big", "A100-80", 2)
    h.clock.advance(1.0)
    assert h.step().pending is not None
    h.cluster.kill("big")
    h.clock.advance(1.0)
    state = h.step()
    assert isinstance(state, RunningState) and state.pending is None
    c = h.controller
    assert (
        "left while its workers warmed up"
        in c.journal.of_kind(EventKind.REPLAN_SKIPPED)[-1].message
    )
    assert c.failure_count == 0  # it hosted no worker: not a failure
    h.states_until(lambda c: c.done)
    assert len(h.workers.launches) == 1


def test_a_port_that_cannot_warm_switches_at_once():
    h = make_harness([("t", "T4", 1)], total_steps=30, checkpoint_interval_steps=0)
    _running_at(h, 5)
    h.cluster.add("big", "A100-80", 2)
    h.clock.advance(1.0)
    assert isinstance(h.step(), ResizingState)
    assert not h.controller.journal.of_kind(EventKind.WARMING)


class NewsCluster:
    """Wraps the fake cluster with ``take_news``, as the Ray probe has for posted events."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.news = False

    def snapshot(self):
        return self.cluster.snapshot()

    def take_news(self) -> bool:
        news, self.news = self.news, False
        return news


def test_a_posted_drain_is_acted_on_at_the_next_step_boundary_not_the_next_poll():
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)], total_steps=30, poll_interval_s=600.0
    )
    probe = NewsCluster(h.cluster)
    h.controller.ctx.probe = probe
    _running_at(h, 6)
    polled_s = h.controller.ledger.last_poll_s
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 300.0)
    assert h.step().name is RUNNING  # no news: the poll is 600 s away, the step runs
    assert h.controller.ledger.last_poll_s == polled_s
    probe.news = True  # the event is posted: the probe says so
    c = h.controller
    state = h.step()
    assert isinstance(state, ResizingState) and state.evacuate_nodes == {"b"}
    assert h.clock.now_s() - polled_s < 600.0
    notice = [
        e for e in c.journal.of_kind(EventKind.PREEMPTION_NOTICE) if "evacuating" in e.message
    ]
    assert notice and notice[0].data["nodes"] == ["b"]
    h.states_until(lambda c: c.done)
    assert c.failure_count == 0 and c.lost_steps_total == 0
    assert h.final_layer_states() == {i: tuple(range(30)) for i in range(NUM_LAYERS)}


def test_the_switch_cost_estimate_prefers_switches_that_started_no_worker():
    meter = SwitchCostMeter(10.0)
    assert meter.estimate_s == 10.0
    meter.begin(0.0)
    meter.launched(in_place=False)  # the first launch starts every worker
    assert meter.first_step_done(9.0, 1.0) == pytest.approx(8.0)
    assert meter.estimate_s == pytest.approx(8.0)
    meter.begin(20.0)
    meter.launched(in_place=True)
    assert meter.first_step_done(21.5, 1.0) == pytest.approx(0.5)
    assert meter.estimate_s == pytest.approx(0.5)  # not the mean with the first launch
    assert meter.observations_s == [pytest.approx(8.0), pytest.approx(0.5)]


class TwoNodePlanner:
    """The fake planner on the first two usable nodes (by id): a third node stays spare."""

    def __init__(self) -> None:
        self.inner = FakePlanner()

    def __call__(self, snapshot, slowdown_by_node):
        nodes = sorted(snapshot.nodes, key=lambda n: n.node_id)[:2]
        return self.inner(ClusterSnapshot(snapshot.sequence, tuple(nodes), {}), slowdown_by_node)


def _spare_harness(**config):
    h = make_harness([("a", "A100-80", 2), ("b", "A100-80", 2), ("c", "A100-80", 2)], **config)
    warming = WarmingWorkerGroup(h.cluster, h.clock, h.store)
    h.controller.ctx.workers = warming
    h.controller.planner = TwoNodePlanner()
    h.workers = warming
    return h


def test_an_evacuation_warms_the_spare_node_while_the_draining_node_still_trains():
    h = _spare_harness(total_steps=40, checkpoint_interval_steps=0)
    h.workers.warm_s = 6.0
    _running_at(h, 5)
    assert _nodes_of(h.workers.plan) == {"a", "b"}
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 300.0)
    h.clock.advance(1.0)
    c = h.controller
    state = h.step()
    assert isinstance(state, RunningState) and state.pending is not None
    assert state.pending.evacuate_nodes == {"b"}
    assert _nodes_of(state.pending.proposal.plan) == {"a", "c"}
    h.states_until(lambda c: isinstance(c.state, ResizingState))
    assert c.state.evacuate_nodes == {"b"} and c.next_step > 5  # trained on meanwhile
    # One evacuation decision, though the probe saw the drain at every poll meanwhile.
    assert len([e for e in c.events if "evacuating" in e.message]) == 1
    h.states_until(lambda c: c.state.name is RUNNING)
    assert _nodes_of(h.workers.plan) == {"a", "c"}
    assert h.workers.started_at_switch[-1] == 0
    assert h.clock.now_s() < h.cluster.draining["b"]
    h.states_until(lambda c: c.done)
    assert c.failure_count == 0 and c.lost_steps_total == 0
    assert h.final_layer_states() == {i: tuple(range(40)) for i in range(NUM_LAYERS)}


def test_an_evacuation_switches_by_its_deadline_even_if_the_spare_node_is_not_warm():
    h = _spare_harness(total_steps=200, checkpoint_interval_steps=0)  # 1 s steps
    h.workers.warm_s = 1000.0  # never warm in time
    _running_at(h, 5)
    h.cluster.drain("b", deadline_s=h.clock.now_s() + 60.0)
    h.clock.advance(1.0)
    c = h.controller
    assert h.step().pending is not None
    h.states_until(lambda c: isinstance(c.state, ResizingState))
    (ready,) = c.journal.of_kind(EventKind.WARM_READY)
    assert ready.data["ready"] is False and "deadline is near" in ready.message
    h.states_until(lambda c: c.state.name is RUNNING)
    assert h.clock.now_s() < h.cluster.draining["b"]  # switched before the deadline
    assert h.workers.started_at_switch[-1] == 1  # the cold spare started at the switch
    h.states_until(lambda c: c.done)
    assert c.failure_count == 0 and c.lost_steps_total == 0
