"""The small interfaces through which the controller reaches the world.

The Ray adapters (``orchestrator/runtime``) implement them with real nodes and actors; the unit
tests implement them with fakes and a fake clock, and step the controller one transition at a
time. Nothing here imports a framework.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from orchestrator.control.recovery import CheckpointRef, LayerState, RestoreSource
from orchestrator.errors import TransientError
from orchestrator.spec.plan import Plan
from orchestrator.spec.reports import StepReport
from orchestrator.spec.snapshot import ClusterSnapshot


class WorkerLost(TransientError):
    """Workers died (their process or their node): the ranks and the nodes they ran on.

    Raised by :class:`WorkerGroupPort` methods. Survives pickling (it may cross an actor call).
    """

    def __init__(self, ranks: Iterable[int], nodes: Iterable[str], detail: str = "") -> None:
        self.ranks = tuple(sorted(set(ranks)))
        self.nodes = tuple(sorted(set(nodes)))
        self.detail = detail
        text = f"lost ranks {list(self.ranks)} on nodes {list(self.nodes)}"
        super().__init__(f"{text}: {detail}" if detail else text)

    def __reduce__(self) -> tuple[object, ...]:
        return (WorkerLost, (self.ranks, self.nodes, self.detail))


@dataclass(frozen=True)
class PlanProposal:
    """A plan with the cost model's numbers: predicted and lower-bound seconds per step.

    ``stage_compute_s`` optionally maps (replica, stage) to predicted compute seconds per step;
    the straggler detector uses it as the baseline (else it learns one from the first steps).
    ``predicted_stage_s`` maps (replica, stage) to the cost model's busy seconds per step of
    that stage; only ratios between stages are read from it (the readmit verdict,
    ``policies/readmit.py``), since on a loaded host every stage may be off the model by more
    than a straggler threshold while their ratios hold.
    """

    plan: Plan
    predicted_step_s: float
    bound_step_s: float
    stage_compute_s: Mapping[tuple[int, int], float] = field(default_factory=dict)
    predicted_stage_s: Mapping[tuple[int, int], float] = field(default_factory=dict)
    notes: str = ""


@runtime_checkable
class ClusterProbe(Protocol):
    """Reads the cluster: about once a second in the running state (see also
    :class:`TellsNews`)."""

    def snapshot(self) -> ClusterSnapshot:
        """Alive and draining nodes now; may raise :class:`TransientError` (retried)."""
        ...


@runtime_checkable
class TellsNews(Protocol):
    """A probe that knows when a node event was posted. Optional: without it the controller
    looks at the cluster every poll interval only."""

    def take_news(self) -> bool:
        """True (once) when a node event was posted since the last call; the controller then
        polls at the next step boundary (a drain is acted on within a step, not a poll
        period)."""
        ...


@runtime_checkable
class WorkerGroupPort(Protocol):
    """One worker per rank of a plan, training in lock step.

    Every method may raise :class:`WorkerLost`. After it does, the surviving workers still answer
    :meth:`layer_holders` and :meth:`fetch_layer_states` with the state of the last *committed*
    step (a worker that applied an update for a step that did not complete rolls it back).
    """

    def launch(self, plan: Plan, restore: RestoreSource) -> None:
        """Start workers for ``plan`` and load their layers from ``restore``: the states in it
        (REPLICAS), the checkpoint at ``restore.checkpoint_step`` (CHECKPOINT) or the seed
        (FRESH). The first step to run is ``restore.resume_step``."""
        ...

    def step(self, step: int) -> StepReport:
        """Run training step ``step`` on every rank; return when it is committed everywhere."""
        ...

    def layer_holders(self) -> Mapping[int, tuple[int, ...]]:
        """Layer -> ranks that hold it (alive as far as the group knows)."""
        ...

    def placement(self) -> Mapping[int, str]:
        """Rank -> node id it runs on."""
        ...

    def fetch_layer_states(self, sources: Mapping[int, int]) -> dict[int, LayerState]:
        """Read each layer's parameters and optimizer state from the given rank
        (``sources``: layer -> rank)."""
        ...

    def stop(self) -> None:
        """Stop every worker; idempotent, never raises for workers already dead."""
        ...


@runtime_checkable
class WritesCheckpoints(Protocol):
    """A worker port whose workers write their own layers into a checkpoint's staging place
    (see :class:`StagesCheckpoints`), so that no layer's state passes through the controller.
    Optional: without it (or without a staging store) the controller reads every layer with
    :meth:`WorkerGroupPort.fetch_layer_states` and hands the states to the store."""

    def write_checkpoint(self, staging: str, sources: Mapping[int, int]) -> dict[str, object]:
        """Have the copy of each layer that ``sources`` names (layer -> rank) write the layer's
        whole state, as of the last committed step, into ``staging``; return what the writers
        report (file name -> its checksum and size) for :meth:`StagesCheckpoints.commit`.
        Raises :class:`WorkerLost` when a writer is lost; nothing is published then."""
        ...


@runtime_checkable
class StagesCheckpoints(Protocol):
    """A checkpoint store the workers can write into (see :class:`WritesCheckpoints`): the
    controller begins a staging place, the workers write the layers, the controller commits.
    ``staging`` must be reachable by every worker (shared storage across hosts)."""

    def begin(self, step: int) -> str:
        """A fresh staging place for the checkpoint of ``step`` (never read as a checkpoint)."""
        ...

    def commit(
        self, step: int, staging: str, written: Mapping[str, object], meta: Mapping[str, object]
    ) -> CheckpointRef:
        """Check the staged layers against ``written`` (the writers' reports), add ``meta`` and
        publish atomically; raises (and publishes nothing) if a layer is missing or differs."""
        ...

    def abort(self, staging: str) -> None:
        """Drop a staging place that will not be committed; never raises."""
        ...


class ReformFacts(Protocol):
    """What a port that keeps survivors reports of its last change of plan."""

    @property
    def bytes_moved(self) -> int: ...

    @property
    def actors_started(self) -> int: ...

    @property
    def actors_warm(self) -> int: ...

    @property
    def seconds(self) -> Mapping[str, float] | None: ...

    def line(self) -> str: ...


@runtime_checkable
class KeepsSurvivors(Protocol):
    """A worker port that may re-form its live workers in place across a change of plan
    (``keeps_survivors`` True): a REPLICAS restore without states then means the state stays in
    the workers. Optional: a port without it is started afresh on every plan."""

    keeps_survivors: bool


@runtime_checkable
class ReportsReform(Protocol):
    """A worker port that tells what its last change of plan moved and kept. Optional."""

    @property
    def last_reform(self) -> ReformFacts | None:
        """What the last :meth:`WorkerGroupPort.launch` moved and kept (None: a fresh start)."""
        ...


class WarmState(StrEnum):
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class WarmStatus:
    """Whether the new workers of a candidate plan are warm (``detail``: why they failed);
    ``seconds``: where the slowest one's warm-up went."""

    state: WarmState
    detail: str = ""
    seconds: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", WarmState(self.state))  # a port may pass the value


@runtime_checkable
class PreparesWorkers(Protocol):
    """A worker port that can start a candidate plan's new workers (a joined node's) and warm
    them (process, imports, model built) while the current plan keeps training, so that the
    switch at a step boundary pays only for re-forming the group and the moved layers.
    Optional: the controller switches at once with a port that lacks it."""

    def prepare(self, plan: Plan) -> int:
        """Start warming the workers ``plan`` needs that the running group lacks; how many
        (0: none needed). Never waits for them."""
        ...

    def prepared(self, plan: Plan) -> WarmStatus:
        """Whether they are ready; never blocks."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Complete, layer-indexed checkpoints, written atomically."""

    def latest(self) -> CheckpointRef | None:
        """The newest complete checkpoint, or ``None``."""
        ...

    def save(
        self, step: int, states: Mapping[int, LayerState], meta: Mapping[str, object]
    ) -> CheckpointRef:
        """Write the state after ``step`` committed steps; ``meta`` (JSON-able run state: plan,
        failures so far, lost steps) goes into the manifest."""
        ...

    def load(self, step: int) -> dict[int, LayerState]:
        """Every layer's state of the checkpoint at ``step``."""
        ...


@runtime_checkable
class Clock(Protocol):
    def now_s(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock seconds (the timebase of preemption deadlines from Ray)."""

    def now_s(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@runtime_checkable
class Planner(Protocol):
    """Chooses a plan for the usable nodes of a snapshot.

    ``slowdown_by_node`` carries measured slowness (node id -> factor > 1) that the planner must
    account for, e.g. by scaling that node's profiles. Raises
    :class:`~orchestrator.errors.InfeasibleError` when no plan fits.
    """

    def __call__(
        self, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> PlanProposal: ...


@runtime_checkable
class PlanEstimator(Protocol):
    """A planner that can also cost a given plan under the same beliefs it plans with.

    The switch rule uses it to cost the running plan again after measured speeds changed (a
    straggler, a node that cooled down), so the candidate and the running plan are compared by
    one model under one set of speeds. ``plan``'s stages carry the nodes they run on.
    """

    def estimate(
        self, plan: Plan, snapshot: ClusterSnapshot, slowdown_by_node: Mapping[str, float]
    ) -> float: ...
