"""Pure reconciling: pool replicas from Node capacity, and the job's status from controller metrics.

Pool replicas follow capacity within [minReplicas, maxReplicas]: a pool gets as many pods as its
usable nodes hold (``gpus // gpusPerPod`` per node), never fewer than ``minReplicas`` (pending pods
are what asks a cluster autoscaler for nodes) and never more than ``maxReplicas``. A node that is
NotReady, cordoned or tainted for spot termination no longer counts, so its pod is not replaced on
the same doomed capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from operators.hetero.nodes import NodeState
from operators.hetero.spec import JobSpec, PoolSpec
from orchestrator.spec.labels import POOL_LABEL


def pool_matches(pool: PoolSpec, node: NodeState) -> bool:
    """Whether ``pool``'s pods can land on ``node`` (its node selector matches the labels)."""
    if node.gpu_product != pool.gpu_product:
        return False
    return all(node.labels.get(key) == value for key, value in pool.nodeSelector.items())


def pool_capacity_pods(pool: PoolSpec, nodes: Iterable[NodeState]) -> int:
    """Pods of ``pool`` that the usable matching nodes hold."""
    return sum(n.gpus // pool.gpusPerPod for n in nodes if n.usable and pool_matches(pool, n))


def desired_replicas(spec: JobSpec, nodes: Iterable[NodeState]) -> dict[str, int]:
    """Replicas per pool name: capacity clamped to [minReplicas, maxReplicas]."""
    node_list = list(nodes)
    return {
        pool.name: min(pool.maxReplicas, max(pool.minReplicas, pool_capacity_pods(pool, node_list)))
        for pool in spec.pools
    }


def replica_patch(raycluster: dict[str, Any], desired: dict[str, int]) -> dict[str, Any] | None:
    """A merge patch for the RayCluster's worker groups, or None where nothing changes.

    Worker groups are a list, which a merge patch replaces whole: the patch carries every group,
    with only ``replicas`` changed.
    """
    groups = raycluster.get("spec", {}).get("workerGroupSpecs") or []
    changed = False
    new_groups = []
    for group in groups:
        want = desired.get(group.get("groupName"))
        if want is not None and group.get("replicas") != want:
            group = {**group, "replicas": want}
            changed = True
        new_groups.append(group)
    return {"spec": {"workerGroupSpecs": new_groups}} if changed else None


@dataclass(frozen=True)
class PodInfo:
    """A Ray worker pod as scaling sees it."""

    name: str
    pool: str | None
    node: str | None  # spec.nodeName; None while unscheduled
    deleting: bool


def pod_info(pod: dict[str, Any]) -> PodInfo:
    """The fields scaling needs from a Pod (a dict as the API returns it)."""
    meta = pod.get("metadata") or {}
    return PodInfo(
        name=meta.get("name", ""),
        pool=(meta.get("labels") or {}).get(POOL_LABEL),
        node=(pod.get("spec") or {}).get("nodeName") or None,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _victims(pool_pods: list[PodInfo], nodes: Mapping[str, NodeState]) -> list[PodInfo]:
    """Pods that may go, in order: unscheduled ones, then those on nodes that are going away."""
    pending = sorted((p for p in pool_pods if p.node is None), key=lambda p: p.name)
    doomed = sorted(
        (p for p in pool_pods
         if p.node is not None and (p.node not in nodes or not nodes[p.node].usable)),
        key=lambda p: p.name,
    )
    return pending + doomed


def scale_patch(
    raycluster: dict[str, Any],
    desired: dict[str, int],
    pods: Iterable[PodInfo],
    nodes: Mapping[str, NodeState],
) -> dict[str, Any] | None:
    """A merge patch for the worker groups that never lowers a count blindly, or None.

    Growing sets ``replicas``. Shrinking names the pods to remove in
    ``scaleStrategy.workersToDelete`` (KubeRay deletes those, instead of pods of its own
    choosing, which may be healthy): unscheduled pods first, then pods on nodes that are lost,
    cordoned or being reclaimed. Replicas that have no pod yet may go without a name. A pool
    never shrinks below what its named and unborn pods allow, so a healthy pod is never the one
    removed.
    """
    pod_list = [p for p in pods if not p.deleting]
    groups = raycluster.get("spec", {}).get("workerGroupSpecs") or []
    changed = False
    new_groups = []
    for group in groups:
        name = group.get("groupName")
        live = int(group.get("replicas") or 0)
        want = desired.get(name)
        if want is None or want == live:
            new_groups.append(group)
            continue
        if want > live:
            new_groups.append({**group, "replicas": want})
            changed = True
            continue
        pool_pods = [p for p in pod_list if p.pool == name]
        unborn = max(0, live - len(pool_pods))
        remove = live - want
        victims = _victims(pool_pods, nodes)[: max(0, remove - unborn)]
        shrink = min(remove, unborn + len(victims))
        if shrink == 0:
            new_groups.append(group)
            continue
        new_group = {**group, "replicas": live - shrink}
        if victims:
            new_group["scaleStrategy"] = {"workersToDelete": [v.name for v in victims]}
        new_groups.append(new_group)
        changed = True
    return {"spec": {"workerGroupSpecs": new_groups}} if changed else None


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {sample name: [(labels, value), ...]}."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def _single(samples: dict, name: str) -> float | None:
    rows = samples.get(name) or []
    return rows[0][1] if rows else None


def status_from_metrics(
    metrics_text: str, previous: dict[str, Any], *, now_iso: str
) -> dict[str, Any]:
    """The job's status fields from the controller's /metrics (names from orchestrator.telemetry).

    ``lastRecovery`` changes when a recovery counter grew since the ``previous`` status.
    """
    samples = parse_metrics(metrics_text)
    state = next(
        (labels["state"] for labels, value in samples.get("orchestrator_controller_state", [])
         if value == 1.0), None,
    )
    devices: dict[str, int] = {}
    for labels, value in samples.get("orchestrator_devices", []):
        if labels.get("state") == "alive" and value > 0:
            devices[labels["device_type"]] = int(value)
    recoveries = {
        labels.get("reason", ""): int(value)
        for labels, value in samples.get("orchestrator_recoveries_total", [])
    }
    status: dict[str, Any] = {
        "phase": state.capitalize() if state else previous.get("phase", "Pending"),
        "devicesByType": dict(sorted(devices.items())),
        "throughputSamplesPerS": _single(samples, "orchestrator_throughput_samples_per_second"),
        "plan": {
            "predictedThroughputSamplesPerS": _single(
                samples, "orchestrator_predicted_throughput_samples_per_second"),
            "boundRatio": _single(samples, "orchestrator_plan_bound_ratio"),
            "changes": int(sum(v for _, v in samples.get("orchestrator_plan_changes_total", []))),
        },
        "stepsTotal": int(_single(samples, "orchestrator_steps_total") or 0),
        "recoveriesTotal": sum(recoveries.values()),
        "emulated": bool(_single(samples, "orchestrator_emulated")),
    }
    before = (previous.get("lastRecovery") or {}).get("counts", {})
    grown = sorted(reason for reason, count in recoveries.items() if count > before.get(reason, 0))
    if grown:
        status["lastRecovery"] = {"time": now_iso, "reason": ",".join(grown), "counts": recoveries}
    elif previous.get("lastRecovery"):
        status["lastRecovery"] = previous["lastRecovery"]
    return status
