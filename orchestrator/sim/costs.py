"""What recovery, re-formation, state moves and checkpoints cost in simulated seconds.

Every constant is a measured figure of this project on the local cluster or a stated assumption
(docs/benchmarks.md, "Goodput at scale by simulation", lists each). Two ways of moving state:

- ``KEEP_SURVIVORS`` is how the runtime works now (``runtime/elastic/survivors.py``,
  ``group_port.py``): surviving actors stay and re-form their process groups (``reform_s``,
  measured); a layer moves only to a node that did not hold it before, actor to actor, all nodes
  receiving in parallel; checkpoints are written by the layers' holders (each layer by its
  lowest-replica holder), bounded by the busiest writer node's link and the storage's aggregate
  bandwidth. A restore from a checkpoint is read by the new holders themselves
  (``runtime/elastic/restore.py``): every copy of a layer is read by its holder (a
  tensor-parallel stage's once, by its first rank), all in parallel, so the read is bounded by
  the storage's aggregate bandwidth for all the bytes read and by the busiest reader node's link
  (``RestoreRead.HOLDERS``). ``RestoreRead.CONTROLLER`` keeps the
  model of the runtime before that change, as a labelled comparison: the controller reads the
  checkpoint once and sends every rank its layers through its own link.
- ``THROUGH_CONTROLLER`` is how the runtime worked before, kept as a labelled comparison: every
  layer read after a failure or for a checkpoint is sent to the controller process, and every
  rank of a new worker group receives its layers from it, so every byte crosses the controller
  node's network link; a new group is started from scratch (placement, actors, ``import torch``,
  rendezvous: ``group_start_s``).

Both start the first group from scratch (``group_start_s``). A join pays only the re-formation
and its moved layers: the runtime warms the joiner's actor while the current plan trains.

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
# Re-formation in place, measured in the demo's crash recovery (``orchestrator demo``, 2 cores at
# load 2-5): "re-formed in place: 3 actors kept, 0 started; 13 layers kept in place, 5 moved
# (10.01 MB) in 1.35 s" (1.21 s in the run kept in bench/results/demo_2026-12-01_crash_recovery.txt;
# bench/recovery.py measured 0.09-2.14 s, docs/benchmarks.md). Its 10 MB take milliseconds: the
# figure is the fixed part (settle, process groups destroyed, engines built, rendezvous).
MEASURED_REFORM_S = 1.35
LINK_BYTES_PER_S = 12.5e9  # 100 Gb/s per node, the cluster default between nodes
STORAGE_BYTES_PER_S = 50e9  # aggregate checkpoint storage bandwidth (assumption)


class StateMove(StrEnum):
    THROUGH_CONTROLLER = "through-controller"
    KEEP_SURVIVORS = "keep-survivors"


class RestoreRead(StrEnum):
    """Who reads a checkpoint for a restore when survivors are kept."""

    HOLDERS = "holders"  # each rank its own layers' files (the runtime now)
    CONTROLLER = "controller"  # the controller reads and sends every rank its layers (before)


@dataclass(frozen=True)
class CostModel:
    """Seconds charged to the simulated clock for each operation of the worker-group port."""

    layer_state_bytes: tuple[float, ...]  # per planner layer: parameters + optimizer state
    move: StateMove = StateMove.KEEP_SURVIVORS
    detect_s: float = MEASURED_DETECT_S
    group_start_s: float = MEASURED_GROUP_START_S
    reform_s: float = MEASURED_REFORM_S
    link_bytes_per_s: float = LINK_BYTES_PER_S
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S
    restore_read: RestoreRead = RestoreRead.HOLDERS

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

    def checkpoint_write_s(self, bytes_by_writer_node: Mapping[str, float] | None = None) -> float:
        """Writing every layer once (through the controller, its read is charged by fetch_s).

        Written by the holders (``bytes_by_writer_node``: what each writer node writes), the
        busiest writer's link and the storage's aggregate bandwidth bound it. The parts a
        tensor-parallel or sharded writer receives from its peers are not counted.
        """
        bytes_ = self.model_state_bytes
        if self.move is StateMove.KEEP_SURVIVORS:
            busiest = max(bytes_by_writer_node.values(), default=0.0) if bytes_by_writer_node else 0
            return max(bytes_ / self.storage_bytes_per_s, busiest / self.link_bytes_per_s)
        return bytes_ / min(self.link_bytes_per_s, self.storage_bytes_per_s)

    def checkpoint_read_s(self) -> float:
        return self.model_state_bytes / self.storage_bytes_per_s

    def launch_s(self, old: Plan | None, new: Plan, source: RestoreKind) -> tuple[float, float]:
        """(seconds, bytes moved) to start ``new`` restoring from ``source``; ``old`` ran before.

        A first group (no ``old``) starts from scratch. Through the controller, every group
        starts from scratch and every rank's layers leave the controller (which reads the
        checkpoint first when restoring one). Keeping survivors, the group re-forms; from
        replicas only the layer copies new to a node move, nodes receiving in parallel; from a
        checkpoint every rank reads its own layers' files (:meth:`holder_read_s`; with
        ``RestoreRead.CONTROLLER``, the controller reads it and sends every rank its layers). A
        fresh start initialises every layer from the seed where it runs: nothing moves.
        """
        fresh_group = self.move is StateMove.THROUGH_CONTROLLER or old is None
        start_s = self.group_start_s if fresh_group else self.reform_s
        if source is RestoreKind.FRESH:
            return start_s, 0.0
        holders_read = (
            source is RestoreKind.CHECKPOINT
            and self.move is StateMove.KEEP_SURVIVORS
            and self.restore_read is RestoreRead.HOLDERS
        )
        if holders_read:
            by_node = self.read_bytes_by_node(new)
            return start_s + self.holder_read_s(by_node), sum(by_node.values())
        if source is RestoreKind.CHECKPOINT or self.move is StateMove.THROUGH_CONTROLLER:
            moved = self.total_bytes(new)
            read_s = (
                self.model_state_bytes / min(self.link_bytes_per_s, self.storage_bytes_per_s)
                if source is RestoreKind.CHECKPOINT
                else 0.0
            )
            return start_s + read_s + moved / self.link_bytes_per_s, moved
        by_node = self.bytes_new_by_node(old, new)
        slowest = max(by_node.values(), default=0.0)
        return start_s + slowest / self.link_bytes_per_s, sum(by_node.values())

    def holder_read_s(self, bytes_by_reader_node: Mapping[str, float]) -> float:
        """Every reader node reading its bytes of a checkpoint at once: the storage's aggregate
        bandwidth for all of them, or the busiest node's link, whichever takes longer."""
        total = sum(bytes_by_reader_node.values())
        busiest = max(bytes_by_reader_node.values(), default=0.0)
        return max(total / self.storage_bytes_per_s, busiest / self.link_bytes_per_s)

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

    def read_bytes_by_node(self, plan: Plan) -> dict[str, float]:
        """Per node: bytes of checkpoint files its ranks read for a restore into ``plan``: each
        copy of a layer once (a stage's layers, read by its rank, or by the first rank of a
        tensor-parallel stage for all its ranks on the node; a sharded holder reads the whole
        layers and cuts its slice), so every replica's copy is read."""
        out: dict[str, float] = {}
        for rep in plan.replicas:
            for stage in rep.stages:
                a, b = stage.layers
                node = stage.node or ""
                out[node] = out.get(node, 0.0) + sum(self.layer_state_bytes[a:b])
        return out

    def writer_bytes_by_node(self, plan: Plan) -> dict[str, float]:
        """Per node: bytes of the layers it writes into a checkpoint, each layer written once by
        its holder in the lowest replica (``worker/topology.checkpoint_writers``)."""
        written: set[int] = set()
        out: dict[str, float] = {}
        for rep in plan.replicas:
            for stage in rep.stages:
                mine = [i for i in range(*stage.layers) if i not in written]
                written.update(mine)
                node = stage.node or ""
                out[node] = out.get(node, 0.0) + sum(self.layer_state_bytes[i] for i in mine)
        return out


def _layers_by_node(plan: Plan) -> Mapping[str, Counter[int]]:
    held: dict[str, Counter[int]] = {}
    for rep in plan.replicas:
        for stage in rep.stages:
            counter = held.setdefault(stage.node or "", Counter())
            counter.update(range(*stage.layers))
    return held
