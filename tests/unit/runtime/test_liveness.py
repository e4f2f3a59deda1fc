"""Telling a crashed node's actors dead at once (``runtime/liveness.py``): a silent actor
is dead when its node's raylet refuses a connection or Ray lists the node dead, and waited for
when the raylet answers. Ray's calls are replaced by fakes; the sockets are real."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from ray.exceptions import RayActorError

from orchestrator.runtime import liveness


@pytest.fixture
def listening() -> Iterator[tuple[str, int]]:
    """A port that accepts connections (a live raylet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()


@pytest.fixture
def closed() -> tuple[str, int]:
    """A port nothing listens on (a crashed raylet): connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()


def test_reachable_tells_a_listening_port_from_a_closed_one(listening, closed):
    assert liveness.reachable(listening, timeout_s=1.0)
    assert not liveness.reachable(closed, timeout_s=1.0)


@dataclass(eq=False)
class _Ref:
    rank: int
    answers_after_s: float | None  # None: never (an actor on a crashed node, before Ray's verdict)
    dead_actor: bool = False  # the answer is Ray's "actor died"


class _Actor:
    def __init__(self, ref: _Ref) -> None:
        self.ping = self
        self._ref = ref

    def remote(self) -> _Ref:
        return self._ref


class _FakeRay:
    """``nodes``, ``wait`` and ``get`` on simulated time: a wait advances the clock by its timeout
    only when something it waits for is still unanswered."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.now_s = 0.0
        self.waits: list[float] = []

    def nodes(self) -> list[dict[str, Any]]:
        return self.rows

    def wait(self, refs: list[_Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        self.waits.append(timeout)
        later = self.now_s + timeout
        ready = [r for r in refs if r.answers_after_s is not None and r.answers_after_s <= later]
        if len(ready) < len(refs):
            self.now_s = later
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: _Ref) -> str:
        if ref.dead_actor:
            raise RayActorError()
        return "pong"


def _row(node_id: str, address: tuple[str, int], alive: bool = True) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": address[0],
        "NodeManagerPort": address[1],
    }


def test_unreachable_nodes_are_the_refused_and_the_listed_dead(monkeypatch, listening, closed):
    rows = [_row("up", listening), _row("crashed", closed), _row("gone", listening, False)]
    fake = _FakeRay(rows)
    monkeypatch.setattr(liveness, "ray", fake)
    assert liveness.unreachable_nodes(["up", "crashed", "gone"]) == {"crashed", "gone"}
    assert liveness.unreachable_nodes([]) == set()


def test_a_silent_actor_on_a_crashed_node_is_dead_without_waiting_out_the_grace(
    monkeypatch, listening, closed
):
    fake = _FakeRay([_row("up", listening), _row("crashed", closed)])
    monkeypatch.setattr(liveness, "ray", fake)
    refs = [_Ref(0, 0.001), _Ref(1, None), _Ref(2, 0.002)]
    actors = [_Actor(r) for r in refs]
    nodes = {0: "up", 1: "crashed", 2: "up"}
    assert liveness.alive_ranks(actors, nodes, {0, 1, 2}, grace_s=20.0) == {0, 2}
    assert fake.waits == [liveness.SUSPECT_AFTER_S]  # no second wait: no one left to wait for


def test_a_silent_actor_on_a_live_node_is_waited_for(monkeypatch, listening):
    fake = _FakeRay([_row("up", listening)])
    monkeypatch.setattr(liveness, "ray", fake)
    slow, stuck, died = _Ref(0, 1.0), _Ref(1, None), _Ref(2, 0.5, dead_actor=True)
    actors = [_Actor(slow), _Actor(stuck), _Actor(died)]
    nodes = {0: "up", 1: "up", 2: "up"}
    # The slow one answers within the grace; the stuck one counts as alive (the caller's timeout
    # names it); the one Ray reports dead is dead.
    assert liveness.alive_ranks(actors, nodes, {0, 1, 2}, grace_s=5.0) == {0, 1}
    assert fake.waits[0] == liveness.SUSPECT_AFTER_S
    assert fake.waits[1] == pytest.approx(5.0 - liveness.SUSPECT_AFTER_S, abs=0.5)


def test_only_the_ranks_asked_are_pinged(monkeypatch, listening):
    fake = _FakeRay([_row("up", listening)])
    monkeypatch.setattr(liveness, "ray", fake)
    actors = [_Actor(_Ref(0, 0.0)), _Actor(_Ref(1, None))]
    assert liveness.alive_ranks(actors, {0: "up", 1: "up"}, {0}, grace_s=1.0) == {0}
    assert liveness.alive_ranks(actors, {0: "up", 1: "up"}, set(), grace_s=1.0) == set()
