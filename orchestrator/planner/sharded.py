"""A sharded data-parallel candidate: every device a whole replica, state sharded across all.

Cephalo's layout (every GPU holds the whole model's layers, training state sharded across all
of them, per-GPU batches set by speed): it uses every device, including ones too small or too
slow for a pipeline stage of their own. Batch shares are water-filled on the cost tables (each
sample goes to the device that would finish it soonest), and the candidate is tried at each
sharding level the engine executes and each microbatch size; the search keeps it only when the
cost model says it is faster than the pipelined plans and it fits.
"""

from __future__ import annotations

import heapq

from orchestrator.costmodel import Estimate, estimate_with_tables, sharding
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding, StageSpec

# Tried in this order; a later level is kept only when strictly faster. Where every device is
# a sharded holder our engine runs ``gradients`` and ``full`` layer by layer
# (``costmodel.sharding.runs_layer_by_layer``), so ``full`` holds about one layer's whole
# weights: the level that serves a model whose state fits only with its parameters sharded.
LEVELS = (Sharding.OPTIMIZER, Sharding.GRADIENTS, Sharding.FULL)


def _shares(seconds_per_sample: list[float], batch: int) -> list[int]:
    """Water-fill ``batch`` samples: each to the device whose finish time grows least."""
    counts = [1] * len(seconds_per_sample)  # every device takes part
    heap = [(2 * t, i) for i, t in enumerate(seconds_per_sample)]
    heapq.heapify(heap)
    for _ in range(batch - len(counts)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) * seconds_per_sample[i], i))
    return counts


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
    model, training = tables.model, tables.training
    table = tables.table(device_type, microbatch_size, 1)
    whole_model = start == 0 and end == model.num_planner_layers and not model.tie_embeddings
    if tables.runtime.layerwise_sharded_replicas and level.shards_gradients and whole_model:
        # every holder a whole one-stage replica: the runtime shards layer by layer
        held = sum(sharding.layerwise_state_bytes(model, training, range(end), level, k))
        unsharded = sum(sum(sharding.state_parts_bytes(model, training, i, 1)) for i in range(end))
        return (
            table.state_bytes(0, end)
            - unsharded
            + held
            + tables.framework_overhead_bytes(device_type)
        )
    saved = 0.0
    weights_total = 0.0
    for layer in range(start, end):
        weights, grads, opt = sharding.state_parts_bytes(model, training, layer, 1)
        saved += weights + grads + opt
        saved -= sharding.sharded_state_bytes(
            model, training, layer, 1, level, k, tables.runtime.whole_gradients_at_peak
        )
        weights_total += weights
    held = table.state_bytes(start, end) - saved + tables.framework_overhead_bytes(device_type)
    if level is Sharding.FULL:
        held += sharding.gathered_bytes(
            model, training, range(start, end), 1, tables.runtime.gathered_layers
        )
    return held


def sharded_data_parallel(
    cluster: Cluster, tables: CostTables, global_batch_size: int, microbatch_sizes: list[int]
) -> tuple[Plan, Estimate] | None:
    """The fastest fitting sharded data-parallel plan over every device, or None."""
    devices = [(n.name, n.device_type.name) for n in cluster.nodes for _ in range(n.num_devices)]
    if len(devices) < 2 or global_batch_size < len(devices):
        return None
    layers = tables.model.num_planner_layers
    best: tuple[Plan, Estimate] | None = None
    capacity = {t: float(tables.device_types[t].memory_bytes) for t in {t for _, t in devices}}
    for mbs in microbatch_sizes:
        # Levels at which some device cannot even hold its share of the state are not costed.
        levels = [
            level
            for level in LEVELS
            if all(
                state_floor_bytes(tables, t, mbs, 0, layers, level, len(devices)) <= capacity[t]
                for t in capacity
            )
        ]
        if not levels:
            continue
        per_sample = [tables.table(t, mbs, 1).compute_s(0, layers) / mbs for _, t in devices]
        shares = _shares(per_sample, global_batch_size)
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
