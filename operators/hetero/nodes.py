"""Pure: a Kubernetes Node (and what it looked like before) -> zero or one node event.

The operator sees a Node change through the API watch, seconds before Ray's heartbeat (by default
3 s x 5 misses) would notice a lost node, and a spot-termination taint up to the provider's notice
period before the machine goes. Events go to the run's controller as JSON (see :mod:`notify`)::

    {"node": "gke-a100-1", "event": "preemption_notice", "device_type": "A100-80",
     "deadline_unix_s": 1767225600.0, "reason": "spot_termination: taint ..."}

The operator's own kinds (added, not_ready, cordoned, spot_termination, removed) map onto the
controller's vocabulary (``orchestrator.telemetry.node_events``): a node that joined, a node lost,
or a preemption notice with the time the node goes away.

Only GPU nodes (labelled ``nvidia.com/gpu.product`` or offering ``nvidia.com/gpu``) produce events.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from operators.hetero.devices import GPU_PRODUCT_LABEL, GPU_RESOURCE, device_type_for_product
from orchestrator.spec.labels import ACCELERATOR_LABEL, DEVICE_TYPE_LABEL

CORDON_TAINT = "node.kubernetes.io/unschedulable"

# Spot / preemption taints and the notice each provider gives before the machine goes (seconds):
# AWS interruption notice 2 min (EC2 docs), GCE preemption notice 30 s (Compute Engine docs),
# Azure Spot eviction notice 30 s (Scheduled Events docs).
SPOT_TAINT_NOTICE_S: dict[str, float] = {
    "aws-node-termination-handler/spot-itn": 120.0,
    "aws-node-termination-handler/rebalance-recommendation": 120.0,
    "cloud.google.com/impending-node-termination": 30.0,
    "kubernetes.azure.com/scalesetpriority-eviction": 30.0,
    "karpenter.sh/disrupted": 30.0,
}


class NodeEventKind(StrEnum):
    """What happened to a node, in the operator's words (see :data:`WIRE_EVENT` for the wire)."""

    ADDED = "added"
    NOT_READY = "not_ready"
    CORDONED = "cordoned"
    SPOT_TERMINATION = "spot_termination"
    REMOVED = "removed"


# The controller's event names (orchestrator.telemetry.node_events.NODE_EVENT_KINDS).
WIRE_EVENT: dict[NodeEventKind, str] = {
    NodeEventKind.ADDED: "node_joined",
    NodeEventKind.NOT_READY: "node_lost",
    NodeEventKind.REMOVED: "node_lost",
    NodeEventKind.CORDONED: "preemption_notice",
    NodeEventKind.SPOT_TERMINATION: "preemption_notice",
}

# A cordon usually precedes a drain; the controller gets this long to move state off the node
# (kubectl drain's default grace for pods is 30 s; five minutes leaves room for a checkpoint).
CORDON_NOTICE_S = 300.0


@dataclass(frozen=True)
class NodeState:
    """What the operator remembers of a Node between two watch events."""

    name: str
    device_type: str | None
    gpu_product: str | None
    gpus: int
    is_gpu_node: bool
    ready: bool
    unschedulable: bool
    spot_taint: str | None
    spot_taint_since_unix_s: float | None
    labels: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def usable(self) -> bool:
        """Ready, schedulable and not about to be reclaimed."""
        return self.ready and not self.unschedulable and self.spot_taint is None


@dataclass(frozen=True)
class NodeEvent:
    """One event for the run's controller."""

    node: str
    event: NodeEventKind
    device_type: str | None
    deadline_unix_s: float | None
    reason: str
    ray_node_labels: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The body the controller's ``POST /v1/node-events`` accepts."""
        return {
            "node": self.node,
            "event": WIRE_EVENT[self.event],
            "device_type": self.device_type,
            "deadline_unix_s": self.deadline_unix_s,
            "reason": f"{self.event.value}: {self.reason}",
        }


def _parse_time_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _quantity_int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_state(node: dict[str, Any], product_overrides: dict[str, str] | None = None) -> NodeState:
    """Read the fields that matter from a Node object (a dict as the API returns it)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    gpus = _quantity_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0))
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    taints = spec.get("taints") or []
    spot = next((t for t in taints if t.get("key") in SPOT_TAINT_NOTICE_S), None)
    cordoned = bool(spec.get("unschedulable")) or any(t.get("key") == CORDON_TAINT for t in taints)
    return NodeState(
        name=meta.get("name", ""),
        device_type=labels.get(DEVICE_TYPE_LABEL)
        or device_type_for_product(product, product_overrides),
        gpu_product=product,
        gpus=gpus,
        is_gpu_node=product is not None or gpus > 0,
        ready=ready,
        unschedulable=cordoned,
        spot_taint=spot.get("key") if spot else None,
        spot_taint_since_unix_s=_parse_time_s(spot.get("timeAdded")) if spot else None,
        labels=dict(labels),
    )


def _event(state: NodeState, kind: NodeEventKind, reason: str, deadline: float | None = None):
    labels = None
    if state.device_type is not None:
        labels = {DEVICE_TYPE_LABEL: state.device_type, ACCELERATOR_LABEL: state.device_type}
    return NodeEvent(state.name, kind, state.device_type, deadline, reason, labels)


def node_event(
    current: NodeState | None, previous: NodeState | None, *, now_unix_s: float
) -> NodeEvent | None:
    """The event a change from ``previous`` to ``current`` means (``current`` None: deleted).

    At most one event per change, the most urgent first: removed, spot termination, not ready,
    cordoned, then added (a new usable node, or one usable again).
    """
    if current is None:
        if previous is None or not previous.is_gpu_node:
            return None
        return _event(previous, NodeEventKind.REMOVED, "Node deleted from the cluster")
    if not current.is_gpu_node:
        return None
    was = previous
    if current.spot_taint and (was is None or was.spot_taint != current.spot_taint):
        since = current.spot_taint_since_unix_s or now_unix_s
        deadline = since + SPOT_TAINT_NOTICE_S[current.spot_taint]
        reason = f"taint {current.spot_taint}"
        return _event(current, NodeEventKind.SPOT_TERMINATION, reason, deadline)
    if not current.ready and (was is None or was.ready):
        return _event(current, NodeEventKind.NOT_READY, "Ready condition is not True")
    if current.unschedulable and (was is None or not was.unschedulable):
        return _event(
            current,
            NodeEventKind.CORDONED,
            "node cordoned (unschedulable)",
            now_unix_s + CORDON_NOTICE_S,
        )
    if current.usable and (was is None or not was.usable):
        reason = "new GPU node" if was is None else "node usable again"
        return _event(current, NodeEventKind.ADDED, reason)
    return None
