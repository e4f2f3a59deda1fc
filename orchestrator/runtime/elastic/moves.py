"""Which actor runs each rank of a new plan, and which survivor sends it which layers.

The pure part of :meth:`~orchestrator.runtime.elastic.survivors.ElasticWorkerGroup.reform`: it
reads the old plan, the survivors and the layers they hold, and starts or moves nothing (the
group does that with what these functions return).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.runtime.group import WorkerInfo
from orchestrator.runtime.placement import BundleRequest
from orchestrator.spec.labels import NODE_ID_LABEL
from orchestrator.spec.plan import Plan
from orchestrator.worker.topology import RankSpec, layer_copies, shard_groups


@dataclass
class LayerMoves:
    """Per new rank (by rank): surviving old rank -> the planner layers it sends; the counts."""

    sources: list[dict[int, list[int]]]
    moved: int = 0
    kept: int = 0


def route_layers(
    new_ranks: Sequence[RankSpec],
    chosen: Mapping[int, int],
    held: Mapping[int, set[int]],
    copies: Mapping[int, list[tuple[int, ...]]],
) -> LayerMoves:
    """Each layer a new rank needs and its actor (``chosen``) does not hold whole, from a live
    copy (``copies``), the copies taken in turn by rank to spread the load."""
    moves = LayerMoves([{} for _ in new_ranks])
    for spec in new_ranks:
        # An actor keeps only layers it holds whole, and only at tp 1 (a tensor-parallel
        # rank re-cuts every layer it holds from the whole state).
        own = held.get(chosen.get(spec.rank, -1), set()) if spec.tp == 1 else set()
        need = moves.sources[spec.rank]
        for layer in spec.layer_indices:
            if layer in own:
                moves.kept += 1
                continue
            options = copies[layer]
            for source in options[spec.rank % len(options)]:  # spread the load
                need.setdefault(source, []).append(layer)
            moves.moved += 1
    return moves


def assign(
    new_ranks: Sequence[RankSpec],
    requests: Sequence[BundleRequest],
    nodes: Sequence[Any],
    alive: set[int],
    workers: Sequence[WorkerInfo],
    held: Mapping[int, set[int]],
) -> dict[int, int]:
    """New rank -> surviving old rank that runs it: a node the rank may use, most layers held."""
    node_type = {n.node_id: n.device_type for n in nodes}
    free = set(alive)
    out: dict[int, int] = {}
    for spec, request in zip(new_ranks, requests, strict=True):
        pin = request.label_selector.get(NODE_ID_LABEL)
        fits = [
            old
            for old in free
            if node_type.get(workers[old].node_id) == spec.device_type
            and (pin is None or workers[old].node_id == pin)
        ]
        if not fits:
            continue
        best = max(fits, key=lambda old: (len(held[old] & set(spec.layer_indices)), -old))
        out[spec.rank] = best
        free.discard(best)
    return out


def broken_shard_holders(plan: Plan, alive: set[int]) -> set[int]:
    """Live sharded holders of a shard group that lost a sharded holder."""
    out: set[int] = set()
    for group in shard_groups(plan):
        members = set(group.sharded)
        if members - alive:
            out |= members & alive
    return out


def live_copies(plan: Plan, alive: set[int]) -> dict[int, list[tuple[int, ...]]]:
    """Planner layer -> the copies of it (``topology.layer_copies``) whose ranks all survive."""
    return {
        layer: [c for c in copies if set(c) <= alive]
        for layer, copies in layer_copies(plan).items()
    }
