"""Simulated implementations of the controller's ports: clock, cluster, workers, checkpoints.

Time is simulated: nothing sleeps. A training step takes the plan's predicted step time (the real
cost model's number); the other operations take what ``costs.CostModel`` charges. A node hit by an
interruption dies at the trace's time; a step in flight on it, or the next operation that needs
it, raises :class:`~orchestrator.control.ports.WorkerLost` ``detect_s`` later, and the probe stops
listing it at the same moment. A replacement node of the same type (a new node id) joins
``replace_after_s`` after the interruption.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from orchestrator.control.ports import PlanProposal, WorkerLost
from orchestrator.control.recovery import CheckpointRef, LayerState, RestoreKind, RestoreSource
from orchestrator.sim.costs import CostModel
from orchestrator.sim.trace import FailureTrace
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo


class SimClock:
    """Simulated seconds; ``sleep`` and every charged operation move it forward."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.t = start_s

    def now_s(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    advance = sleep


class SimCluster:
    """The probe: alive nodes, interruptions from the trace, replacements after a delay."""

    def __init__(
        self,
        clock: SimClock,
        nodes: list[NodeInfo],
        trace: FailureTrace,
        *,
        detect_s: float,
        replace_after_s: float,
    ) -> None:
        self.clock = clock
        self.alive: dict[str, NodeInfo] = {n.node_id: n for n in nodes}
        self.trace = trace
        self.detect_s = detect_s
        self.replace_after_s = replace_after_s
        self.rng = random.Random(trace.seed)
        self.next_failure = 0  # index into trace.times_s
        self.dead_at: dict[str, float] = {}  # died, still listed until dead_at + detect_s
        self.joins: list[tuple[float, int, NodeInfo]] = []  # heap of replacements
        self.replacements = 0
        self.interruptions: list[tuple[float, str]] = []
        self._snapshot: ClusterSnapshot | None = None
        self._sequence = 0

    @property
    def next_failure_s(self) -> float:
        times = self.trace.times_s
        return times[self.next_failure] if self.next_failure < len(times) else float("inf")

    def update(self) -> None:
        """Apply every interruption, delisting and join due by now."""
        now = self.clock.now_s()
        while self.next_failure_s <= now:
            self._interrupt(self.next_failure_s)
        for node_id, died_s in list(self.dead_at.items()):
            if now >= died_s + self.detect_s:
                del self.dead_at[node_id]
                self.alive.pop(node_id, None)
                self._snapshot = None
        while self.joins and self.joins[0][0] <= now:
            _, _, node = heapq.heappop(self.joins)
            self.alive[node.node_id] = node
            self._snapshot = None

    def _interrupt(self, at_s: float) -> None:
        self.next_failure += 1
        candidates = sorted(n for n in self.alive if n not in self.dead_at)
        if not candidates:
            return
        victim = self.alive[self.rng.choice(candidates)]
        self.dead_at[victim.node_id] = at_s
        self.interruptions.append((at_s, victim.node_id))
        self.replacements += 1
        spare = NodeInfo(
            f"{victim.device_type.lower()}-r{self.replacements:05d}",
            victim.device_type,
            victim.num_devices,
            dict(victim.labels),
        )
        heapq.heappush(self.joins, (at_s + self.replace_after_s, self.replacements, spare))

    def is_dead(self, node_id: str) -> bool:
        """Died (noticed or not); the clock must have been brought up to date by ``update``."""
        return node_id in self.dead_at or node_id not in self.alive

    def snapshot(self) -> ClusterSnapshot:
        self.update()
        if self._snapshot is None:
            self._sequence += 1
            self._snapshot = ClusterSnapshot.of(self._sequence, self.alive.values())
        return self._snapshot


@dataclass
class SimStore:
    """Checkpoints: the step and the layers' states (here: the step each layer was saved at)."""

    clock: SimClock
    costs: CostModel
    saved: dict[int, dict[int, LayerState]] = field(default_factory=dict)
    write_s_total: float = 0.0

    def latest(self) -> CheckpointRef | None:
        if not self.saved:
            return None
        step = max(self.saved)
        return CheckpointRef(step, {"meta": {}})

    def save(
        self, step: int, states: Mapping[int, LayerState], meta: Mapping[str, object]
    ) -> CheckpointRef:
        write_s = self.costs.checkpoint_write_s()
        self.clock.advance(write_s)
        self.write_s_total += write_s
        self.saved = {step: dict(states)}  # only the latest is ever read
        return CheckpointRef(step, {"meta": dict(meta)})

    def load(self, step: int) -> dict[int, LayerState]:
        return dict(self.saved[step])


@dataclass
class SimHolderStore(SimStore):
    """A store the holders write into (``StagesCheckpoints``): the write is charged by the
    workers (:meth:`SimHolderWorkers.write_checkpoint`), the commit costs nothing here."""

    def begin(self, step: int) -> str:
        return f"staging-{step}"

    def commit(
        self, step: int, staging: str, written: Mapping[str, object], meta: Mapping[str, object]
    ) -> CheckpointRef:
        self.saved = {step: {int(layer): None for layer in written}}
        return CheckpointRef(step, {"meta": dict(meta)})

    def abort(self, staging: str) -> None:
        pass


class SimWorkers:
    """A worker group whose steps take the predicted step time of the plan it runs."""

    def __init__(
        self,
        clock: SimClock,
        cluster: SimCluster,
        costs: CostModel,
    ) -> None:
        self.clock, self.cluster, self.costs = clock, cluster, costs
        # The planner's recent proposals: a launched plan's step takes its predicted time.
        self.proposals: deque[PlanProposal] = deque(maxlen=16)
        self._placement: Mapping[int, str] = MappingProxyType({})
        self.plan: Plan | None = None
        self.step_s = 0.0
        self.samples = 0
        self.rank_node: dict[int, str] = {}
        self.rank_layers: dict[int, tuple[int, int]] = {}
        self.plan_nodes: frozenset[str] = frozenset()
        self.layer_ranks: dict[int, list[int]] = {}
        self.last_plan: Plan | None = None  # what the survivors held before a launch
        self.moved_bytes: list[float] = []  # per launch
        self.launch_s: list[float] = []
        self.checkpoint_launch_s: list[float] = []  # those of them restoring a checkpoint
        self.fetch_s_total = 0.0

    def expect(self, proposal: PlanProposal) -> None:
        """Remember a proposal the controller may launch (the runner's planner calls this)."""
        self.proposals.append(proposal)

    # -- the port ----------------------------------------------------------------------------

    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        cost_s, moved = self.costs.launch_s(self.last_plan, plan, restore.kind)
        self.clock.advance(cost_s)
        self.cluster.update()
        self.launch_s.append(cost_s)
        if restore.kind is RestoreKind.CHECKPOINT:
            self.checkpoint_launch_s.append(cost_s)
        self.moved_bytes.append(moved)
        ranks = [stage for rep in plan.replicas for stage in rep.stages]
        self.rank_node = {r: s.node or "" for r, s in enumerate(ranks)}
        self.rank_layers = {r: s.layers for r, s in enumerate(ranks)}
        self.plan_nodes = frozenset(self.rank_node.values())
        self._raise_if_dead(self.plan_nodes)
        self.layer_ranks = {}
        for r, (a, b) in self.rank_layers.items():
            for layer in range(a, b):
                self.layer_ranks.setdefault(layer, []).append(r)
        self.plan = self.last_plan = plan
        self.step_s = next(p for p in self.proposals if p.plan is plan).predicted_step_s
        self.samples = plan.global_batch_size
        self._placement = MappingProxyType(self.rank_node)

    def step(self, step: int) -> StepReport:
        assert self.plan is not None, "step before launch"
        start_s = self.clock.now_s()
        end_s = start_s + self.step_s
        while self.cluster.next_failure_s <= end_s:
            self.clock.t = max(self.clock.t, self.cluster.next_failure_s)
            self.cluster.update()
            self._raise_if_dead(self.plan_nodes)
        self.clock.t = end_s
        return StepReport(step=step, loss=0.0, step_duration_s=self.step_s, samples=self.samples)

    def layer_holders(self) -> dict[int, tuple[int, ...]]:
        self.cluster.update()
        listed = self.cluster.alive
        return {
            layer: tuple(r for r in ranks if self.rank_node[r] in listed)
            for layer, ranks in self.layer_ranks.items()
        }

    def placement(self) -> Mapping[int, str]:
        return self._placement if self.plan is not None else {}

    def fetch_layer_states(self, sources: Mapping[int, int]) -> dict[int, LayerState]:
        fetch_s = self.costs.fetch_s(len(sources))
        self.clock.advance(fetch_s)
        self.fetch_s_total += fetch_s
        self.cluster.update()
        self._raise_if_dead({self.rank_node[r] for r in sources.values()})
        return {layer: None for layer in sources}

    def stop(self) -> None:
        self.plan = None
        self.rank_node, self.rank_layers, self.layer_ranks = {}, {}, {}
        self.plan_nodes = frozenset()

    # -- internals ---------------------------------------------------------------------------

    def _charge(self, seconds: float, nodes: set[str]) -> None:
        """Advance the clock by ``seconds``; a death on ``nodes`` meanwhile is a lost worker."""
        self.clock.advance(seconds)
        self.cluster.update()
        self._raise_if_dead(nodes)

    def _raise_if_dead(self, nodes: frozenset[str] | set[str]) -> None:
        dead = {n for n in nodes if self.cluster.is_dead(n)}
        if not dead:
            return
        # The loss is seen detect_s after the death (a collective times out, Ray marks the
        # actor dead); a node already delisted was seen before.
        now_s = self.clock.now_s()
        seen_s = max(
            self.cluster.dead_at[n] + self.cluster.detect_s if n in self.cluster.dead_at else now_s
            for n in dead
        )
        self.clock.t = max(now_s, seen_s)
        self.cluster.update()
        ranks = {r for r, n in self.rank_node.items() if n in dead}
        raise WorkerLost(ranks, dead, "simulated interruption")


class SimHolderWorkers(SimWorkers):
    """The worker group as the runtime runs it now: survivors are kept across a change of plan
    (``KeepsSurvivors``: the controller reads no state for a recovery) and checkpoints are
    written by the layers' holders (``WritesCheckpoints``)."""

    keeps_survivors = True

    def __init__(self, clock: SimClock, cluster: SimCluster, costs: CostModel) -> None:
        super().__init__(clock, cluster, costs)
        self.store: SimStore | None = None  # charged the write, for the run's totals

    def write_checkpoint(self, staging: str, sources: Mapping[int, int]) -> dict[str, object]:
        by_node: dict[str, float] = {}
        for layer, rank in sources.items():
            node = self.rank_node[rank]
            by_node[node] = by_node.get(node, 0.0) + self.costs.layer_state_bytes[layer]
        write_s = self.costs.checkpoint_write_s(by_node)
        if self.store is not None:
            self.store.write_s_total += write_s
        self._charge(write_s, set(by_node))
        return {str(layer): None for layer in sources}
