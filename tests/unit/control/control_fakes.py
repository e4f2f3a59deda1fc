"""Fakes of the controller's ports: cluster, worker group, checkpoint store, planner, clock.

These stand in for Ray on purpose: the controller's logic is tested step by step here, and the
Ray adapters are tested against real local Ray clusters in tests/ray. The fake worker group keeps
real (if tiny) training state: each layer's "parameters" are the tuple of step numbers applied to
it, so a test can check that every committed step reached the final model exactly once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.control.config import ControllerConfig
from orchestrator.control.controller import Controller
from orchestrator.control.ports import PlanProposal, WorkerLost
from orchestrator.control.recovery import CheckpointRef, RestoreKind, RestoreSource
from orchestrator.errors import InfeasibleError, TransientError
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.reports import StageTiming, StepReport
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

NUM_LAYERS = 4
GLOBAL_BATCH = 16
# Relative speeds of the fake device types (samples per second per device).
SPEEDS = {"A100-80": 4.0, "L4": 2.0, "T4": 1.0}


class FakeClock:
    """Seconds that move only when someone sleeps or a fake operation takes time."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.t = start_s
        self.sleeps: list[float] = []

    def now_s(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeCluster:
    """The probe: nodes come and go as the test says; a draining node dies at its deadline."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.nodes: dict[str, NodeInfo] = {}
        self.draining: dict[str, float | None] = {}
        self.dead_but_listed: set[str] = set()  # killed, not yet noticed by the health check
        self.killed_at_s: dict[str, float] = {}
        self.health_check_s = 1.5  # a killed node leaves the snapshot this long after the kill
        self.sequence = 0
        self.probe_errors = 0  # the next N snapshots raise TransientError

    def add(self, node_id: str, device_type: str, num_devices: int = 1, **labels: str) -> None:
        self.nodes[node_id] = NodeInfo(node_id, device_type, num_devices, dict(labels))

    def kill(self, node_id: str, *, noticed: bool = True) -> None:
        """SIGKILL a node; ``noticed=False``: the probe still lists it for a while."""
        if noticed:
            self.nodes.pop(node_id, None)
            self.draining.pop(node_id, None)
        else:
            self.dead_but_listed.add(node_id)
            self.killed_at_s[node_id] = self.clock.now_s()

    def drain(self, node_id: str, deadline_s: float | None) -> None:
        self.draining[node_id] = deadline_s

    def _expire(self) -> None:
        for node_id in list(self.dead_but_listed):
            if self.clock.now_s() >= self.killed_at_s[node_id] + self.health_check_s:
                self.dead_but_listed.discard(node_id)
                self.kill(node_id)
        for node_id, deadline in list(self.draining.items()):
            if deadline is not None and self.clock.now_s() >= deadline:
                self.kill(node_id)

    def alive(self, node_id: str) -> bool:
        self._expire()
        return node_id in self.nodes and node_id not in self.dead_but_listed

    def snapshot(self) -> ClusterSnapshot:
        self._expire()
        if self.probe_errors:
            self.probe_errors -= 1
            raise TransientError("probe: GCS unavailable")
        self.sequence += 1
        return ClusterSnapshot.of(self.sequence, self.nodes.values(), self.draining)


@dataclass
class FakePlanner:
    """One replica per node, each node's devices a pipeline; batch split by speed.

    Predicted step time: the slowest replica's batch / speed (speed divided by the node's slowdown).
    """

    calls: list[tuple[ClusterSnapshot, dict[str, float]]] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)  # raised by the next calls, in order
    one_pipeline: bool = False  # one replica whose stages span every node (one per device)
    # Nodes planned this many times slower (or more) get no work at all (None: every node works).
    drop_slowdown_at: float | None = None
    # Predict each stage's busy seconds (``PlanProposal.predicted_stage_s``), as the planner
    # adapter does: the same arithmetic as FakeWorkerGroup.step at each node's planned speed.
    stage_predictions: bool = False

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal:
        self.calls.append((snapshot, dict(slowdown_by_node)))
        if self.errors:
            raise self.errors.pop(0)
        nodes = [n for n in snapshot.nodes if n.num_devices <= NUM_LAYERS]
        if self.drop_slowdown_at is not None:
            cut = self.drop_slowdown_at
            nodes = [n for n in nodes if slowdown_by_node.get(n.node_id, 1.0) < cut]
        if not nodes:
            raise InfeasibleError("no node to place the model on", field="cluster")
        if self.one_pipeline:
            return self._one_pipeline(nodes)
        speeds = {
            n.node_id: SPEEDS[n.device_type] * n.num_devices / slowdown_by_node.get(n.node_id, 1)
            for n in nodes
        }
        batches = split_batch(GLOBAL_BATCH, [speeds[n.node_id] for n in nodes])
        replicas = []
        for node, batch in zip(nodes, batches, strict=True):
            bounds = [round(i * NUM_LAYERS / node.num_devices) for i in range(node.num_devices + 1)]
            stages = tuple(
                StageSpec(layers=(a, b), device_type=node.device_type, node=node.node_id)
                for a, b in itertools.pairwise(bounds)
            )
            replicas.append(ReplicaSpec(batch_size=batch, stages=stages))
        plan = Plan(global_batch_size=GLOBAL_BATCH, microbatch_size=1, replicas=tuple(replicas))
        step_s = max(b / speeds[n.node_id] for n, b in zip(nodes, batches, strict=True))
        predicted = {
            (r, s): rep.batch_size / speeds[node.node_id] / len(rep.stages)
            for r, (node, rep) in enumerate(zip(nodes, replicas, strict=True))
            for s in range(len(rep.stages))
        }
        return PlanProposal(
            plan,
            predicted_step_s=step_s,
            bound_step_s=GLOBAL_BATCH / sum(speeds.values()),
            predicted_stage_s=predicted if self.stage_predictions else {},
        )

    def _one_pipeline(self, nodes: list[NodeInfo]) -> PlanProposal:
        devices = [n for n in nodes for _ in range(n.num_devices)][:NUM_LAYERS]
        bounds = [round(i * NUM_LAYERS / len(devices)) for i in range(len(devices) + 1)]
        stages = tuple(
            StageSpec(layers=(a, b), device_type=n.device_type, node=n.node_id)
            for n, (a, b) in zip(devices, itertools.pairwise(bounds), strict=True)
        )
        plan = Plan(
            global_batch_size=GLOBAL_BATCH,
            microbatch_size=1,
            replicas=(ReplicaSpec(batch_size=GLOBAL_BATCH, stages=stages),),
        )
        step_s = GLOBAL_BATCH / sum(SPEEDS[n.device_type] for n in devices)
        return PlanProposal(plan, predicted_step_s=step_s, bound_step_s=step_s)


def split_batch(total: int, weights: list[float]) -> list[int]:
    """Shares of ``total`` proportional to ``weights``, each at least 1, adding up to ``total``."""
    raw = [total * w / sum(weights) for w in weights]
    shares = [max(1, math.floor(r)) for r in raw]
    while sum(shares) < total:
        i = max(range(len(raw)), key=lambda j: raw[j] - shares[j])
        shares[i] += 1
    while sum(shares) > total:
        i = max(range(len(shares)), key=lambda j: shares[j])
        shares[i] -= 1
    return shares


class FakeCheckpointStore:
    def __init__(self) -> None:
        self.saved: dict[int, tuple[dict[int, object], dict[str, object]]] = {}
        self.fail_saves = 0

    def latest(self) -> CheckpointRef | None:
        if not self.saved:
            return None
        step = max(self.saved)
        return CheckpointRef(step, {"meta": self.saved[step][1]})

    def save(self, step: int, states: Mapping[int, object], meta: Mapping[str, object]):
        if self.fail_saves:
            self.fail_saves -= 1
            raise OSError("No space left on device")
        self.saved[step] = (dict(states), dict(meta))
        return CheckpointRef(step, {"meta": dict(meta)})

    def load(self, step: int) -> dict[int, object]:
        return dict(self.saved[step][0])


class FakeWorkerGroup:
    """Ranks (replica-major, stage-minor) holding layer state; dies with its nodes."""

    def __init__(self, cluster: FakeCluster, clock: FakeClock, store: FakeCheckpointStore) -> None:
        self.cluster, self.clock, self.store = cluster, clock, store
        self.rank_node: dict[int, str] = {}
        self.rank_layers: dict[int, tuple[int, int]] = {}
        self.state: dict[int, dict[int, tuple[int, ...]]] = {}  # rank -> layer -> steps applied
        self.plan: Plan | None = None
        self.launches: list[tuple[Plan, RestoreSource]] = []
        self.steps_run: list[int] = []
        self.stops = 0
        self.launch_s, self.fetch_s = 2.0, 0.5
        self.throttle: dict[str, float] = {}  # node -> factor its compute is slowed by
        # Nodes sharing a host's CPUs: with this many nodes working, every stage is this many
        # times slower (absent: 1).
        self.contention: dict[int, float] = {}
        # node -> factors its compute is slowed by on its first steps after each launch that gives
        # it work (a freshly loaded rank warming up); later steps run at its speed.
        self.warmup: dict[str, tuple[float, ...]] = {}
        self.steps_since_launch = 0
        self.before_step: Callable[[int], None] | None = None  # hook: inject events mid-step
        self.step_errors: dict[int, Exception] = {}  # step -> exception it raises
        self.overflows: dict[int, int] = {}  # step -> times it overflows in fp16 (no update)
        self.loss_scale = 2.0**16

    # -- the port --------------------------------------------------------------------------
    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        self.clock.advance(self.launch_s)
        self.launches.append((plan, restore))
        self.steps_since_launch = 0
        ranks = [(r, s) for r, rep in enumerate(plan.replicas) for s in rep.stages]
        self.rank_node = self._place([s for _, s in ranks])
        self.rank_layers = {i: s.layers for i, (_, s) in enumerate(ranks)}
        self._raise_if_dead(set(self.rank_node))
        source = self._initial_states(restore)
        self.state = {
            rank: {layer: source[layer] for layer in range(a, b)}
            for rank, (a, b) in self.rank_layers.items()
        }
        self.plan = plan

    def step(self, step: int) -> StepReport:
        assert self.plan is not None, "step before launch"
        if self.before_step:
            self.before_step(step)
        if step in self.step_errors:
            raise self.step_errors.pop(step)
        self._raise_if_dead(set(self.rank_node))
        # Same arithmetic as FakePlanner: a replica takes batch / speed seconds, split evenly
        # over its stages; a throttled node stretches its stages.
        timings, replica_s = [], []
        working = {st.node for rep in self.plan.replicas for st in rep.stages}
        crowd = self.contention.get(len(working), 1.0)
        for r, rep in enumerate(self.plan.replicas):
            speed = sum(SPEEDS[stage.device_type] for stage in rep.stages)
            total_s = 0.0
            for s, stage in enumerate(rep.stages):
                compute_s = rep.batch_size / speed / len(rep.stages)
                compute_s *= self.throttle.get(stage.node or "", 1.0) * crowd
                warming = self.warmup.get(stage.node or "", ())
                if self.steps_since_launch < len(warming):
                    compute_s *= warming[self.steps_since_launch]
                timings.append(StageTiming(r, s, stage.device_type, compute_s, 0.0))
                total_s += compute_s
            replica_s.append(total_s)
        duration_s = max(replica_s)
        self.clock.advance(duration_s)
        self.steps_since_launch += 1
        if self.overflows.get(step, 0) > 0:  # like the engine: no rank applies it, scale halves
            self.overflows[step] -= 1
            scale, self.loss_scale = self.loss_scale, self.loss_scale / 2
            return StepReport(step, 1.0, duration_s, self.plan.global_batch_size, (), True, scale)
        for layers in self.state.values():
            for layer in layers:
                layers[layer] = (*layers[layer], step)
        self.steps_run.append(step)
        return StepReport(
            step=step,
            loss=1.0 / (step + 1),
            step_duration_s=duration_s,
            samples=self.plan.global_batch_size,
            stage_timings=tuple(timings),
        )

    def layer_holders(self) -> dict[int, tuple[int, ...]]:
        holders: dict[int, list[int]] = {}
        for rank, layers in self.state.items():
            # Like an actor group, it knows of deaths the cluster has noticed, not of fresh ones.
            if self.rank_node[rank] in self.cluster.nodes:
                for layer in layers:
                    holders.setdefault(layer, []).append(rank)
        return {layer: tuple(ranks) for layer, ranks in sorted(holders.items())}

    def placement(self) -> dict[int, str]:
        return dict(self.rank_node)

    def fetch_layer_states(self, sources: Mapping[int, int]) -> dict[int, object]:
        self.clock.advance(self.fetch_s)
        self._raise_if_dead(set(sources.values()))
        return {layer: self.state[rank][layer] for layer, rank in sources.items()}

    def stop(self) -> None:
        self.stops += 1
        self.state, self.rank_node, self.rank_layers, self.plan = {}, {}, {}, None

    # -- internals -------------------------------------------------------------------------
    def _place(self, stages: list[StageSpec]) -> dict[int, str]:
        """Rank -> node: a pinned stage's node; an unpinned one takes a free device of its type
        (nodes in id order), as Ray's placement group does."""
        free = {n.node_id: n.num_devices for n in self.cluster.nodes.values()}
        for stage in stages:
            if stage.node is not None and stage.node in free:
                free[stage.node] -= 1
        placed: dict[int, str] = {}
        for rank, stage in enumerate(stages):
            node = stage.node
            if node is None:
                node = next(
                    (
                        i
                        for i, n in sorted(self.cluster.nodes.items())
                        if n.device_type == stage.device_type and free[i] > 0
                    ),
                    None,
                )
                if node is None:
                    raise TransientError(f"placement: no free {stage.device_type} device")
                free[node] -= 1
            placed[rank] = node
        return placed

    def _raise_if_dead(self, ranks: set[int]) -> None:
        dead = {r for r in ranks if not self.cluster.alive(self.rank_node[r])}
        if dead:
            raise WorkerLost(dead, {self.rank_node[r] for r in dead}, "actor died")

    def _initial_states(self, restore: RestoreSource) -> dict[int, tuple[int, ...]]:
        if restore.kind is RestoreKind.REPLICAS:
            return dict(restore.states)  # type: ignore[arg-type]
        if restore.kind is RestoreKind.CHECKPOINT:
            assert restore.checkpoint_step is not None
            return self.store.load(restore.checkpoint_step)  # type: ignore[return-value]
        return {layer: () for layer in range(NUM_LAYERS)}


@dataclass
class Harness:
    """A controller wired to fakes, plus the fakes for the test to poke."""

    clock: FakeClock
    cluster: FakeCluster
    workers: FakeWorkerGroup
    store: FakeCheckpointStore
    planner: FakePlanner
    controller: Controller

    def states_until(self, predicate: Callable[[Controller], bool], limit: int = 500) -> list[str]:
        """Step until ``predicate`` holds; return the state names seen after each step."""
        seen = []
        for _ in range(limit):
            if predicate(self.controller):
                return seen
            seen.append(str(self.step().name))
        raise AssertionError(f"condition not reached in {limit} steps; states {seen[-20:]}")

    def step(self) -> object:
        """One controller step, then the fake clock sleeps what the state waits (as ``run()``
        would, between steps)."""
        state = self.controller.step()
        wait_s = self.controller.wait_s()
        if wait_s > 0:
            self.clock.sleep(wait_s)
        return state

    def final_layer_states(self) -> dict[int, object]:
        """The layers of the newest checkpoint (the run saves one at the end)."""
        return self.store.saved[max(self.store.saved)][0]


def make_harness(
    nodes: list[tuple[str, str, int]] | None = None,
    *,
    callbacks: tuple = (),
    store: FakeCheckpointStore | None = None,
    clock: FakeClock | None = None,
    **config: object,
) -> Harness:
    """A controller on fake nodes ``(node_id, device_type, num_devices)``; ``config`` overrides
    :class:`ControllerConfig` fields (``total_steps`` defaults to 20)."""
    clock = clock or FakeClock()
    cluster = FakeCluster(clock)
    for node_id, device_type, count in nodes or [("a", "A100-80", 2), ("b", "A100-80", 2)]:
        cluster.add(node_id, device_type, count)
    store = store or FakeCheckpointStore()
    workers = FakeWorkerGroup(cluster, clock, store)
    planner = FakePlanner()
    settings: dict[str, object] = {"total_steps": 20, "checkpoint_interval_steps": 5}
    settings.update(config)
    controller = Controller(
        config=ControllerConfig(**settings),  # type: ignore[arg-type]
        probe=cluster,
        workers=workers,
        checkpoints=store,
        planner=planner,
        clock=clock,
        callbacks=callbacks,
    )
    return Harness(clock, cluster, workers, store, planner, controller)
