"""Replica templates: a pipeline shape with its layer split solved, and the cluster facts used.

A template is "stages of these (device type, tp) pairs, in this order, at this microbatch size"
plus its exact layer split and per-stage timings. The search instantiates templates as many times
as devices allow; identical replicas share one template, so choosing among thousands of replicas
costs no more than choosing among a handful of templates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import cast

from orchestrator.costmodel import comm, sharding
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset
from orchestrator.costmodel.tables import CostTables, LayerTable
from orchestrator.planner.partition import Split, StageCosts, fits_memory, split_layers
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Sharding

# Pipeline depths tried; uneven splits make any depth usable, this list keeps the search small
# while covering the powers of two and the depths between them.
PIPELINE_DEPTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)


@dataclass(frozen=True)
class TypeInfo:
    """Cluster facts about one device type, conservative where its nodes differ."""

    name: str
    num_devices: int
    devices_per_node: int  # the smallest node of this type
    intra_node_bandwidth_bytes_per_s: float
    network_share_bytes_per_s: float  # one device's share of its node's network (slowest node)
    memory_cap_bytes: float
    tp_options: tuple[int, ...]


def type_infos(
    cluster: Cluster,
    model: ModelSpec,
    training: TrainingSpec,
    runtime: RuntimePreset = ORCHESTRATOR,
) -> dict[str, TypeInfo]:
    """One :class:`TypeInfo` per device type in the cluster, keyed and ordered by name; memory
    caps leave out ``runtime``'s fixed framework footprint."""
    out: dict[str, TypeInfo] = {}
    for name in sorted(cluster.device_types):
        nodes = cluster.nodes_of_type(name)
        per_node = min(n.num_devices for n in nodes)
        # tp: powers of two that divide every node of the type and the attention heads.
        tps = tuple(
            t
            for t in (1, 2, 4, 8, 16)
            if t <= training.max_tensor_parallel
            and all(n.num_devices % t == 0 for n in nodes)
            and model.num_heads % t == 0
        )
        out[name] = TypeInfo(
            name=name,
            num_devices=sum(n.num_devices for n in nodes),
            devices_per_node=per_node,
            intra_node_bandwidth_bytes_per_s=min(n.intra_node_bandwidth_bytes_per_s for n in nodes),
            network_share_bytes_per_s=min(n.network_share_bytes_per_s for n in nodes),
            memory_cap_bytes=max(
                0.0,
                cluster.device_types[name].memory_bytes
                - runtime.framework_overhead_bytes(cluster.device_types[name]),
            ),
            tp_options=tps,
        )
    return out


@dataclass(frozen=True)
class Template:
    """A replica shape with its split solved."""

    microbatch_size: int
    stage_types: tuple[tuple[str, int], ...]  # (device type, tp) per stage, in pipeline order
    split: Split
    update_s: tuple[float, ...]  # optimizer seconds per stage
    grad_bytes: tuple[float, ...]  # gradient bytes each stage's devices all-reduce
    # Per stage: activation recompute on its blocks (on only where memory forces it).
    recompute: tuple[bool, ...] = ()
    # Per stage: the state sharded across the template's replicas (empty: none anywhere), and
    # the fewest replicas the split's memory assumes (1: unsharded).
    sharding: tuple[Sharding, ...] = ()
    shard_k: int = 1

    @property
    def key(self) -> tuple[object, ...]:
        """Total order used to break ties deterministically."""
        return self._key

    def __post_init__(self) -> None:
        # Read in the search's innermost loop: computed once, not per access.
        object.__setattr__(self, "bottleneck_s", max(self.split.stage_s))
        object.__setattr__(self, "sum_s", sum(self.split.stage_s))
        object.__setattr__(self, "num_devices", sum(tp for _, tp in self.stage_types))
        usage: dict[str, int] = {}
        for name, tp in self.stage_types:
            usage[name] = usage.get(name, 0) + tp
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "tail_cache", {})
        key = (
            self.microbatch_size,
            self.stage_types,
            self.split.boundaries,
            self.recompute,
            tuple(v.value for v in self.sharding),
            self.shard_k,
        )
        object.__setattr__(self, "_key", key)

    bottleneck_s: float = field(init=False, compare=False)
    sum_s: float = field(init=False, compare=False)
    num_devices: int = field(init=False, compare=False)  # devices one replica uses
    # Devices per type one replica uses (read only).
    usage: dict[str, int] = field(init=False, compare=False, repr=False)
    # planner/batching.py: all-reduce plus optimizer seconds by (replicas, bandwidth).
    tail_cache: dict[tuple[int, float], float] = field(init=False, compare=False, repr=False)
    _key: tuple[object, ...] = field(init=False, compare=False, repr=False)


def _p2p_bandwidth(a: TypeInfo, b: TypeInfo, one_type_devices: int | None) -> float:
    """Bandwidth between consecutive stages: intra-node when the whole replica fits one node
    (``one_type_devices``: the replica's device count when it uses one type, else None)."""
    if a.name == b.name and one_type_devices is not None and one_type_devices <= a.devices_per_node:
        return a.intra_node_bandwidth_bytes_per_s
    return min(a.network_share_bytes_per_s, b.network_share_bytes_per_s)


def _state_parts(tables: CostTables, tp: int) -> list[tuple[float, float, float, float]]:
    """Per layer on one of ``tp`` devices: (weights, gradients, optimizer, fp32 master) bytes,
    kept with the solved shapes (each sharded solve reads them for every layer)."""
    key = ("state parts", tp)
    found = tables.templates.get(key)
    if found is None:
        model, training = tables.model, tables.training
        found = [
            (
                *sharding.state_parts_bytes(model, training, layer, tp),
                sharding.master_bytes(model, training, layer, tp),
            )
            for layer in range(model.num_planner_layers)
        ]
        tables.templates[key] = found
    return cast("list[tuple[float, float, float, float]]", found)


def sharded_state_table(
    tables: CostTables, table: LayerTable, level: Sharding, k: int
) -> LayerTable:
    """``table`` with each layer's state as one of ``k`` holders sharding it at ``level`` keeps
    it (``costmodel/sharding.py``: what it saves, plus under ``full`` the whole weights our
    runtime gathers for the step, or ``gathered_layers`` of them, charged by the caller)."""
    whole_weights = level is Sharding.FULL and tables.runtime.gathered_layers is None
    whole_grads = tables.runtime.whole_gradients_at_peak
    states = []
    for layer, (weights, grads, opt, master) in enumerate(_state_parts(tables, table.tp)):
        kept = sharding.shard_of(weights, grads, opt, level, k, whole_grads, master)
        held = table.state_bytes(layer, layer + 1) - (weights + grads + opt) + kept
        states.append(held + (weights if whole_weights else 0.0))
    return replace(
        table,
        state_prefix_bytes=(0.0, *accumulate(states)),
        _memory_prefix_cache={},
        _largest_cache={},
    )


def _gathered_cap_bytes(tables: CostTables, level: Sharding) -> float:
    """Whole weights a ``full`` stage holds beyond its slices where the runtime gathers layer by
    layer: the model's largest ``gathered_layers`` layers (a bound for any stage)."""
    layers = tables.runtime.gathered_layers
    if level is not Sharding.FULL or layers is None:
        return 0.0
    return sharding.gathered_bytes(
        tables.model, tables.training, range(tables.model.num_planner_layers), 1, layers
    )


def build_template(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
    shard: tuple[Sharding, int] | None = None,
) -> Template | None:
    """Solve the split for this shape; None if it cannot fit in memory even with recompute.

    Activation recompute is turned on only where memory forces it, from the first stage on:
    under 1F1B stage ``s`` of ``p`` holds ``p - s`` microbatches in flight, so the early stages
    need it first. The first of "none, stage 0, stages 0-1, ..., all" whose split fits is taken
    (recompute costs each block's forward again, so no more of it than needed), found by
    bisection over the count.
    """
    # The cluster facts the solve reads are part of the key (a search sees one set; a caller
    # that changes a type's memory gets a fresh solve).
    facts = tuple(infos[n] for n in sorted({n for n, _ in stage_types}))
    key = (stage_types, microbatch_size, shard, facts)
    if key in tables.templates:
        return cast("Template | None", tables.templates[key])
    found = _solve_template(tables, infos, stage_types, microbatch_size, shard)
    tables.templates[key] = found
    return found


def _least_layer_bytes(
    tables: CostTables, device_type: str, microbatch_size: int, tp: int
) -> list[float]:
    """Per layer, the fewest bytes its ``tp`` devices hold for it on a stage of this type,
    with or without recompute (state plus one microbatch in flight, summed over the devices);
    kept with the solved shapes."""
    key = ("least layer bytes", device_type, microbatch_size, tp)
    found = tables.templates.get(key)
    if found is None:
        recompute = (False, True) if tables.training.activation_recompute else (False,)
        prefixes = [
            tables.table(device_type, microbatch_size, tp, r).memory_prefix_bytes(1)
            for r in recompute
        ]
        found = [
            tp * min(prefix[layer + 1] - prefix[layer] for prefix in prefixes)
            for layer in range(tables.model.num_planner_layers)
        ]
        tables.templates[key] = found
    return cast("list[float]", found)


def _memory_rules_out(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
) -> bool:
    """Whether no split of this unsharded shape fits memory with any stages recomputing: each
    layer needs at least its least bytes on any of the shape's (type, tp) pairs
    (:func:`_least_layer_bytes`, every stage holding at least one microbatch in flight), and
    a stage's ``tp`` devices hold at most ``tp`` times their type's memory cap; so the shape
    fits only if the caps add up to the layers' least needs. A necessary condition, checked
    before the split is solved (many deep shapes of small devices fail it)."""
    pairs = sorted(set(stage_types))
    key = ("least model bytes", microbatch_size, tuple(pairs))
    need = tables.templates.get(key)
    if need is None:
        per_pair = [_least_layer_bytes(tables, t, microbatch_size, tp) for t, tp in pairs]
        need = sum(min(column) for column in zip(*per_pair, strict=True))
        tables.templates[key] = need
    held = sum(tp * infos[name].memory_cap_bytes for name, tp in stage_types)
    return held < cast("float", need)


def _solve_template(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
    shard: tuple[Sharding, int] | None,
) -> Template | None:
    """:func:`build_template` without its memo."""
    if shard is None and _memory_rules_out(tables, infos, stage_types, microbatch_size):
        return None
    state_tables: dict[tuple[str, bool], LayerTable] = {}  # sharded tables, per type
    comms = _stage_comm_s(tables, infos, stage_types, microbatch_size)
    stage_cache: dict[object, object] = {}
    found = _build_template(
        tables, infos, stage_types, microbatch_size, (), shard, state_tables, comms, stage_cache
    )
    if found is not None or not tables.training.activation_recompute:
        return found
    p = len(stage_types)
    fixed = (tables, infos, stage_types, microbatch_size)
    cached = (shard, state_tables, comms, stage_cache)

    def with_first(count: int) -> Template | None:
        return _build_template(*fixed, tuple(s < count for s in range(p)), *cached)

    def fits_with_first(count: int) -> bool:
        # Whether the count's split exists (memory alone decides it): the bisection below
        # reads only that, so the split's time is solved once, at the count it finds.
        stages = _stage_costs(*fixed, tuple(s < count for s in range(p)), *cached)
        return stages is not None and fits_memory(stages, tables.model.num_planner_layers)

    # Bisection over the count: recomputing one more stage lowers that stage's memory (it holds
    # p - s >= 2 microbatches of activations, where recompute keeps their inputs and one
    # block's transient), so whether a split fits only improves with the count, up to p - 1.
    # The last stage holds one microbatch, where recompute does not save: tried on its own.
    lo, hi = 0, p - 1  # no split at 0 recomputing stages; find the least count that has one
    if hi == 0 or not fits_with_first(hi):
        return with_first(p)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits_with_first(mid):
            hi = mid
        else:
            lo = mid
    return with_first(hi)


def _stage_comm_s(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
) -> list[float]:
    """Per stage, the seconds of its boundary transfers per microbatch (to the next stage and
    from the previous one)."""
    p = len(stage_types)
    act_bytes = comm.boundary_activation_bytes(tables.model, microbatch_size)
    one_type = len({n for n, _ in stage_types}) == 1
    one_type_devices = sum(tp for _, tp in stage_types) if one_type else None
    out = []
    for s, (name, tp) in enumerate(stage_types):
        comm_s = 0.0
        # Under tensor parallelism each rank sends its 1/tp slice of the boundary activation.
        if s + 1 < p:
            bw = _p2p_bandwidth(infos[name], infos[stage_types[s + 1][0]], one_type_devices)
            comm_s += comm.p2p_s(act_bytes / min(tp, stage_types[s + 1][1]), bw)
        if s > 0:
            bw = _p2p_bandwidth(infos[stage_types[s - 1][0]], infos[name], one_type_devices)
            comm_s += comm.p2p_s(act_bytes / min(tp, stage_types[s - 1][1]), bw)
        out.append(comm_s)
    return out


def _transient_max_bytes(tables: CostTables, table: LayerTable) -> float:
    """``table.transient_max_bytes()``, kept with the solved shapes (read once per stage of
    every recompute count tried)."""
    key = ("transient", table.device_type, table.microbatch_size, table.tp, table.recompute)
    found = tables.templates.get(key)
    if found is None:
        found = tables.templates[key] = table.transient_max_bytes()
    return cast("float", found)


def _stage_costs(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
    recompute: tuple[bool, ...],
    shard: tuple[Sharding, int] | None,
    state_tables: dict[tuple[str, bool], LayerTable] | None,
    comms: list[float] | None,
    stage_cache: dict[object, object] | None = None,
) -> list[StageCosts] | None:
    """What the split reads about each stage of this shape (see :func:`_build_template`);
    None where the engine cannot run the shape sharded. ``stage_cache``: what was built so far
    for this shape, each stage by (position, recompute) and each list by its recompute flags,
    which the recompute counts tried share."""
    p = len(stage_types)
    stages: list[StageCosts] = []
    recompute = recompute if any(recompute) else ()
    if shard is not None and any(tp != 1 for _, tp in stage_types):
        return None  # the engine shards tp-1 stages only (worker/topology.check_executable)
    whole = None if stage_cache is None else stage_cache.get(("stages", recompute))
    if whole is not None:
        return cast("list[StageCosts]", whole)
    tables_by_key = {} if state_tables is None else state_tables
    if comms is None:
        comms = _stage_comm_s(tables, infos, stage_types, microbatch_size)
    kept = tables.templates  # stages alike across shapes, shared (see below)
    for s, (name, tp) in enumerate(stage_types):
        on = bool(recompute) and recompute[s]
        known = None if stage_cache is None else stage_cache.get((s, on))
        if known is not None:
            stages.append(cast("StageCosts", known))
            continue
        comm_s = comms[s]
        # A stage's costs depend on these alone: shapes that share a stage (same type, tp,
        # recompute, sharding, boundary transfers, microbatches in flight, memory cap) share it.
        cap_bytes = infos[name].memory_cap_bytes
        key = ("stage", name, tp, microbatch_size, on, shard, comm_s, p - s, cap_bytes)
        shared = kept.get(key)
        if shared is not None:
            stages.append(cast("StageCosts", shared))
            if stage_cache is not None:
                stage_cache[(s, on)] = shared
            continue
        table = tables.table(name, microbatch_size, tp, on)
        cap = cap_bytes - (_transient_max_bytes(tables, table) if on else 0.0)
        if shard is not None:
            state_table = tables_by_key.get((name, table.recompute))
            if state_table is None:
                state_table = sharded_state_table(tables, table, *shard)
                tables_by_key[(name, table.recompute)] = state_table
            table = state_table
            cap -= _gathered_cap_bytes(tables, shard[0])
        stages.append(
            StageCosts(
                table=table,
                comm_s=comm_s,
                in_flight=p - s,  # 1F1B peak, assuming at least p microbatches
                # A recomputing stage also holds one block's full activations while it
                # recomputes it: left out of the cap (all blocks alike: exact, else safe).
                memory_cap_bytes=cap,
            )
        )
        kept[key] = stages[-1]
        if stage_cache is not None:
            stage_cache[(s, on)] = stages[-1]
    if stage_cache is not None:
        stage_cache[("stages", recompute)] = stages
    return stages


def _build_template(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    stage_types: tuple[tuple[str, int], ...],
    microbatch_size: int,
    recompute: tuple[bool, ...],
    shard: tuple[Sharding, int] | None = None,
    state_tables: dict[tuple[str, bool], LayerTable] | None = None,
    comms: list[float] | None = None,
    stage_cache: dict[object, object] | None = None,
) -> Template | None:
    """The split for this shape with recompute on the stages marked in ``recompute`` (empty or
    all False: none), every stage's state sharded at ``shard``'s level over its count of
    replicas (None: unsharded); None if it cannot fit in memory. ``comms``: the stages'
    :func:`_stage_comm_s`, where the caller solves the shape more than once."""
    model = tables.model
    p = len(stage_types)
    recompute = recompute if any(recompute) else ()
    stages = _stage_costs(
        tables,
        infos,
        stage_types,
        microbatch_size,
        recompute,
        shard,
        state_tables,
        comms,
        stage_cache,
    )
    if stages is None:
        return None
    split = split_layers(stages, model.num_planner_layers)
    if split is None:
        return None
    grad_per_param = tables.training.grad_bytes_per_param(model.dtype)
    b = split.boundaries
    # A sharded holder updates its slice only.
    kept = 1.0 if shard is None else 1.0 / shard[1]
    update_s = tuple(st.table.update_s(b[i], b[i + 1]) * kept for i, st in enumerate(stages))
    grad_bytes = tuple(
        tables.params(b[i], b[i + 1]) * grad_per_param / tp
        for i, (_, tp) in enumerate(stage_types)
    )
    if shard is None:
        return Template(microbatch_size, stage_types, split, update_s, grad_bytes, recompute)
    return Template(
        microbatch_size,
        stage_types,
        split,
        update_s,
        grad_bytes,
        recompute,
        sharding=(shard[0],) * p,
        shard_k=shard[1],
    )


def homogeneous_templates(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    device_type: str,
    microbatch_size: int,
    sharded: Sharding | None = None,
    max_replicas: int | None = None,
    variants: bool = False,
) -> list[Template]:
    """Every feasible single-type pipeline shape for ``device_type``; with ``sharded``, also
    the tp-1 shapes that fit only with their state sharded at that level over as many replicas
    as the type's devices (and ``max_replicas``) allow, and with ``variants`` the tp-1 shapes
    that fit unsharded once more, sharded so (their optimizer step divided across the
    replicas, the split solved again in the memory sharding frees)."""
    info = infos[device_type]
    limit = tables.training.max_pipeline_stages or tables.model.num_planner_layers
    out = []
    for tp in info.tp_options:
        for p in PIPELINE_DEPTHS:
            if p > limit or p * tp > info.num_devices or p > tables.model.num_planner_layers:
                break
            shape = ((device_type, tp),) * p
            t = build_template(tables, infos, shape, microbatch_size)
            k = min(info.num_devices // p, max_replicas or info.num_devices)
            if sharded is not None and tp == 1 and k >= 2 and (t is None or variants):
                if t is not None:
                    out.append(t)
                t = build_template(tables, infos, shape, microbatch_size, (sharded, k))
            if t is not None:
                out.append(t)
    return out


def chained_templates(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    types: tuple[str, ...],
    microbatch_size: int,
    max_depth_each: int,
    tps: tuple[int, ...],
) -> list[Template]:
    """Pipelines over several types, each type's stages contiguous: ``p_i`` stages of
    ``types[i]`` at tp ``tps[i]`` (within a node of its type), in the order given, for every
    depth ``p_i`` of :data:`PIPELINE_DEPTHS` up to ``max_depth_each`` that the type's devices
    hold; shapes whose split does not fit memory are left out."""
    limit = tables.training.max_pipeline_stages or tables.model.num_planner_layers
    layers = tables.model.num_planner_layers
    if any(tp not in infos[name].tp_options for name, tp in zip(types, tps, strict=True)):
        return []
    depths = [
        [p for p in PIPELINE_DEPTHS if p <= max_depth_each and p * tp <= infos[name].num_devices]
        for name, tp in zip(types, tps, strict=True)
    ]
    out = []
    # Lexicographic over the depths, the first type's outermost (the order the search's ties
    # are broken in).
    for counts in itertools.product(*depths):
        if sum(counts) > limit or sum(counts) > layers:
            continue
        shape = tuple(
            st
            for name, tp, p in zip(types, tps, counts, strict=True)
            for st in ((name, tp),) * p
        )
        t = build_template(tables, infos, shape, microbatch_size)
        if t is not None:
            out.append(t)
    return out


def mixed_templates(
    tables: CostTables,
    infos: dict[str, TypeInfo],
    first: str,
    second: str,
    microbatch_size: int,
    max_depth_each: int,
    tps: tuple[int, int] = (1, 1),
) -> list[Template]:
    """Two-type pipelines: ``p1`` stages of ``first`` then ``p2`` of ``second``, at the tp
    degrees ``tps`` (each within a node of its type).

    Order matters for memory: under 1F1B the early stages hold the most activations, so trying
    both orders lets memory-rich types take the front where that helps.
    """
    return chained_templates(
        tables, infos, (first, second), microbatch_size, max_depth_each, tps
    )
