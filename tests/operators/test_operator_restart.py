"""Operator restart and node identity, end to end against the Kubernetes API emulator.

The run's controller here is the real one's HTTP side: the telemetry server (with the bearer
token) feeding the controller's Ray cluster probe. Its Ray node rows are what KubeRay and Ray
would produce for the pods below: each worker pod is bound to a Node, and its Ray node labels
are read from the pod template the operator rendered, with Kubernetes' expansion of
$(K8S_NODE_NAME) applied (the Ray side of that label is tested with a real Ray node in
test_node_identity.py). Pods are created by the test, as KubeRay would (the emulator runs no
controllers).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import kubernetes
import pytest
from k8s_objects import gpu_node, job, job_spec
from kopf.testing import KopfRunner
from prometheus_client import CollectorRegistry
from test_operator_e2e import GROUP, OPERATOR_ARGS, PLURAL, VERSION, replicas_of, wait_for

from orchestrator.runtime.elastic.probe import RayClusterProbe
from orchestrator.telemetry import TelemetryServer
from orchestrator.telemetry.auth import TOKEN_FILE_ENV, TokenCheck

A100 = "NVIDIA-A100-SXM4-80GB"
NODES = 60
TOKEN = "emulator-test-token"


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in an env value (variables defined before it)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), value)


def ray_labels(cluster: dict, group: str, node_name: str) -> dict[str, str]:
    """The Ray node labels of a worker of ``group`` on ``node_name``: the group's labels (KubeRay
    passes them to `ray start --labels`) and RAY_OVERRIDE_LABELS after env expansion."""
    spec = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == group)
    env: dict[str, str] = {}
    for var in spec["template"]["spec"]["containers"][0]["env"]:
        field = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = node_name if field == "spec.nodeName" else expand(var["value"], env)
    return {**spec["labels"], **json.loads(env["RAY_OVERRIDE_LABELS"])}


class RealController:
    """The controller's telemetry server and Ray probe, over Ray rows the test controls."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.probe = RayClusterProbe(rows=lambda: list(self.rows), draining=lambda: {})
        self.server = TelemetryServer(
            CollectorRegistry(), port=0, node_events_auth=TokenCheck(required=True, token=TOKEN),
            node_event_handler=lambda e: self.probe.post_node_event(
                e.node, e.event, e.deadline_unix_s))

    def node_ids(self) -> set[str]:
        return {n.node_id for n in self.probe.snapshot().nodes}


def pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"orchestrator.io/job": "big", "orchestrator.io/pool": "a100"}},
            "spec": {"nodeName": node, "containers": [{"name": "ray-worker", "image": "x"}]}}


@pytest.mark.slow
def test_restart_with_60_ready_nodes_keeps_the_pool_and_events_name_the_ray_node(
        kubeconfig, api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file))
    controller = RealController()
    controller.server.start()
    try:
        for i in range(NODES):
            core.create_node(gpu_node(f"a100-{i}", A100, 4))
        spec = job_spec(controller.server.url)
        spec["pools"] = [{"name": "a100", "deviceType": "A100-80", "gpusPerPod": 4,
                          "minReplicas": 0, "maxReplicas": NODES}]
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                               job("big", spec))

        # First run: the RayCluster is created at full size, from a complete list of Nodes.
        with KopfRunner(OPERATOR_ARGS) as runner:
            wait_for(lambda: replicas_of(custom, "big") == {"a100": NODES}, "60 replicas")
        assert runner.exit_code == 0, runner.output

        # KubeRay's part: one worker pod per Node, each a Ray node labelled with its Node.
        cluster = custom.get_namespaced_custom_object("ray.io", "v1", "default",
                                                      "rayclusters", "big")
        for i in range(NODES):
            core.create_namespaced_pod("default", pod(f"big-a100-worker-{i}", f"a100-{i}"))
            controller.rows.append({
                "NodeID": f"{i:02d}" + "ab" * 27, "Alive": True,
                "NodeManagerAddress": f"10.0.0.{i}", "NodeManagerHostname": f"pod-{i}",
                "Resources": {"GPU": 4.0, "CPU": 32.0},
                "Labels": ray_labels(cluster, "a100", f"a100-{i}")})
        assert len(controller.node_ids()) == NODES

        # Restart: the watch replays Nodes one by one, yet replicas never drop.
        seen: list[int] = []
        stop = threading.Event()

        def watch_replicas() -> None:
            while not stop.is_set():
                seen.append(replicas_of(custom, "big")["a100"])
                time.sleep(0.05)

        def message() -> str | None:
            got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "big")
            return (got.get("status") or {}).get("message")

        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "default", PLURAL, "big", {"status": {"message": "restarting"}})
        watcher = threading.Thread(target=watch_replicas, daemon=True)
        with KopfRunner(OPERATOR_ARGS) as runner:
            watcher.start()
            # The resume handler has run (it writes this message) ...
            wait_for(lambda: message() == "RayCluster and RayJob applied", "the resume handler")
            time.sleep(3.0)  # ... and the replayed watch events had time to resize

            # A Node goes away: the controller hears of it (with the token) and drops exactly
            # the Ray node on that Node; the pool shrinks by naming that Node's pod.
            gone = "a100-17"
            (ray_id,) = [r["NodeID"] for r in controller.rows
                         if r["Labels"]["orchestrator.io/node-name"] == gone]
            before_loss = len(seen)
            core.delete_node(gone)
            wait_for(lambda: ray_id not in controller.node_ids(), "the Ray node on a100-17 lost")
            assert len(controller.node_ids()) == NODES - 1
            cluster = wait_for(lambda: (lambda c: c if c["spec"]["workerGroupSpecs"][0][
                "replicas"] == NODES - 1 else None)(custom.get_namespaced_custom_object(
                    "ray.io", "v1", "default", "rayclusters", "big")), "59 replicas")
            group = cluster["spec"]["workerGroupSpecs"][0]
            assert group["scaleStrategy"]["workersToDelete"] == ["big-a100-worker-17"]
            stop.set()
            watcher.join(5)
        assert runner.exit_code == 0, runner.output
        assert before_loss >= 3 and min(seen[:before_loss]) == NODES  # no shrink on restart
        assert min(seen) == NODES - 1  # and only the lost Node's pod afterwards
    finally:
        controller.server.stop()
