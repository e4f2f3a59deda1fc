"""Step time and memory of a whole plan.

For replica ``r`` with stages ``0..p-1`` and ``m`` microbatches, stage ``s`` takes ``T_s`` seconds
per microbatch (forward + backward compute plus sending its activations forward and gradients
back). Under 1F1B (and GPipe) the pipeline finishes after ``(m - 1) * max_s T_s + sum_s T_s``.
Then each device all-reduces its layers' gradients with the other replicas holding those layers
(ring, over the slowest link among them, at the bandwidth a message of that size reaches) and
applies the optimizer; the step ends when the slowest device is done. Where the runtime starts the
all-reduce from gradient hooks (``RuntimePreset.overlaps_gradient_allreduce``) only the part that
outlasts the last microbatch's backward is charged; at least the all-reduce of the stage's first
layer, whose gradients come last, is always exposed. Where the runtime reduces in buckets
(``RuntimePreset.grad_bucket_bytes``) a bucket starts only once all of its layers are done, so a
stage whose gradients fit one bucket has its whole all-reduce exposed. Each stage also pays the
runtime's fixed seconds per microbatch, and the step its fixed seconds per step
(``CostTables.microbatch_overhead_s``/``step_overhead_s``: measured by the profiler for our
runtime, fitted for the Megatron-DeepSpeed preset).

A stage boundary under tensor parallelism moves ``1/tp`` of the activation per rank (Megatron's
scatter/gather: each tp rank sends its slice, the receiving stage all-gathers it over the node's
links); our runtime's transfers also pay the per-message latency the profiler measured
(``CostTables.p2p_latency_s``). Peak memory is what a device would show: model state, activations
in flight and the runtime's fixed framework footprint. A stage with ``recompute`` keeps only its
blocks' inputs in flight, holds one block's full activations while recomputing it, and pays each
block's forward twice (``layer_table.recomputed_table``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.costmodel import comm, memory, network, sharding
from orchestrator.costmodel.precision import costed_inputs
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset
from orchestrator.costmodel.result import DeviceEstimate, Estimate
from orchestrator.costmodel.tables import CostTables, LayerTable
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.profiles import ProfileSet

__all__ = [
    "DeviceEstimate",
    "Estimate",
    "blocking_reduction",
    "estimate_plan",
    "estimate_with_tables",
]


def _inter_share(cluster: Cluster, node_name: str, message_bytes: float) -> float:
    node = cluster.node_by_name[node_name]
    fraction = network.inter_node_fraction(node.device_type.name, node.num_devices, message_bytes)
    return node.network_share_bytes_per_s * fraction


def _link_bandwidth(
    cluster: Cluster, a: StageSpec, b: StageSpec, message_bytes: float = float("inf")
) -> float:
    """Bandwidth between two stages' devices for one message of ``message_bytes``.

    Across nodes each device gets its share of the slower node's network (all devices of a node
    send at once in a pipeline); unknown nodes count as different nodes (pessimistic).
    """
    if a.node is not None and b.node is not None:
        if a.node == b.node:
            node = cluster.node_by_name[a.node]
            return network.intra_node_bandwidth(
                node.device_type.name, 2, message_bytes, node.intra_node_bandwidth_bytes_per_s
            )
        return min(
            _inter_share(cluster, a.node, message_bytes),
            _inter_share(cluster, b.node, message_bytes),
        )
    nodes = [n for n in cluster.nodes if n.device_type.name in (a.device_type, b.device_type)]
    shares = [_inter_share(cluster, n.name, message_bytes) for n in nodes or cluster.nodes]
    return min(shares)


def _boundary_s(
    tables: CostTables, cluster: Cluster, plan: Plan, a: StageSpec, b: StageSpec
) -> float:
    """Seconds to move one microbatch's activations (or their gradients) from ``a`` to ``b``.

    Each of the ``tp`` ranks sends its ``1/tp`` slice; the receiving stage all-gathers the slices
    within its node (Megatron's scatter/gather of pipeline tensors).
    """
    nbytes = comm.boundary_activation_bytes(tables.model, plan.microbatch_size)
    tp = min(a.tp, b.tp)
    per_rank = nbytes / tp
    seconds = comm.p2p_s(per_rank, _link_bandwidth(cluster, a, b, per_rank))
    # Each message's fixed latency where measured (our runtime's gloo transfers), once per
    # transfer: the slower end's.
    seconds += max(tables.p2p_latency_s(a.device_type), tables.p2p_latency_s(b.device_type))
    if tp > 1 and a.node != b.node:
        device = tables.device_types[b.device_type]
        nominal = (
            cluster.node_by_name[b.node].intra_node_bandwidth_bytes_per_s
            if b.node is not None
            else device.intra_node_bandwidth_bytes_per_s
        )
        bandwidth = network.intra_node_bandwidth(b.device_type, tp, nbytes, nominal)
        seconds += (tp - 1) / tp * nbytes / bandwidth
    return seconds


def _stage_microbatch_s(
    tables: CostTables, cluster: Cluster, plan: Plan, replica: ReplicaSpec, index: int
) -> float:
    stage = replica.stages[index]
    table = tables.table(stage.device_type, plan.microbatch_size, stage.tp, stage.recompute)
    start, end = stage.layers
    seconds = table.compute_s(start, end) + tables.microbatch_overhead_s(stage.device_type)
    if index + 1 < len(replica.stages):  # activations forward
        seconds += _boundary_s(tables, cluster, plan, stage, replica.stages[index + 1])
    if index > 0:  # gradients back
        seconds += _boundary_s(tables, cluster, plan, stage, replica.stages[index - 1])
    return seconds


def _holder_bandwidth(cluster: Cluster, holders: list[StageSpec], message_bytes: float) -> float:
    """Slowest link among the stages that share a layer, for one message of this size."""
    nodes = {h.node for h in holders}
    if None not in nodes and len(nodes) == 1:
        node = cluster.node_by_name[holders[0].node or ""]
        return network.intra_node_bandwidth(
            node.device_type.name,
            len(holders),
            message_bytes,
            node.intra_node_bandwidth_bytes_per_s,
        )
    bws = []
    for h in holders:
        if h.node is not None:
            bws.append(_inter_share(cluster, h.node, message_bytes))
        else:
            bws.extend(
                _inter_share(cluster, n.name, message_bytes)
                for n in cluster.nodes_of_type(h.device_type)
            )
    return min(bws)


def _allreduce_per_stage(
    tables: CostTables,
    cluster: Cluster,
    plan: Plan,
    bytes_out: dict[tuple[int, int], list[float]] | None = None,
    latency_out: dict[tuple[int, int], float] | None = None,
) -> dict[tuple[int, int], list[float]]:
    """All-reduce seconds of each layer's gradients, per (replica, stage), in layer order
    (``bytes_out``, when given, receives each layer's reduced bytes in the same order, and
    ``latency_out`` each stage's measured per-all-reduce latency, where the profile has one)."""
    model, training = tables.model, tables.training
    grad_bytes = tables.runtime.grad_bytes(model, training)
    out: dict[tuple[int, int], list[float]] = {
        (r, s): [] for r, rep in enumerate(plan.replicas) for s in range(len(rep.stages))
    }
    if bytes_out is not None:
        bytes_out.update({key: [] for key in out})
    if len(plan.replicas) == 1:
        return out
    measured: dict[frozenset[str], tuple[float, float] | None] = {}
    # Walk layers once; the holders of a layer change only at stage boundaries.
    cursor = [0] * len(plan.replicas)
    for layer in range(plan.num_layers):
        holders: list[StageSpec] = []
        for r, rep in enumerate(plan.replicas):
            while rep.stages[cursor[r]].layers[1] <= layer:
                cursor[r] += 1
            holders.append(rep.stages[cursor[r]])
        tp = min(h.tp for h in holders)
        nbytes = model.layer_params(layer) * grad_bytes / tp
        seconds = comm.ring_allreduce_s(
            nbytes, len(holders), _holder_bandwidth(cluster, holders, nbytes)
        )
        types = frozenset(h.device_type for h in holders)
        if types not in measured:
            measured[types] = tables.allreduce_cost(types)
        fit = measured[types]
        if fit is not None:
            # Our runtime's all-reduce as the profiler measured it (its latency is charged per
            # bucket, ``_exposed_allreduce_s``): the bytes at no more than its rate.
            seconds = max(seconds, nbytes / fit[1])
            if latency_out is not None:
                for r in range(len(plan.replicas)):
                    key = (r, cursor[r])
                    latency_out[key] = max(latency_out.get(key, 0.0), fit[0])
        for r in range(len(plan.replicas)):
            out[(r, cursor[r])].append(seconds)
            if bytes_out is not None:
                bytes_out[(r, cursor[r])].append(nbytes)
    return out


def _exposed_allreduce_s(
    per_layer_s: list[float],
    table: LayerTable,
    start: int,
    end: int,
    overlapped: bool,
    bucket_bytes: float | None = None,
    per_layer_bytes: list[float] | None = None,
    latency_s: float = 0.0,
) -> float:
    """The all-reduce seconds the step waits for after the pipeline (see module docstring).

    With ``bucket_bytes`` the layers' gradients are reduced in buckets as the runtime cuts them
    (backward order, a new bucket when the next layer would overflow it): a bucket starts once
    the last microbatch's backward has passed all of its layers, and buckets run one after
    another; what outlasts the backward is exposed. ``latency_s`` is paid once per all-reduce
    (per bucket; once for a stage reduced as one flat buffer).
    """
    if not per_layer_s:
        return 0.0
    total = sum(per_layer_s) + latency_s
    if not overlapped:
        return total
    if bucket_bytes is None or per_layer_bytes is None:
        # Gradients of the stage's last layers are ready first; the first layer's come last.
        window = table.backward_s(start + 1, end)
        return max(total - window, per_layer_s[0] + latency_s)
    done_s = 0.0  # when the reductions launched so far end, from the last backward's start
    passed_s = 0.0  # backward seconds of the layers after ``layer``
    bucket_s, bucket_fill = 0.0, 0.0
    for layer in range(end - 1, start - 1, -1):  # backward order
        i = layer - start
        if bucket_fill and bucket_fill + per_layer_bytes[i] > bucket_bytes:
            done_s = max(done_s, passed_s) + bucket_s + latency_s  # the bucket's layers are done
            bucket_s, bucket_fill = 0.0, 0.0
        bucket_s += per_layer_s[i]
        bucket_fill += per_layer_bytes[i]
        passed_s += table.times[layer].backward_s
    # the last bucket waits for the whole backward
    done_s = max(done_s, passed_s) + bucket_s + latency_s
    return done_s - passed_s


def estimate_plan(
    plan: Plan,
    cluster: Cluster,
    model: ModelSpec,
    training: TrainingSpec,
    profiles: ProfileSet | None = None,
    schedule: str = "1f1b",
    *,
    runtime: RuntimePreset = ORCHESTRATOR,
) -> Estimate:
    """Cost ``plan`` on ``cluster`` for this model and training setting, as ``runtime`` runs it
    (in the plan's precision when it records one, see ``costmodel/precision.py``)."""
    model, training = costed_inputs(model, training, plan.precision)
    tables = CostTables.for_cluster(model, training, cluster, profiles, runtime=runtime)
    return estimate_with_tables(plan, cluster, tables, schedule)


def blocking_reduction(plan: Plan) -> bool:
    """Whether our engine reduces this plan's gradients after the backward, not during it
    (``worker/topology.overlaps_grad_reduce``, plan-wide): with a layer whose holders all shard
    its gradients (reduced slice by slice). The engine blocks with tensor-parallel stages too;
    that is not charged here yet."""
    if not any(st.sharding.shards_gradients for rep in plan.replicas for st in rep.stages):
        return False  # the common case, without the per-layer scan
    for layer in range(plan.num_layers):
        holders = [
            st for rep in plan.replicas for st in rep.stages if st.layers[0] <= layer < st.layers[1]
        ]
        if len(holders) > 1 and all(st.sharding.shards_gradients for st in holders):
            return True
    return False


def estimate_with_tables(
    plan: Plan, cluster: Cluster, tables: CostTables, schedule: str = "1f1b"
) -> Estimate:
    """Cost ``plan`` on ``cluster``: step time, throughput, memory per device."""
    reductions = _reductions(plan, cluster, tables)
    devices: list[DeviceEstimate] = []
    pipeline_s = 0.0
    estimated: set[str] = set()
    for r, rep in enumerate(plan.replicas):
        num_micro = math.ceil(rep.batch_size / plan.microbatch_size)
        per_stage = [
            _stage_microbatch_s(tables, cluster, plan, rep, s) for s in range(len(rep.stages))
        ]
        pipeline_s = max(pipeline_s, (num_micro - 1) * max(per_stage) + sum(per_stage))
        for s, stage in enumerate(rep.stages):
            table = tables.table(stage.device_type, plan.microbatch_size, stage.tp, stage.recompute)
            start, end = stage.layers
            if any(start <= i < end for i in table.estimated_layers):
                estimated.add(stage.device_type)
            in_flight = memory.microbatches_in_flight(s, len(rep.stages), num_micro, schedule)
            devices.append(
                _stage_estimate(
                    tables, table, (r, s), stage, per_stage[s], num_micro, in_flight, reductions
                )
            )
    devices = _apply_sharding(plan, cluster, tables, devices)
    return _whole_step(plan, tables, devices, pipeline_s, estimated)


@dataclass(frozen=True)
class _Reductions:
    """The plan's gradient all-reduce, per (replica, stage): computed once for the whole plan
    (a layer's reduction spans all the replicas holding it), read by each stage's estimate."""

    per_layer_s: dict[tuple[int, int], list[float]]
    per_layer_bytes: dict[tuple[int, int], list[float]]
    overlapped: bool  # reduced during the backward, from gradient hooks
    bucket_bytes: float | None
    latency_s: dict[tuple[int, int], float]  # measured per all-reduce (absent: not measured)


def _reductions(plan: Plan, cluster: Cluster, tables: CostTables) -> _Reductions:
    """Each stage's per-layer all-reduce seconds and bytes, and how the runtime overlaps them."""
    per_layer_bytes: dict[tuple[int, int], list[float]] = {}
    latency_s: dict[tuple[int, int], float] = {}
    per_layer_s = _allreduce_per_stage(tables, cluster, plan, per_layer_bytes, latency_s)
    overlapped = tables.runtime.overlaps_gradient_allreduce and not (
        tables.runtime.blocks_sharded_reduction and blocking_reduction(plan)
    )
    return _Reductions(
        per_layer_s, per_layer_bytes, overlapped, tables.runtime.grad_bucket_bytes, latency_s
    )


def _stage_estimate(
    tables: CostTables,
    table: LayerTable,
    key: tuple[int, int],
    stage: StageSpec,
    microbatch_s: float,
    num_micro: int,
    in_flight: int,
    reductions: _Reductions,
) -> DeviceEstimate:
    """One stage's figures (replica and stage index in ``key``), before sharding adjusts them:
    its own step because every figure reads the stage's table and nothing of other stages."""
    start, end = stage.layers
    framework = tables.framework_overhead_bytes(stage.device_type)
    layer_allreduce = reductions.per_layer_s[key]
    return DeviceEstimate(
        replica=key[0],
        stage=key[1],
        device_type=stage.device_type,
        node=stage.node,
        tp=stage.tp,
        layers=stage.layers,
        microbatch_s=microbatch_s,
        compute_s=num_micro * microbatch_s,
        allreduce_s=_exposed_allreduce_s(
            layer_allreduce,
            table,
            start,
            end,
            reductions.overlapped,
            reductions.bucket_bytes,
            reductions.per_layer_bytes[key],
            reductions.latency_s.get(key, 0.0),
        ),
        update_s=table.update_s(start, end),
        memory_bytes=table.memory_bytes(start, end, in_flight) + framework,
        memory_capacity_bytes=float(tables.device_types[stage.device_type].memory_bytes),
        allreduce_total_s=sum(layer_allreduce),
        framework_bytes=framework,
        recompute=stage.recompute,
    )


def _apply_sharding(
    plan: Plan, cluster: Cluster, tables: CostTables, devices: list[DeviceEstimate]
) -> list[DeviceEstimate]:
    """Sharded stages: state split across the shard group, its gathers (``costmodel.sharding``),
    applied to the whole plan's figures at once since a shard group spans replicas."""
    # Their collectives move whole layers: the largest layer's gradients stand for the message.
    shard_message_bytes = max(
        tables.model.layer_params(i) for i in range(plan.num_layers)
    ) * tables.runtime.grad_bytes(tables.model, tables.training)
    return sharding.apply(
        plan,
        devices,
        tables.model,
        tables.training,
        lambda h: _holder_bandwidth(cluster, h, shard_message_bytes),
        tables.runtime.gathered_layers,
        tables.runtime.whole_gradients_at_peak,
        tables.runtime.optimizer_sharding_all_reduces,
        tables.runtime.layerwise_sharded_replicas,
        tables.collective_cost({d.device_type for d in devices}),
    )


def _whole_step(
    plan: Plan,
    tables: CostTables,
    devices: list[DeviceEstimate],
    pipeline_s: float,
    estimated: set[str],
) -> Estimate:
    """The step's figures from the devices': the slowest device's reduction and update after
    the pipeline, plus the per-step fixed terms."""
    tail = max(d.allreduce_s + d.update_s for d in devices)
    worst = max(devices, key=lambda d: d.allreduce_s + d.update_s)
    # Per-step fixed terms (a rank's own per-step work, the driver's round trip): the step ends
    # with the slowest rank, so the largest among the plan's device types.
    step_overhead_s = max(tables.step_overhead_s(t) for t in {d.device_type for d in devices})
    step_s = pipeline_s + tail + step_overhead_s
    return Estimate(
        step_time_s=step_s,
        throughput_samples_per_s=plan.global_batch_size / step_s,
        pipeline_s=pipeline_s,
        allreduce_s=worst.allreduce_s,
        update_s=worst.update_s,
        peak_memory_bytes=max(d.memory_bytes for d in devices),
        fits=all(d.fits for d in devices),
        devices=tuple(devices),
        estimated_device_types=tuple(sorted(estimated)),
    )
