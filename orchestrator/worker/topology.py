"""From a Plan to ranks: who runs which layers, who talks to whom, who all-reduces what.

Pure (no torch): the Ray side uses it to place one actor per rank, the engine uses it to build
process groups. Ranks are numbered replica-major, then stage, then tensor-parallel position:
replica 0's stages first, then replica 1's, and so on; a stage with ``tp == n`` is ``n``
consecutive ranks (its tensor-parallel group).

Pipeline traffic between stages of different tp degrees: every rank of a stage holds the whole
activation (tensor-parallel layers take and give replicated tensors), so tp position ``j`` of
stage ``s`` receives its input from position ``j mod tp(s-1)`` of the previous stage, and its
output gradient from position ``j mod tp(s+1)`` of the next one. Each rank sends to exactly the
ranks that receive from it.

Gradient all-reduce groups: a planner layer is held by exactly one rank in each replica; the
*holders* of a layer are those ranks. Replicas may cut the model at different layers, so two
layers of one rank can have different holder sets; each distinct holder set is one process group,
and the gradients of the layers with that holder set are all-reduced in it. Groups are ordered by
their first layer, so every rank issues its collectives in the same global order (no deadlock).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import SpecError
from orchestrator.spec.plan import Plan, Sharding


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
    tp: int = 1
    tp_rank: int = 0  # position in the stage's tensor-parallel group
    stage_ranks: tuple[int, ...] = ()  # the stage's tensor-parallel group (this rank included)
    next_ranks: tuple[int, ...] = ()  # ranks of the next stage that receive this rank's output
    prev_ranks: tuple[int, ...] = ()  # ranks of the previous stage that receive its input grad
    sharding: Sharding = Sharding.NONE

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
    """Raise :class:`SpecError` for plans the Ray runtime cannot place: the same as the engine's
    (:func:`check_executable`); every rank, tensor-parallel positions included, is one actor."""
    check_executable(plan)


def check_executable(plan: Plan) -> None:
    """Raise :class:`SpecError` for plans the engine cannot execute.

    Sharded stages must have tp 1 (a shard group splits whole-layer flat buffers).
    """
    for r, replica in enumerate(plan.replicas):
        for s, stage in enumerate(replica.stages):
            where = f"plan.replicas[{r}].stages[{s}].sharding"
            if stage.sharding is not Sharding.NONE and stage.tp != 1:
                raise SpecError(
                    f"stage shards {stage.sharding.value} at tp={stage.tp}; sharded stages "
                    "run at tp 1",
                    field=where,
                    fix="set tp: 1 on sharded stages or sharding: none on tensor-parallel ones",
                )


def ranks_for_plan(plan: Plan) -> list[RankSpec]:
    """One :class:`RankSpec` per device: replica-major, then stage, then tp position."""
    specs: list[RankSpec] = []
    rank = 0
    offset = 0
    for r, replica in enumerate(plan.replicas):
        firsts: list[int] = []
        for stage in replica.stages:
            firsts.append(rank)
            rank += stage.tp
        n = len(replica.stages)
        for s, stage in enumerate(replica.stages):
            group = tuple(range(firsts[s], firsts[s] + stage.tp))
            prev_tp = replica.stages[s - 1].tp if s > 0 else 0
            next_tp = replica.stages[s + 1].tp if s < n - 1 else 0
            for j, me in enumerate(group):
                specs.append(
                    RankSpec(
                        rank=me,
                        replica=r,
                        stage=s,
                        num_stages=n,
                        device_type=stage.device_type,
                        layers=stage.layers,
                        node=stage.node,
                        prev_rank=firsts[s - 1] + j % prev_tp if s > 0 else None,
                        next_rank=firsts[s + 1] + j % next_tp if s < n - 1 else None,
                        replica_batch_size=replica.batch_size,
                        replica_sample_offset=offset,
                        tp=stage.tp,
                        tp_rank=j,
                        stage_ranks=group,
                        next_ranks=tuple(
                            firsts[s + 1] + k for k in range(next_tp) if k % stage.tp == j
                        ),
                        prev_ranks=tuple(
                            firsts[s - 1] + k for k in range(prev_tp) if k % stage.tp == j
                        ),
                        sharding=stage.sharding,
                    )
                )
        offset += replica.batch_size
    return specs


def world_size(plan: Plan) -> int:
    """Number of ranks the plan needs (one per device)."""
    return plan.num_devices


def tp_groups(plan: Plan) -> list[tuple[int, ...]]:
    """The tensor-parallel groups (stages with tp > 1), in rank order; every rank creates them
    in this order."""
    groups = {s.stage_ranks for s in ranks_for_plan(plan) if s.tp > 1}
    return sorted(groups)


def layer_holders(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Planner layer -> the ranks holding it (one per replica, ascending)."""
    holders: dict[int, list[int]] = {i: [] for i in range(plan.num_layers)}
    for spec in ranks_for_plan(plan):
        for layer in spec.layer_indices:
            holders[layer].append(spec.rank)
    return {layer: tuple(sorted(ranks)) for layer, ranks in holders.items()}


def grad_groups(plan: Plan) -> list[GradGroup]:
    """Distinct holder sets spanning more than one replica, ordered by their first layer.

    Every rank must create these process groups in this order (``new_group`` is collective over
    the whole world) and all-reduce in this order.
    """
    replica_of = {s.rank: s.replica for s in ranks_for_plan(plan)}
    by_ranks: dict[tuple[int, ...], list[int]] = {}
    for layer, ranks in sorted(layer_holders(plan).items()):
        # Holders in one replica only (one stage's tp group) have nothing to sum.
        if len({replica_of[r] for r in ranks}) > 1:
            by_ranks.setdefault(ranks, []).append(layer)
    groups = [GradGroup(ranks=ranks, layers=tuple(layers)) for ranks, layers in by_ranks.items()]
    return sorted(groups, key=lambda g: g.layers[0])


def checkpoint_writers(plan: Plan) -> dict[int, int]:
    """Planner layer -> the one rank that saves it (the lowest holder: tp position 0 of the
    holding stage in the lowest replica)."""
    return {layer: ranks[0] for layer, ranks in layer_holders(plan).items()}


def shard_sources(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Planner layer -> the ranks whose states together make its whole state: the writer's
    tensor-parallel group (just the writer at tp 1), or, for a layer whose writer shards it,
    the group's sharded holders (each holds a slice of the optimizer state)."""
    by_rank = {s.rank: s for s in ranks_for_plan(plan)}
    out = {layer: by_rank[w].stage_ranks for layer, w in checkpoint_writers(plan).items()}
    for group in shard_groups(plan):
        for layer in group.layers:
            if out[layer][0] in group.sharded:
                out[layer] = group.sharded
    return out


@dataclass(frozen=True)
class ShardGroup:
    """Holders of some layers, of which ``sharded`` split their training state.

    ``ranks`` is the gradient group (every holder); ``sharded`` the holders whose stages shard,
    in rank order; shard ``k`` of the group's flat state belongs to ``sharded[k]``.
    """

    ranks: tuple[int, ...]
    sharded: tuple[int, ...]
    layers: tuple[int, ...]
    level: Sharding

    @property
    def all_sharded(self) -> bool:
        return self.sharded == self.ranks


def shard_groups(plan: Plan) -> list[ShardGroup]:
    """The gradient groups with two or more sharded holders, in ``grad_groups`` order.

    A single sharded holder has nobody to split with and keeps its state whole.
    """
    by_rank = {s.rank: s for s in ranks_for_plan(plan)}
    out: list[ShardGroup] = []
    for g in grad_groups(plan):
        sharded = tuple(r for r in g.ranks if by_rank[r].sharding is not Sharding.NONE)
        if len(sharded) < 2:
            continue
        levels = {by_rank[r].sharding for r in sharded}
        if len(levels) > 1:
            raise SpecError(
                f"planner layers {list(g.layers)} are sharded at different levels "
                f"{sorted(v.value for v in levels)}",
                field="plan.replicas[].stages[].sharding",
                fix="give every sharded stage holding a layer the same sharding level",
            )
        out.append(ShardGroup(ranks=g.ranks, sharded=sharded, layers=g.layers, level=levels.pop()))
    return out


def shard_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ranges, sizes differing by at most 1."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def layer_copies(plan: Plan) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Planner layer -> its complete copies: each a set of ranks that together hold the layer's
    whole state (parameters and optimizer state), lowest rank first.

    A tensor-parallel stage's ranks are one copy (each holds a slice); the sharded holders of a
    shard group are one copy (each holds a slice of the optimizer state, and under ``full`` of
    the parameters too);
    any other holder is a copy by itself. A layer survives the loss of some ranks while one of
    its copies has no lost rank.
    """
    by_rank = {s.rank: s for s in ranks_for_plan(plan)}
    sharded_copy: dict[int, tuple[int, ...]] = {}
    for group in shard_groups(plan):
        for layer in group.layers:
            sharded_copy[layer] = group.sharded
    out: dict[int, tuple[tuple[int, ...], ...]] = {}
    for layer, holders in layer_holders(plan).items():
        copies: set[tuple[int, ...]] = set()
        for r in holders:
            shared = sharded_copy.get(layer)
            copies.add(shared if shared is not None and r in shared else by_rank[r].stage_ranks)
        out[layer] = tuple(sorted(copies))
    return out


def whole_layers(plan: Plan, rank: int) -> set[int]:
    """Layers ``rank`` holds whole by itself (tp 1 and not splitting them with a shard group):
    the layers an actor may keep in place, as they are, across a change of plan."""
    return {
        layer for layer, copies in layer_copies(plan).items() for copy in copies if copy == (rank,)
    }


def copy_of(plan: Plan, layer: int, rank: int) -> tuple[int, ...]:
    """The copy of ``layer`` that ``rank`` is part of (KeyError if it does not hold the layer)."""
    for copy in layer_copies(plan)[layer]:
        if rank in copy:
            return copy
    raise KeyError(f"rank {rank} holds no copy of planner layer {layer}")


def overlaps_grad_reduce(plan: Plan) -> bool:
    """Whether the plan's gradient all-reduce may overlap the backward (``worker/grad_sync``).

    Not with a tensor-parallel stage (its holders contribute whole-shape buffers cut from
    slices) nor with a shard group whose holders all shard gradients (reduced slice by slice):
    both run the blocking reduction, and the choice holds for every rank so that the holders of
    a group build the same buffers.
    """
    if any(stage.tp > 1 for replica in plan.replicas for stage in replica.stages):
        return False
    return not any(g.level.shards_gradients and g.all_sharded for g in shard_groups(plan))
