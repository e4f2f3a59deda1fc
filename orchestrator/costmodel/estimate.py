"""Step time and memory of a whole plan.

For replica ``r`` with stages ``0..p-1`` and ``m`` microbatches, stage ``s`` takes ``T_s`` seconds
per microbatch (forward + backward compute plus sending its activations forward and gradients
back). Under 1F1B (and GPipe) the pipeline finishes after ``(m - 1) * max_s T_s + sum_s T_s``.
Then each device all-reduces its layers' gradients with the other replicas holding those layers
(ring, over the slowest link among them) and applies the optimizer; the step ends when the slowest
device is done. No overlap of communication with compute is assumed, so estimates err high.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.costmodel import comm, memory, sharding
from orchestrator.costmodel.tables import CostTables
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec
from orchestrator.spec.profiles import ProfileSet


@dataclass(frozen=True)
class DeviceEstimate:
    """Figures for the devices of one stage (all ``tp`` of them alike)."""

    replica: int
    stage: int
    device_type: str
    node: str | None
    tp: int
    layers: tuple[int, int]
    microbatch_s: float  # forward + backward + p2p of one microbatch
    compute_s: float  # busy time in the pipeline this step
    allreduce_s: float
    update_s: float
    memory_bytes: float
    memory_capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_capacity_bytes


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one plan."""

    step_time_s: float
    throughput_samples_per_s: float
    pipeline_s: float
    allreduce_s: float
    update_s: float
    peak_memory_bytes: float
    fits: bool
    devices: tuple[DeviceEstimate, ...]
    estimated_device_types: tuple[str, ...] = field(default=())

    def memory_shortfall_by_type(self) -> dict[str, float]:
        """For each device type that does not fit: the largest excess in bytes."""
        out: dict[str, float] = {}
        for d in self.devices:
            if not d.fits:
                excess = d.memory_bytes - d.memory_capacity_bytes
                out[d.device_type] = max(out.get(d.device_type, 0.0), excess)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "step_time_s": self.step_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "pipeline_s": self.pipeline_s,
            "allreduce_s": self.allreduce_s,
            "update_s": self.update_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "estimated_device_types": list(self.estimated_device_types),
            "devices": [
                {
                    "replica": d.replica,
                    "stage": d.stage,
                    "device_type": d.device_type,
                    "node": d.node,
                    "tp": d.tp,
                    "layers": list(d.layers),
                    "microbatch_s": d.microbatch_s,
                    "compute_s": d.compute_s,
                    "allreduce_s": d.allreduce_s,
                    "update_s": d.update_s,
                    "memory_bytes": d.memory_bytes,
                    "memory_capacity_bytes": d.memory_capacity_bytes,
                    "fits": d.fits,
                }
                for d in self.devices
            ],
        }


def _link_bandwidth(cluster: Cluster, a: StageSpec, b: StageSpec) -> float:
    """Bandwidth between two stages' devices.

    Across nodes each device gets its share of the slower node's network (all devices of a node
    send at once in a pipeline); unknown nodes count as different nodes (pessimistic).
    """
    if a.node is not None and b.node is not None:
        if a.node == b.node:
            return cluster.node_by_name[a.node].intra_node_bandwidth_bytes_per_s
        return min(
            cluster.node_by_name[a.node].network_share_bytes_per_s,
            cluster.node_by_name[b.node].network_share_bytes_per_s,
        )
    shares = [
        n.network_share_bytes_per_s
        for n in cluster.nodes
        if n.device_type.name in (a.device_type, b.device_type)
    ]
    return min(shares) if shares else min(n.network_share_bytes_per_s for n in cluster.nodes)


def _stage_microbatch_s(
    tables: CostTables, cluster: Cluster, plan: Plan, replica: ReplicaSpec, index: int
) -> float:
    stage = replica.stages[index]
    table = tables.table(stage.device_type, plan.microbatch_size, stage.tp)
    start, end = stage.layers
    seconds = table.compute_s(start, end)
    nbytes = comm.boundary_activation_bytes(tables.model, plan.microbatch_size)
    if index + 1 < len(replica.stages):  # activations forward
        seconds += comm.p2p_s(nbytes, _link_bandwidth(cluster, stage, replica.stages[index + 1]))
    if index > 0:  # gradients back
        seconds += comm.p2p_s(nbytes, _link_bandwidth(cluster, stage, replica.stages[index - 1]))
    return seconds


def _holder_bandwidth(cluster: Cluster, holders: list[StageSpec]) -> float:
    """Slowest link among the stages that share a layer."""
    nodes = {h.node for h in holders}
    if None not in nodes and len(nodes) == 1:
        return cluster.node_by_name[holders[0].node or ""].intra_node_bandwidth_bytes_per_s
    bws = []
    for h in holders:
        if h.node is not None:
            bws.append(cluster.node_by_name[h.node].network_share_bytes_per_s)
        else:
            bws.extend(n.network_share_bytes_per_s for n in cluster.nodes_of_type(h.device_type))
    return min(bws)


def _allreduce_per_stage(
    tables: CostTables, cluster: Cluster, plan: Plan
) -> dict[tuple[int, int], float]:
    """All-reduce seconds each (replica, stage) spends on its layers' gradients."""
    model, training = tables.model, tables.training
    grad_bytes = training.grad_bytes_per_param(model.dtype)
    out = {(r, s): 0.0 for r, rep in enumerate(plan.replicas) for s in range(len(rep.stages))}
    if len(plan.replicas) == 1:
        return out
    # Walk layers once; the holders of a layer change only at stage boundaries.
    cursor = [0] * len(plan.replicas)
    for layer in range(plan.num_layers):
        holders: list[StageSpec] = []
        for r, rep in enumerate(plan.replicas):
            while rep.stages[cursor[r]].layers[1] <= layer:
                cursor[r] += 1
            holders.append(rep.stages[cursor[r]])
        tp = min(h.tp for h in holders)
        seconds = comm.ring_allreduce_s(
            model.layer_params(layer) * grad_bytes / tp,
            len(holders),
            _holder_bandwidth(cluster, holders),
        )
        for r in range(len(plan.replicas)):
            out[(r, cursor[r])] += seconds
    return out


def estimate_plan(
    plan: Plan,
    cluster: Cluster,
    model: ModelSpec,
    training: TrainingSpec,
    profiles: ProfileSet | None = None,
    schedule: str = "1f1b",
) -> Estimate:
    """Cost ``plan`` on ``cluster`` for this model and training setting."""
    return estimate_with_tables(
        plan, cluster, CostTables.for_cluster(model, training, cluster, profiles), schedule
    )


def estimate_with_tables(
    plan: Plan, cluster: Cluster, tables: CostTables, schedule: str = "1f1b"
) -> Estimate:
    """Cost ``plan`` on ``cluster``: step time, throughput, memory per device."""
    allreduce = _allreduce_per_stage(tables, cluster, plan)
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
            table = tables.table(stage.device_type, plan.microbatch_size, stage.tp)
            start, end = stage.layers
            if any(start <= i < end for i in table.estimated_layers):
                estimated.add(stage.device_type)
            in_flight = memory.microbatches_in_flight(s, len(rep.stages), num_micro, schedule)
            device = tables.device_types[stage.device_type]
            devices.append(
                DeviceEstimate(
                    replica=r,
                    stage=s,
                    device_type=stage.device_type,
                    node=stage.node,
                    tp=stage.tp,
                    layers=stage.layers,
                    microbatch_s=per_stage[s],
                    compute_s=num_micro * per_stage[s],
                    allreduce_s=allreduce[(r, s)],
                    update_s=table.update_s(start, end),
                    memory_bytes=table.memory_bytes(start, end, in_flight),
                    memory_capacity_bytes=device.usable_memory_bytes,
                )
            )
    # Sharded stages: state split across the shard group, its gathers (costmodel.sharding).
    devices = sharding.apply(
        plan, devices, tables.model, tables.training, lambda h: _holder_bandwidth(cluster, h)
    )
    tail = max(d.allreduce_s + d.update_s for d in devices)
    worst = max(devices, key=lambda d: d.allreduce_s + d.update_s)
    step_s = pipeline_s + tail
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
