"""The real planner, timed, with its wall time charged to the simulated clock.

A long run re-plans on the same few cluster shapes again and again (the full cluster, the full
cluster less one node of some type, ...). :class:`TimedPlanner` calls the wrapped planner once per
*shape* (device type and device count of every node, in node order within each type, and the
measured slowdowns) and answers a repeat with the same plan, its nodes renamed k-th node of a type
to k-th node of that type. The planner places stages first-fit over the nodes of each type in
cluster order and reads nothing else of a node's name, so the renamed plan is the plan it would
have chosen (tests/unit/control/test_simulation.py checks this against fresh calls). A repeat is
charged the wall time of the call that planned the shape: that is what the controller would wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from orchestrator.control.ports import Planner, PlanProposal
from orchestrator.spec.snapshot import ClusterSnapshot


@dataclass
class _Planned:
    proposal: PlanProposal
    nodes_by_type: dict[str, list[str]]
    wall_s: float


# Plans per cluster shape (or the planner's error for it), shareable between runs.
PlanCache = dict[object, _Planned | Exception]


@dataclass
class TimedPlanner:
    """A :class:`Planner` that calls ``inner`` once per cluster shape and sleeps ``charge``."""

    inner: Planner
    charge: Callable[[float], None]  # advances the simulated clock
    calls: list[tuple[int, float, bool]] = field(default_factory=list)  # (devices, wall s, fresh)
    cache: PlanCache = field(default_factory=dict)

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        by_type = _nodes_by_type(snapshot)
        key = _shape(snapshot, by_type, slowdown_by_node)
        cached = self.cache.get(key)
        if cached is None:
            started = time.perf_counter()
            try:
                proposal = self.inner(snapshot, slowdown_by_node)
            except Exception as exc:  # infeasible shapes are remembered too
                self.cache[key] = exc
                raise
            finally:
                wall_s = time.perf_counter() - started
                self.calls.append((snapshot.num_devices, wall_s, True))
                self.charge(wall_s)
            self.cache[key] = _Planned(proposal, by_type, wall_s)
            return proposal
        if isinstance(cached, Exception):
            raise cached
        self.calls.append((snapshot.num_devices, cached.wall_s, False))
        self.charge(cached.wall_s)
        rename = {
            old: new
            for device_type, olds in cached.nodes_by_type.items()
            for old, new in zip(olds, by_type[device_type], strict=True)
        }
        return _renamed(cached.proposal, rename)

    @property
    def fresh_wall_s(self) -> list[float]:
        """Wall seconds of the calls that really ran the planner."""
        return [wall_s for _, wall_s, fresh in self.calls if fresh]


def _nodes_by_type(snapshot: ClusterSnapshot) -> dict[str, list[str]]:
    by_type: dict[str, list[str]] = {}
    for node in snapshot.nodes:
        by_type.setdefault(node.device_type, []).append(node.node_id)
    return by_type


def _shape(
    snapshot: ClusterSnapshot,
    by_type: Mapping[str, list[str]],
    slowdown_by_node: Mapping[str, float],
) -> object:
    devices = {n.node_id: n.num_devices for n in snapshot.nodes}
    counts = tuple((t, tuple(devices[n] for n in names)) for t, names in sorted(by_type.items()))
    # A slowdown is part of the shape by the node's position within its type.
    position = {n: (t, i) for t, names in by_type.items() for i, n in enumerate(names)}
    slow = tuple(sorted((position[n], f) for n, f in slowdown_by_node.items() if n in position))
    return counts, slow


def _renamed(proposal: PlanProposal, rename: Mapping[str, str]) -> PlanProposal:
    if all(old == new for old, new in rename.items()):
        return proposal
    replicas = tuple(
        rep.model_copy(
            update={
                "stages": tuple(
                    s.model_copy(update={"node": rename.get(s.node, s.node)}) if s.node else s
                    for s in rep.stages
                )
            }
        )
        for rep in proposal.plan.replicas
    )
    return replace(proposal, plan=proposal.plan.model_copy(update={"replicas": replicas}))
