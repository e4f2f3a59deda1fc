"""Sharded data-parallel candidates: whole replicas, state sharded across the devices they use.

Cephalo's layout (every GPU holds the whole model's layers, training state sharded across all
of them, per-GPU batches set by speed): it uses every device, including ones too small or too
slow for a pipeline stage of their own. The same layout over the devices of one type, or of the
fastest few types, leaves slower devices idle where their share would not pay for what they add
to the step's all-reduce and gather (e.g. four tp-1 replicas of the fastest type sharding their
optimizer state, where the slow types and a tp-4 replica are both slower). Batch shares are
water-filled on the cost tables in whole microbatches (each to the device that would finish it
soonest), and each candidate is tried at each sharding level the engine executes and each
microbatch size; the search keeps the fastest only when the cost model says it is faster than
the pipelined plans and it fits.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from typing import cast

from orchestrator.costmodel import Estimate, estimate_with_tables, sharding
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding, StageSpec

# Tried in this order; a later level is kept only when strictly faster. Where every device is
# a sharded holder our engine runs ``gradients`` and ``full`` layer by layer
# (``costmodel.sharding.runs_layer_by_layer``), so ``full`` holds about one layer's whole
# weights: the level that serves a model whose state fits only with its parameters sharded.
LEVELS = (Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL)


def _shares(seconds_per_microbatch: list[float], microbatch_size: int, batch: int) -> list[int]:
    """Samples per device: ``batch`` water-filled in whole microbatches, each to the device
    whose finish time grows least, every device at least one.

    A device with ``b`` samples runs ``ceil(b / microbatch_size)`` microbatches, each costing a
    whole one (the cost model's rule), so filling microbatches minimises the slowest finish; the
    last microbatch handed out may be partial (``batch`` need not divide). With fewer
    microbatches than devices, samples are filled instead (each device then runs one, partial).
    """
    n = len(seconds_per_microbatch)
    microbatches = math.ceil(batch / microbatch_size)
    if microbatches < n:
        return _sample_shares([t / microbatch_size for t in seconds_per_microbatch], batch)
    counts = [1] * n  # every device takes part
    heap = [(2 * t, i) for i, t in enumerate(seconds_per_microbatch)]
    heapq.heapify(heap)
    for _ in range(microbatches - n):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) * seconds_per_microbatch[i], i))
    shares = [c * microbatch_size for c in counts]
    # The excess (less than one microbatch) comes off the device that finishes last: its last
    # microbatch turns partial and costs what it did; ties to the later device.
    excess = sum(shares) - batch
    if excess:
        last = max(range(n), key=lambda i: (counts[i] * seconds_per_microbatch[i], i))
        shares[last] -= excess
    return shares


def _sample_shares(seconds_per_sample: list[float], batch: int) -> list[int]:
    """Water-fill ``batch`` samples: each to the device whose finish time grows least."""
    counts = [1] * len(seconds_per_sample)  # every device takes part
    heap = [(2 * t, i) for i, t in enumerate(seconds_per_sample)]
    heapq.heapify(heap)
    for _ in range(batch - len(counts)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) * seconds_per_sample[i], i))
    return counts


def _saved_bytes(tables: CostTables, level: Sharding, k: int) -> tuple[float, float]:
    """(state bytes a holder of the whole model saves sharding at ``level`` over ``k``, whole
    weights ``full`` holds for the step), kept per (level, k) with the tables."""
    key = ("sharded data parallel saved", level, k)
    found = tables.templates.get(key)
    if found is None:
        found = _saved(tables, 0, tables.model.num_planner_layers, level, k)
        tables.templates[key] = found
    return found  # type: ignore[return-value]


def _saved(
    tables: CostTables, start: int, end: int, level: Sharding, k: int
) -> tuple[float, float]:
    model, training = tables.model, tables.training
    saved = 0.0
    for layer in range(start, end):
        weights, grads, opt = sharding.state_parts_bytes(model, training, layer, 1)
        saved += weights + grads + opt
        saved -= sharding.sharded_state_bytes(
            model, training, layer, 1, level, k, tables.runtime.whole_gradients_at_peak
        )
    gathered = (
        sharding.gathered_bytes(
            model, training, range(start, end), 1, tables.runtime.gathered_layers
        )
        if level is Sharding.FULL
        else 0.0
    )
    return saved, gathered


def state_floor_bytes(
    tables: CostTables,
    device_type: str,
    microbatch_size: int,
    start: int,
    end: int,
    level: Sharding,
    k: int,
) -> float:
    """What a holder of layers ``[start, end)`` sharding at ``level`` over ``k`` holders keeps
    at least (state and the runtime's footprint, activations left out), as the cost model
    counts it: a lower bound on its estimated memory, so a candidate above the device's memory
    is refused without costing it."""
    table = tables.table(device_type, microbatch_size, 1)
    model, training = tables.model, tables.training
    whole = start == 0 and end == model.num_planner_layers
    if (
        tables.runtime.layerwise_sharded_replicas
        and level.shards_gradients
        and whole
        and not model.tie_embeddings
    ):
        # every holder a whole one-stage replica: the runtime shards layer by layer (the sums
        # depend on the level and holders alone, kept with the solved shapes: every type and
        # microbatch size reads them)
        key = ("layerwise state", level, k, end)
        sums = tables.templates.get(key)
        if sums is None:
            sums = tables.templates[key] = (
                sum(sharding.layerwise_state_bytes(model, training, range(end), level, k)),
                sum(sum(sharding.state_parts_bytes(model, training, i, 1)) for i in range(end)),
            )
        held, unsharded = cast("tuple[float, float]", sums)
        return (
            table.state_bytes(0, end)
            - unsharded
            + held
            + tables.framework_overhead_bytes(device_type)
        )
    saved, gathered = (
        _saved_bytes(tables, level, k) if whole else _saved(tables, start, end, level, k)
    )
    held = table.state_bytes(start, end) - saved + tables.framework_overhead_bytes(device_type)
    return held + gathered


def sharded_data_parallel(
    cluster: Cluster,
    tables: CostTables,
    global_batch_size: int,
    microbatch_sizes: list[int],
    device_types: Collection[str] | None = None,
) -> tuple[Plan, Estimate] | None:
    """The fastest fitting sharded data-parallel plan over every device of ``device_types``
    (default: every device of the cluster), or None."""
    devices = [
        (n.name, n.device_type.name)
        for n in cluster.nodes
        if device_types is None or n.device_type.name in device_types
        for _ in range(n.num_devices)
    ]
    if len(devices) < 2 or global_batch_size < len(devices):
        return None
    layers = tables.model.num_planner_layers
    best: tuple[Plan, Estimate] | None = None
    capacity = {t: float(tables.device_types[t].memory_bytes) for t in {t for _, t in devices}}
    for mbs in microbatch_sizes:
        # Levels at which some device cannot hold its share of the state and one microbatch's
        # activations (every replica runs at least one) are not costed.
        floor = {t: tables.table(t, mbs, 1).activation_bytes(0, layers) for t in sorted(capacity)}
        levels = [
            level
            for level in LEVELS
            if all(
                state_floor_bytes(tables, t, mbs, 0, layers, level, len(devices)) + floor[t]
                <= capacity[t]
                for t in capacity
            )
        ]
        if not levels:
            continue
        per_microbatch = [tables.table(t, mbs, 1).compute_s(0, layers) for _, t in devices]
        shares = _shares(per_microbatch, mbs, global_batch_size)
        for level in levels:
            plan = Plan(
                global_batch_size=global_batch_size,
                microbatch_size=mbs,
                replicas=tuple(
                    ReplicaSpec(
                        batch_size=b,
                        stages=(
                            StageSpec(layers=(0, layers), device_type=t, node=node, sharding=level),
                        ),
                    )
                    for b, (node, t) in zip(shares, devices, strict=True)
                ),
            )
            est = estimate_with_tables(plan, cluster, tables)
            if est.fits and (best is None or est.step_time_s < best[1].step_time_s):
                best = (plan, est)
    return best


def device_type_sets(rates: Mapping[str, float]) -> list[tuple[str, ...]]:
    """The device-type sets a sharded data-parallel candidate spans: every type, each type
    alone, and the fastest ``k`` types for each ``1 < k`` below all (``rates``: one device's
    samples per second by type; ties by name). Every type first: on equal step times the
    candidate over more devices is kept."""
    fastest = sorted(rates, key=lambda t: (-rates[t], t))
    every = tuple(sorted(rates))
    sets = [every]
    for t in fastest:
        if (t,) not in sets:
            sets.append((t,))
    for k in range(2, len(fastest)):
        sets.append(tuple(sorted(fastest[:k])))
    return sets


def best_sharded_data_parallel(
    cluster: Cluster,
    tables: CostTables,
    global_batch_size: int,
    microbatch_sizes: list[int],
    rates: Mapping[str, float],
) -> tuple[Plan, Estimate] | None:
    """The fastest fitting sharded data-parallel plan over any of :func:`device_type_sets`
    (every device, one type's devices, the fastest types' devices), or None."""
    best: tuple[Plan, Estimate] | None = None
    for types in device_type_sets(rates):
        found = sharded_data_parallel(
            cluster, tables, global_batch_size, microbatch_sizes, set(types)
        )
        if found is not None and (best is None or found[1].step_time_s < best[1].step_time_s):
            best = found
    return best
