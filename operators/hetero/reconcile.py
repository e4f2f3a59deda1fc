"""Pure reconciling: pool replicas from Node capacity, and the job's status from controller metrics.

Pool replicas follow capacity within [minReplicas, maxReplicas]: a pool gets as many pods as its
usable nodes hold (``gpus // gpusPerPod`` per node), never fewer than ``minReplicas`` (pending pods
are what asks a cluster autoscaler for nodes) and never more than ``maxReplicas``. A node that is
NotReady, cordoned or tainted for spot termination no longer counts, so its pod is not replaced on
the same doomed capacity.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from operators.hetero.nodes import NodeState
from operators.hetero.spec import JobSpec, PoolSpec


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
