"""What recovery, re-formation, state moves and checkpoints cost in simulated seconds.

Every constant is a measured figure of this project on the local cluster or a stated assumption
(docs/benchmarks.md, "Goodput at scale by simulation", lists each). Two ways of moving state:

- ``THROUGH_CONTROLLER`` is how the runtime works today: every layer read after a failure or for
  a checkpoint is sent to the controller process, and every rank of a new worker group receives
  its layers from it, so every byte crosses the controller node's network link; a new group is
  started from scratch (placement, actors, ``import torch``, rendezvous: ``group_start_s``).
- ``KEEP_SURVIVORS`` is the design the runtime moves to: surviving actors stay and only re-form
  their process groups (``reform_s``); a layer moves only to a node that did not hold it before,
  actor to actor, all nodes receiving in parallel; checkpoints are written by the holders
  themselves. It is a projection with a target re-formation time, not a measurement.

Byte counts come from the model: parameters plus optimizer state of each layer (gradients are not
moved), the same per-parameter figures as the cost model's memory term.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.control.recovery import RestoreKind
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan

# Measured on the local cluster (docs/controller.md, docs/benchmarks.md "Recovery and join"): a
# traced recovery spent 1.3 s until the lost worker was detected (fast health checks) and 5.35 s
# starting the new worker group (placement group 0.7 s, actors 1.0 s, import and rendezvous 3.6 s).
MEASURED_DETECT_S = 1.3
MEASURED_GROUP_START_S = 5.35
# The switch target of the keep-survivors design (crash or join -> first step <= 2 s).
TARGET_REFORM_S = 2.0
LINK_BYTES_PER_S = 12.5e9  # 100 Gb/s per node, the cluster default between nodes
STORAGE_BYTES_PER_S = 50e9  # aggregate checkpoint storage bandwidth (assumption)


class StateMove(StrEnum):
    THROUGH_CONTROLLER = "through-controller"
    KEEP_SURVIVORS = "keep-survivors"


@dataclass(frozen=True)
class CostModel:
    """Seconds charged to the simulated clock for each operation of the worker-group port."""

    layer_state_bytes: tuple[float, ...]  # per planner layer: parameters + optimizer state
    move: StateMove = StateMove.THROUGH_CONTROLLER
    detect_s: float = MEASURED_DETECT_S
    group_start_s: float = MEASURED_GROUP_START_S
    reform_s: float = TARGET_REFORM_S
    link_bytes_per_s: float = LINK_BYTES_PER_S
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S

    @classmethod
    def for_model(cls, model: ModelSpec, training: TrainingSpec, **fields: object) -> CostModel:
        moved = training.state_bytes_per_param(model.dtype) - training.grad_bytes_per_param(
            model.dtype
        )
        sizes = tuple(float(model.layer_params(i) * moved) for i in range(model.num_planner_layers))
        return cls(layer_state_bytes=sizes, **fields)  # type: ignore[arg-type]

    @property
    def model_state_bytes(self) -> float:
        return sum(self.layer_state_bytes)

    # -- the port's operations ---------------------------------------------------------------

    def fetch_s(self, layers: int) -> float:
        """Reading ``layers`` layer states (after a failure, before a switch or a checkpoint)."""
        if self.move is StateMove.KEEP_SURVIVORS:
            return 0.0  # the states stay where they are
        return self.model_state_bytes * layers / len(self.layer_state_bytes) / self.link_bytes_per_s

    def checkpoint_write_s(self) -> float:
        """Writing every layer once (the read through the controller is charged by fetch_s)."""
        bytes_ = self.model_state_bytes
        if self.move is StateMove.KEEP_SURVIVORS:
            return bytes_ / self.storage_bytes_per_s  # holders write their shards in parallel
        return bytes_ / min(self.link_bytes_per_s, self.storage_bytes_per_s)

    def checkpoint_read_s(self) -> float:
        return self.model_state_bytes / self.storage_bytes_per_s

    def launch_s(self, old: Plan | None, new: Plan, source: RestoreKind) -> tuple[float, float]:
        """(seconds, bytes moved) to start ``new`` restoring from ``source``; ``old`` ran before.

        Through the controller, a new group starts from scratch and every rank's layers leave
        the controller (which reads the checkpoint first when restoring one). Keeping survivors,
        the group re-forms; from a checkpoint every rank reads its own layers (storage-bound),
        from replicas only the layer copies new to a node move, nodes receiving in parallel. A
        fresh start initialises every layer from the seed where it runs: nothing moves.
        """
        if source is RestoreKind.FRESH:
            start_s = self.group_start_s if self.move is StateMove.THROUGH_CONTROLLER else 0.0
            return start_s + self.reform_or_zero(), 0.0
        from_checkpoint = source is RestoreKind.CHECKPOINT
        if self.move is StateMove.THROUGH_CONTROLLER:
            moved = self.total_bytes(new)
            read_s = self.checkpoint_read_s() if from_checkpoint else 0.0
            return self.group_start_s + read_s + moved / self.link_bytes_per_s, moved
        if from_checkpoint:
            moved = self.total_bytes(new)
            return self.reform_s + moved / self.storage_bytes_per_s, moved
        by_node = self.bytes_new_by_node(old, new)
        slowest = max(by_node.values(), default=0.0)
        return self.reform_s + slowest / self.link_bytes_per_s, sum(by_node.values())

    def reform_or_zero(self) -> float:
        return self.reform_s if self.move is StateMove.KEEP_SURVIVORS else 0.0

    # -- byte counts -------------------------------------------------------------------------

    def total_bytes(self, plan: Plan) -> float:
        """Bytes of every stage's layers summed over the plan (each replica holds a copy)."""
        return sum(
            sum(self.layer_state_bytes[a:b])
            for rep in plan.replicas
            for a, b in (stage.layers for stage in rep.stages)
        )

    def bytes_new_by_node(self, old: Plan | None, new: Plan) -> dict[str, float]:
        """Per node of ``new``: bytes of the layer copies it holds in ``new`` beyond those it
        held in ``old`` (a change of tensor-parallel degree is not counted as a move)."""
        before = _layers_by_node(old) if old is not None else {}
        moved: dict[str, float] = {}
        for node, layers in _layers_by_node(new).items():
            extra = layers - before.get(node, Counter())
            moved[node] = sum(self.layer_state_bytes[i] * n for i, n in extra.items())
        return moved


def _layers_by_node(plan: Plan) -> Mapping[str, Counter[int]]:
    held: dict[str, Counter[int]] = {}
    for rep in plan.replicas:
        for stage in rep.stages:
            counter = held.setdefault(stage.node or "", Counter())
            counter.update(range(*stage.layers))
    return held
