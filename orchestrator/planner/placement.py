"""Turning a selection into a concrete Plan: batch shares and nodes for every stage.

Stages are placed first-fit over the nodes of their device type, in cluster order, preferring the
node of the previous stage so a pipeline that fits in one node stays inside it.
"""

from __future__ import annotations

import math

from orchestrator.planner.batching import Group, assign_microbatches
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Plan, ReplicaSpec, Sharding, StageSpec


class _NodePool:
    """Free devices per node, with a forward-only cursor per (device type, tp)."""

    def __init__(self, cluster: Cluster) -> None:
        self.free = {n.name: n.num_devices for n in cluster.nodes}
        self.by_type = {t: [n.name for n in cluster.nodes_of_type(t)] for t in cluster.device_types}
        self._cursor: dict[tuple[str, int], int] = {}

    def take(self, device_type: str, tp: int, prefer: str | None) -> str | None:
        if prefer is not None and prefer in self.by_type[device_type] and self.free[prefer] >= tp:
            self.free[prefer] -= tp
            return prefer
        names = self.by_type[device_type]
        i = self._cursor.get((device_type, tp), 0)
        while i < len(names) and self.free[names[i]] < tp:
            i += 1
        self._cursor[(device_type, tp)] = i
        if i == len(names):
            return None
        self.free[names[i]] -= tp
        return names[i]


def _place_replica(pool: _NodePool, group: Group) -> list[StageSpec] | None:
    t = group.template
    b = t.split.boundaries
    stages: list[StageSpec] = []
    previous: str | None = None
    for i, (device_type, tp) in enumerate(t.stage_types):
        node = pool.take(device_type, tp, previous)
        if node is None:
            return None
        recompute = bool(t.recompute) and t.recompute[i]
        stages.append(
            StageSpec(
                layers=(b[i], b[i + 1]),
                device_type=device_type,
                tp=tp,
                node=node,
                recompute=recompute,
                sharding=t.sharding[i] if t.sharding else Sharding.NONE,
            )
        )
        previous = node
    return stages


def place(groups: list[Group], cluster: Cluster, global_batch_size: int) -> Plan:
    """Build the Plan: microbatches water-filled, batch sizes exact, nodes assigned."""
    groups = [g for g in groups if g.count > 0]
    while True:
        pool = _NodePool(cluster)
        placed: list[list[list[StageSpec]]] = []
        failed = None
        for gi, g in enumerate(groups):
            rows = []
            for _ in range(g.count):
                stages = _place_replica(pool, g)
                if stages is None:
                    failed = gi
                    break
                rows.append(stages)
            placed.append(rows)
            if failed is not None:
                break
        if failed is None:
            break
        # Fragmented nodes: run one replica fewer of the group that did not fit, then retry.
        groups[failed] = Group(groups[failed].template, groups[failed].count - 1)
        groups = [g for g in groups if g.count > 0]
    mbs = groups[0].template.microbatch_size
    counts = assign_microbatches(groups, math.ceil(global_batch_size / mbs))
    excess = sum(map(sum, counts)) * mbs - global_batch_size
    replicas: list[ReplicaSpec] = []
    flat_counts = [m for row in counts for m in row]
    biggest = max(range(len(flat_counts)), key=lambda i: (flat_counts[i], -i))
    flat = 0
    for gi, rows in enumerate(placed):
        for ri, stages in enumerate(rows):
            batch = counts[gi][ri] * mbs - (excess if flat == biggest else 0)
            replicas.append(ReplicaSpec(batch_size=batch, stages=tuple(stages)))
            flat += 1
    return Plan(global_batch_size=global_batch_size, microbatch_size=mbs, replicas=tuple(replicas))
