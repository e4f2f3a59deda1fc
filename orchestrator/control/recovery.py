"""Where a new worker group's state comes from: surviving replicas, the checkpoint, or nothing.

A layer's parameters and optimizer state survive a failure when a surviving rank holds it (its
data-parallel peers hold identical copies after every committed step). If *every* layer survives,
the run continues from the next step and loses nothing. If one layer has no surviving holder, the
whole model goes back to the latest checkpoint: mixing layers from step ``s`` with layers from
checkpoint step ``c < s`` would train a model that never existed. Then ``lost_steps = s - c``.
Without a checkpoint the run starts over (``lost_steps = s``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple

# Opaque to the controller; on the worker side {"params": ..., "optimizer": ...}.
LayerState = object


class CheckpointRef(NamedTuple):
    """A complete checkpoint: state after ``step`` committed steps, with its manifest."""

    step: int
    manifest: Mapping[str, object]


class RestoreKind(StrEnum):
    FRESH = "fresh"  # initialise from the seed
    REPLICAS = "replicas"  # states read from surviving workers, held in ``RestoreSource.states``
    CHECKPOINT = "checkpoint"  # every layer from the checkpoint at ``checkpoint_step``


@dataclass(frozen=True)
class RestoreSource:
    """What :meth:`WorkerGroupPort.launch` restores, and the step the new group runs first.

    ``layer_sources`` says where each layer came from ("rank 3", "checkpoint@40", "seed") for the
    log; ``lost_steps`` is how many committed steps the restore throws away.
    """

    kind: RestoreKind
    resume_step: int
    lost_steps: int = 0
    checkpoint_step: int | None = None
    states: Mapping[int, LayerState] = field(default_factory=dict, repr=False)
    layer_sources: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def fresh(cls, num_layers: int | None = None, lost_steps: int = 0) -> RestoreSource:
        sources = {i: "seed" for i in range(num_layers)} if num_layers else {}
        return cls(RestoreKind.FRESH, resume_step=0, lost_steps=lost_steps, layer_sources=sources)

    @classmethod
    def from_checkpoint(
        cls, ref: CheckpointRef, next_step: int, num_layers: int | None = None
    ) -> RestoreSource:
        sources = {i: f"checkpoint@{ref.step}" for i in range(num_layers)} if num_layers else {}
        return cls(
            RestoreKind.CHECKPOINT,
            resume_step=ref.step,
            lost_steps=max(0, next_step - ref.step),
            checkpoint_step=ref.step,
            layer_sources=sources,
        )

    def summary(self) -> dict[str, object]:
        """JSON-able description for events and logs."""
        by_source: dict[str, list[int]] = {}
        for layer, source in sorted(self.layer_sources.items()):
            by_source.setdefault(source, []).append(layer)
        return {
            "restore": str(self.kind),
            "resume_step": self.resume_step,
            "lost_steps": self.lost_steps,
            "checkpoint_step": self.checkpoint_step,
            "layers_by_source": by_source,
        }


@dataclass(frozen=True)
class RestoreChoice:
    """The outcome of :func:`choose_restore`: read these layers from these ranks, or fall back."""

    kind: RestoreKind
    ranks_by_layer: Mapping[int, int]  # for REPLICAS: layer -> surviving rank to read it from
    missing_layers: tuple[int, ...]  # layers no survivor holds (why we fell back)
    checkpoint: CheckpointRef | None
    next_step: int

    @property
    def lost_steps(self) -> int:
        if self.kind is RestoreKind.REPLICAS:
            return 0
        if self.kind is RestoreKind.CHECKPOINT and self.checkpoint is not None:
            return max(0, self.next_step - self.checkpoint.step)
        return self.next_step


def choose_restore(
    *,
    num_layers: int,
    holders: Mapping[int, Iterable[int]],
    lost_ranks: Iterable[int],
    checkpoint: CheckpointRef | None,
    next_step: int,
) -> RestoreChoice:
    """Pick the restore source for every layer.

    ``holders`` maps each layer to the ranks holding it at the last committed step (``next_step``
    steps done); ranks in ``lost_ranks`` are dead. Each layer is read from its lowest surviving
    rank (deterministic). A checkpoint newer than the state in memory cannot exist; one at
    ``next_step`` loses nothing either way, and replicas are still preferred (no disk read).
    """
    dead = set(lost_ranks)
    ranks_by_layer: dict[int, int] = {}
    missing = []
    for layer in range(num_layers):
        alive = sorted(r for r in holders.get(layer, ()) if r not in dead)
        if alive:
            ranks_by_layer[layer] = alive[0]
        else:
            missing.append(layer)
    if not missing:
        return RestoreChoice(RestoreKind.REPLICAS, ranks_by_layer, (), checkpoint, next_step)
    kind = RestoreKind.CHECKPOINT if checkpoint is not None else RestoreKind.FRESH
    return RestoreChoice(kind, {}, tuple(missing), checkpoint, next_step)


def with_layer_sources(restore: RestoreSource, num_layers: int) -> RestoreSource:
    """``restore`` with ``layer_sources`` filled in for a model of ``num_layers`` planner layers."""
    if restore.layer_sources:
        return restore
    if restore.kind is RestoreKind.CHECKPOINT:
        label = f"checkpoint@{restore.checkpoint_step}"
    elif restore.kind is RestoreKind.FRESH:
        label = "seed"
    else:
        label = "replica"
    return replace(restore, layer_sources={i: label for i in range(num_layers)})


def lowest_holders(
    holders: Mapping[int, Iterable[int]], avoid_ranks: Iterable[int] = ()
) -> dict[int, int]:
    """Layer -> the lowest rank holding it, preferring ranks outside ``avoid_ranks``."""
    avoid = set(avoid_ranks)
    out = {}
    for layer, ranks in holders.items():
        ordered = sorted(ranks, key=lambda r: (r in avoid, r))
        if ordered:
            out[layer] = ordered[0]
    return dict(sorted(out.items()))
