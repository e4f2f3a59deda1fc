"""From a Plan to ranks: who runs which layers, who talks to whom, who all-reduces what.

Pure (no torch): the Ray side uses it to place one actor per rank, the engine uses it to build
process groups. Ranks are numbered replica-major, stage-minor: replica 0's stages first, then
replica 1's, and so on. Each stage is one rank (the worker runs ``tp == 1`` stages only).

Gradient all-reduce groups: a planner layer is held by exactly one rank in each replica; the
*holders* of a layer are those ranks. Replicas may cut the model at different layers, so two
layers of one rank can have different holder sets; each distinct holder set is one process group,
and the gradients of the layers with that holder set are all-reduced in it. Groups are ordered by
their first layer, so every rank issues its collectives in the same global order (no deadlock).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan


@dataclass(frozen=True)
class RankSpec:
    """One worker: a stage of a replica, with its pipeline neighbours and batch slice."""

    rank: int
    replica: int
    stage: int
    num_stages: int
    device_type: str
    layers: tuple[int, int]  # planner layers [start, end)
    node: str | None
    prev_rank: int | None  # the previous stage of the same replica (sends activations here)
    next_rank: int | None  # the next stage of the same replica
    replica_batch_size: int
    replica_sample_offset: int  # this replica's first sample in the global batch

    @property
    def is_first_stage(self) -> bool:
        return self.prev_rank is None

    @property
    def is_last_stage(self) -> bool:
        return self.next_rank is None

    @property
    def layer_indices(self) -> range:
        return range(*self.layers)


@dataclass(frozen=True)
class GradGroup:
    """Ranks that share some layers, and those layers: one all-reduce process group."""

    ranks: tuple[int, ...]
    layers: tuple[int, ...]


def check_supported(plan: Plan) -> None:
    """Raise :class:`SpecError` for plans the worker cannot run (tensor-parallel stages)."""
    for r, replica in enumerate(plan.replicas):
        for s, stage in enumerate(replica.stages):
            if stage.tp != 1:
                raise SpecError(
                    f"stage has tp={stage.tp}; the worker runs tensor-parallel degree 1 only",
                    field=f"plan.replicas[{r}].stages[{s}].tp",
                    fix="re-plan with max_tensor_parallel: 1",
                )


def ranks_for_plan(plan: Plan) -> list[RankSpec]:
    """One :class:`RankSpec` per stage, replica-major, stage-minor."""
    check_supported(plan)
    specs: list[RankSpec] = []
    rank = 0
    offset = 0
    for r, replica in enumerate(plan.replicas):
        first = rank
        n = len(replica.stages)
        for s, stage in enumerate(replica.stages):
            specs.append(
                RankSpec(
                    rank=first + s,
                    replica=r,
                    stage=s,
                    num_stages=n,
                    device_type=stage.device_type,
                    layers=stage.layers,
                    node=stage.node,
                    prev_rank=first + s - 1 if s > 0 else None,
                    next_rank=first + s + 1 if s < n - 1 else None,
                    replica_batch_size=replica.batch_size,
                    replica_sample_offset=offset,
                )
            )
        rank += n
        offset += replica.batch_size
    return specs


def world_size(plan: Plan) -> int:
    """Number of ranks the plan needs."""
    return sum(len(r.stages) for r in plan.replicas)


def layer_holders(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Planner layer -> the ranks holding it (one per replica, ascending)."""
    holders: dict[int, list[int]] = {i: [] for i in range(plan.num_layers)}
    for spec in ranks_for_plan(plan):
        for layer in spec.layer_indices:
            holders[layer].append(spec.rank)
    return {layer: tuple(sorted(ranks)) for layer, ranks in holders.items()}


def grad_groups(plan: Plan) -> list[GradGroup]:
    """Distinct holder sets with more than one rank, ordered by their first layer.

    Every rank must create these process groups in this order (``new_group`` is collective over
    the whole world) and all-reduce in this order.
    """
    by_ranks: dict[tuple[int, ...], list[int]] = {}
    for layer, ranks in sorted(layer_holders(plan).items()):
        if len(ranks) > 1:
            by_ranks.setdefault(ranks, []).append(layer)
    groups = [GradGroup(ranks=ranks, layers=tuple(layers)) for ranks, layers in by_ranks.items()]
    return sorted(groups, key=lambda g: g.layers[0])


def checkpoint_writers(plan: Plan) -> dict[int, int]:
    """Planner layer -> the one rank that saves it (the holder in the lowest replica)."""
    return {layer: ranks[0] for layer, ranks in layer_holders(plan).items()}
