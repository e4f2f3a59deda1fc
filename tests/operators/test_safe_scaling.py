"""Scaling that never removes a healthy pod, the NotReady grace period, and the node signals."""

from __future__ import annotations

from k8s_objects import gpu_node, job_spec

from operators.hetero.nodes import (
    NOT_READY_GRACE_S,
    SPOT_TAINT_NOTICE_S,
    NodeEventKind,
    node_event,
    node_state,
)
from operators.hetero.reconcile import PodInfo, desired_replicas, pod_info, scale_patch
from operators.hetero.spec import parse_job_spec

A100 = "NVIDIA-A100-SXM4-80GB"
NOW_S = 1_800_000_000.0


def _iso(unix_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def not_ready_node(name: str, since_s: float) -> dict:
    node = gpu_node(name, A100, 4, ready="Unknown")
    node["status"]["conditions"][0]["lastTransitionTime"] = _iso(since_s)
    return node


# -- NotReady grace --------------------------------------------------------------------------


def test_not_ready_within_grace_is_neither_lost_nor_reported() -> None:
    ready = node_state(gpu_node("n1", A100, 4), now_unix_s=NOW_S)
    brief = node_state(not_ready_node("n1", NOW_S - 10), now_unix_s=NOW_S)
    assert not brief.lost and brief.usable  # still counts as capacity: nothing moves yet
    assert node_event(brief, ready, now_unix_s=NOW_S) is None


def test_not_ready_past_grace_is_lost_once() -> None:
    ready = node_state(gpu_node("n1", A100, 4), now_unix_s=NOW_S)
    brief = node_state(not_ready_node("n1", NOW_S - 10), now_unix_s=NOW_S)
    later = brief.at(NOW_S - 10 + NOT_READY_GRACE_S)
    assert later.lost and not later.usable
    event = node_event(later, brief, now_unix_s=NOW_S + NOT_READY_GRACE_S)
    assert event is not None and event.event is NodeEventKind.NOT_READY
    assert event.to_json()["event"] == "node_lost"
    assert node_event(later.at(NOW_S + 600), later, now_unix_s=NOW_S + 600) is None
    assert node_event(ready, later, now_unix_s=NOW_S + 700).event is NodeEventKind.ADDED


# -- signals ---------------------------------------------------------------------------------


def test_out_of_service_taint_is_lost_at_once() -> None:
    taint = [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
              "effect": "NoExecute"}]
    before = node_state(gpu_node("n1", A100, 4), now_unix_s=NOW_S)
    after = node_state(gpu_node("n1", A100, 4, taints=taint), now_unix_s=NOW_S)
    assert not after.usable
    event = node_event(after, before, now_unix_s=NOW_S)
    assert event.event is NodeEventKind.REMOVED and event.to_json()["event"] == "node_lost"


def test_cluster_autoscaler_deletion_taint_is_a_notice_from_its_value() -> None:
    taint = [{"key": "ToBeDeletedByClusterAutoscaler", "value": str(int(NOW_S - 5)),
              "effect": "NoSchedule"}]
    before = node_state(gpu_node("n1", A100, 4), now_unix_s=NOW_S)
    after = node_state(gpu_node("n1", A100, 4, taints=taint), now_unix_s=NOW_S)
    event = node_event(after, before, now_unix_s=NOW_S)
    assert event.to_json()["event"] == "preemption_notice"
    assert event.deadline_unix_s == NOW_S - 5 + 30.0


def test_only_documented_taint_keys_are_signals() -> None:
    assert set(SPOT_TAINT_NOTICE_S) == {
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/rebalance-recommendation",
        "cloud.google.com/impending-node-termination",
        "karpenter.sh/disrupted",
        "ToBeDeletedByClusterAutoscaler",
    }
    # AKS Spot nodes carry this from the start: it announces nothing.
    spot = [{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot",
             "effect": "NoSchedule"}]
    assert node_state(gpu_node("n1", A100, 4, taints=spot), now_unix_s=NOW_S).usable


# -- scale-down names the pods on departing nodes ----------------------------------------------


def cluster(replicas: int) -> dict:
    return {"spec": {"workerGroupSpecs": [{"groupName": "a100", "replicas": replicas}]}}


def states(*nodes: dict) -> dict:
    found = [node_state(n, now_unix_s=NOW_S) for n in nodes]
    return {s.name: s for s in found}


def test_shrink_names_the_pod_on_the_reclaimed_node() -> None:
    taint = [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]
    nodes = states(gpu_node("n1", A100, 4), gpu_node("n2", A100, 4, taints=taint),
                   gpu_node("n3", A100, 4))
    pods = [PodInfo("w-1", "a100", "n1", False), PodInfo("w-2", "a100", "n2", False),
            PodInfo("w-3", "a100", "n3", False)]
    spec = parse_job_spec(job_spec())
    wanted = desired_replicas(spec, nodes.values())
    assert wanted["a100"] == 2
    patch = scale_patch(cluster(3), wanted, pods, nodes)
    (group,) = patch["spec"]["workerGroupSpecs"]
    assert group["replicas"] == 2
    assert group["scaleStrategy"] == {"workersToDelete": ["w-2"]}


def test_no_shrink_when_every_pod_is_on_a_healthy_node() -> None:
    """Capacity says fewer (e.g. a node list still filling), but no pod is on a departing node."""
    nodes = states(gpu_node("n1", A100, 4))
    pods = [PodInfo(f"w-{i}", "a100", f"n{i}", False) for i in (1, 2, 3)]
    # n2 and n3 are not in the view at all: treated as gone, so they may be named ...
    patch = scale_patch(cluster(3), {"a100": 1}, pods, nodes)
    assert patch["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == [
        "w-2", "w-3"]
    # ... but with all three nodes healthy, nothing is removed whatever the target.
    nodes = states(*(gpu_node(f"n{i}", A100, 4) for i in (1, 2, 3)))
    assert scale_patch(cluster(3), {"a100": 1}, pods, nodes) is None


def test_pending_and_unborn_pods_go_first_without_touching_running_ones() -> None:
    nodes = states(gpu_node("n1", A100, 4))
    pods = [PodInfo("w-1", "a100", "n1", False), PodInfo("w-9", "a100", None, False)]
    # 4 replicas, 2 pods exist: 2 unborn go by count, then the pending one by name.
    patch = scale_patch(cluster(4), {"a100": 1}, pods, nodes)
    (group,) = patch["spec"]["workerGroupSpecs"]
    assert group["replicas"] == 1
    assert group["scaleStrategy"] == {"workersToDelete": ["w-9"]}


def test_growing_sets_replicas_only() -> None:
    patch = scale_patch(cluster(1), {"a100": 3}, [], {})
    assert patch["spec"]["workerGroupSpecs"][0] == {"groupName": "a100", "replicas": 3}
    assert scale_patch(cluster(3), {"a100": 3}, [], {}) is None


def test_pod_info_reads_the_pool_node_and_deletion() -> None:
    pod = {"metadata": {"name": "w-1", "labels": {"orchestrator.io/pool": "a100"},
                        "deletionTimestamp": "2030-01-01T00:00:00Z"},
           "spec": {"nodeName": "n1"}}
    assert pod_info(pod) == PodInfo("w-1", "a100", "n1", True)
    assert pod_info({"metadata": {"name": "w-2"}, "spec": {}}).node is None


def test_an_ended_job_is_recognised_from_its_status() -> None:
    from operators.hetero.handlers import FINAL_PHASE, job_ended

    assert FINAL_PHASE == {"SUCCEEDED": "Finished", "FAILED": "Failed", "STOPPED": "Failed"}
    assert job_ended({"phase": "Finished", "jobStatus": "SUCCEEDED"})
    assert not job_ended({"phase": "Running"})
    assert not job_ended({"jobStatus": "RUNNING"})
