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
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from operators.hetero.devices import GPU_PRODUCT_LABEL, GPU_RESOURCE, device_type_for_product
from orchestrator.spec.labels import ACCELERATOR_LABEL, DEVICE_TYPE_LABEL

CORDON_TAINT = "node.kubernetes.io/unschedulable"

# Taints that announce a node is going away, and the notice before it goes (seconds), each from
# the documentation of what sets it:
# - aws-node-termination-handler (NTH): spot-itn on an EC2 Spot interruption notice (2 minutes
#   before the instance stops); rebalance-recommendation on an EC2 rebalance signal, which comes
#   before the interruption notice, so 2 minutes is the shortest it can leave.
# - GKE's graceful node shutdown: cloud.google.com/impending-node-termination on a Spot /
#   preemptible VM being preempted (Compute Engine gives 30 s).
# - Karpenter v1: karpenter.sh/disrupted when it starts draining a node it is removing; pods get
#   their termination grace period (30 s by default).
# - Cluster autoscaler: ToBeDeletedByClusterAutoscaler on a node it is scaling down (its value is
#   the time it was added, in unix seconds), drained at once with the pods' grace period.
# Azure has no eviction taint (AKS Spot nodes carry kubernetes.azure.com/scalesetpriority=spot
# from the start, which announces nothing), so none is listed.
SPOT_TAINT_NOTICE_S: dict[str, float] = {
    "aws-node-termination-handler/spot-itn": 120.0,
    "aws-node-termination-handler/rebalance-recommendation": 120.0,
    "cloud.google.com/impending-node-termination": 30.0,
    "karpenter.sh/disrupted": 30.0,
    "ToBeDeletedByClusterAutoscaler": 30.0,
}

# Set by an administrator on a node that is shut down for good (non-graceful node shutdown): its
# pods are gone, so it counts as lost at once.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"

# A node NotReady (or Unknown) this long counts as lost; shorter outages (a kubelet restart, a
# brief network partition) do not move work. Kubernetes itself already waits 40 s of missed
# heartbeats before it marks a node Unknown.
NOT_READY_GRACE_S = 60.0


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
    # When the Ready condition stopped being True (None while ready), and whether that has lasted
    # the grace period (:data:`NOT_READY_GRACE_S`) when this state was read.
    not_ready_since_unix_s: float | None = None
    lost: bool = False
    out_of_service: bool = False

    @property
    def usable(self) -> bool:
        """Not lost, schedulable and not about to be reclaimed (NotReady within grace counts)."""
        return (not self.lost and not self.out_of_service and not self.unschedulable
                and self.spot_taint is None)

    def at(self, now_unix_s: float, grace_s: float = NOT_READY_GRACE_S) -> NodeState:
        """This state re-read at ``now_unix_s``: a NotReady node may have outlasted its grace."""
        return replace(self, lost=_lost(self.ready, self.not_ready_since_unix_s, now_unix_s,
                                        grace_s))


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


def _lost(ready: bool, since: float | None, now: float, grace_s: float) -> bool:
    return not ready and since is not None and now - since >= grace_s


def node_state(
    node: dict[str, Any],
    product_overrides: dict[str, str] | None = None,
    *,
    now_unix_s: float | None = None,
    not_ready_grace_s: float = NOT_READY_GRACE_S,
) -> NodeState:
    """Read the fields that matter from a Node object (a dict as the API returns it).

    ``now_unix_s`` decides whether a NotReady node has outlasted ``not_ready_grace_s`` (since the
    Ready condition's lastTransitionTime, else since now); without it NotReady is lost at once.
    """
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = meta.get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    gpus = _quantity_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0))
    ready_condition = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    ready = ready_condition.get("status") == "True"
    since = None
    if not ready:
        since = _parse_time_s(ready_condition.get("lastTransitionTime"))
        if since is None:
            since = now_unix_s
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
        spot_taint_since_unix_s=_taint_time_s(spot) if spot else None,
        labels=dict(labels),
        not_ready_since_unix_s=since,
        lost=(not ready) if now_unix_s is None
        else _lost(ready, since, now_unix_s, not_ready_grace_s),
        out_of_service=any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints),
    )


def _taint_time_s(taint: dict[str, Any]) -> float | None:
    """When a taint was added: its timeAdded, else (cluster autoscaler) its unix-seconds value."""
    added = _parse_time_s(taint.get("timeAdded"))
    if added is not None:
        return added
    try:
        return float(taint.get("value") or "")
    except ValueError:
        return None


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
    if current.out_of_service and (was is None or not was.out_of_service):
        return _event(current, NodeEventKind.REMOVED, f"taint {OUT_OF_SERVICE_TAINT}")
    if current.spot_taint and (was is None or was.spot_taint != current.spot_taint):
        since = current.spot_taint_since_unix_s or now_unix_s
        deadline = since + SPOT_TAINT_NOTICE_S[current.spot_taint]
        reason = f"taint {current.spot_taint}"
        return _event(current, NodeEventKind.SPOT_TERMINATION, reason, deadline)
    if current.lost and (was is None or not was.lost):
        return _event(current, NodeEventKind.NOT_READY, "Ready condition not True for the grace "
                      "period")
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
