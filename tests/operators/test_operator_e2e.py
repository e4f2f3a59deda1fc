"""The operator end to end: kopf and the kubernetes client against a Kubernetes API emulator.

No API server runs here, so kmock's KubernetesEmulator stands in for it (see conftest); every
create, patch, watch and delete below is a real HTTP call. The run's controller is a small local
HTTP server that records node events and serves metrics text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
import yaml
from k8s_objects import gpu_node, job, job_spec
from kopf.testing import KopfRunner

GROUP, VERSION, PLURAL = "orchestrator.io", "v1alpha1", "heterotrainingjobs"
OPERATOR_ARGS = ["run", "--standalone", "--namespace=default", "-m", "operators.hetero.handlers"]
A100 = "NVIDIA-A100-SXM4-80GB"
METRICS = """\
# TYPE orchestrator_controller_state gauge
orchestrator_controller_state{run="gpt",state="running"} 1.0
orchestrator_controller_state{run="gpt",state="recovering"} 0.0
# TYPE orchestrator_devices gauge
orchestrator_devices{run="gpt",device_type="A100-80",state="alive"} 8.0
orchestrator_devices{run="gpt",device_type="T4",state="alive"} 2.0
# TYPE orchestrator_throughput_samples_per_second gauge
orchestrator_throughput_samples_per_second{run="gpt"} 123.5
# TYPE orchestrator_recoveries counter
orchestrator_recoveries_total{run="gpt",reason="node_lost"} 1.0
"""


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float = 90.0) -> Any:
    """Poll until ``predicate`` returns a truthy value (generous: the machine may be busy)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def replicas_of(custom, name: str) -> dict[str, int]:
    cluster = custom.get_namespaced_custom_object("ray.io", "v1", "default", "rayclusters", name)
    return {g["groupName"]: g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]}


def _object_exists(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.mark.slow
def test_operator_reconciles_reports_nodes_resizes_and_cleans_up(kubeconfig, api, controller):
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    controller.metrics_text = METRICS
    # Two 4-GPU A100 nodes and one T4 node before the operator starts.
    core.create_node(gpu_node("a100-1", A100, 4))
    core.create_node(gpu_node("a100-2", A100, 4))
    core.create_node(gpu_node("t4-1", "Tesla-T4", 1))

    with KopfRunner(OPERATOR_ARGS) as runner:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                               job("gpt", job_spec(controller.url)))
        cluster = wait_for(lambda: custom.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "gpt"), "the RayCluster")
        groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
        assert groups["a100"]["labels"]["orchestrator.io/device-type"] == "A100-80"
        assert groups["a100"]["template"]["spec"]["nodeSelector"] == {
            "nvidia.com/gpu.product": A100}
        # Replicas follow capacity: 2 nodes x 4 GPUs / 4 per pod = 2; one T4 pod.
        wait_for(lambda: replicas_of(custom, "gpt") == {"a100": 2, "t4": 1}, "replicas 2/1")
        rayjob = wait_for(lambda: custom.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayjobs", "gpt"), "the RayJob")
        assert rayjob["spec"]["entrypoint"] == "orchestrator run /etc/orchestrator/job.yaml"
        configmap = core.read_namespaced_config_map("gpt-job", "default")
        assert yaml.safe_load(configmap.data["job.yaml"])["checkpoint"]["dir"] == "/ckpt"

        # A spot-termination taint: reported with a deadline, and the a100 pool shrinks.
        taint = {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule",
                 "timeAdded": "2030-01-01T00:00:00Z"}
        core.patch_node("a100-2", {"spec": {"taints": [taint]}})
        event = wait_for(lambda: next((e for e in controller.received()
                                       if e["reason"].startswith("spot_termination")), None),
                         "the spot-termination event")
        assert event["node"] == "a100-2" and event["device_type"] == "A100-80"
        assert event["deadline_unix_s"] == pytest.approx(1893456000.0 + 120.0)
        wait_for(lambda: replicas_of(custom, "gpt")["a100"] == 1, "a100 pool down to 1")

        # The T4 node goes NotReady: reported; the t4 pool stays at its minimum of 1.
        core.patch_node("t4-1", {"status": {"conditions": [{"type": "Ready",
                                                             "status": "Unknown"}]}})
        wait_for(lambda: any(e["event"] == "node_lost" and e["node"] == "t4-1"
                             for e in controller.received()), "the not-ready event")
        assert replicas_of(custom, "gpt")["t4"] == 1

        # A new A100 node: reported as added; the pool grows back.
        core.create_node(gpu_node("a100-3", A100, 8))
        wait_for(lambda: any(e["event"] == "node_joined" and e["node"] == "a100-3"
                             for e in controller.received()), "the added event")
        wait_for(lambda: replicas_of(custom, "gpt")["a100"] == 3, "a100 pool up to 3")

        # Status: copied from the controller's metrics by the timer.
        status = wait_for(lambda: (custom.get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "gpt").get("status") or {}).get(
                "throughputSamplesPerS") and custom.get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "gpt")["status"], "status from metrics")
        assert status["phase"] == "Running"
        assert status["devicesByType"] == {"A100-80": 8, "T4": 2}
        assert status["throughputSamplesPerS"] == 123.5
        assert status["lastRecovery"]["reason"] == "node_lost"
        assert status["pools"]["a100"]["maxReplicas"] == 4

        # Deleting the job deletes its children.
        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "gpt")
        wait_for(lambda: not _object_exists(custom.get_namespaced_custom_object, "ray.io", "v1",
                                            "default", "rayclusters", "gpt"), "RayCluster gone")
        wait_for(lambda: not _object_exists(core.read_namespaced_config_map, "gpt-job",
                                            "default"), "ConfigMap gone")
        assert not _object_exists(custom.get_namespaced_custom_object, "ray.io", "v1", "default",
                                  "rayjobs", "gpt")
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None


@pytest.mark.slow
def test_invalid_spec_fails_permanently_with_an_event(kubeconfig, api, controller):
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    spec = job_spec(controller.url)
    spec["pools"][0]["minReplicas"] = 5  # > maxReplicas 4
    with KopfRunner(OPERATOR_ARGS) as runner:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("bad", spec))
        status = wait_for(lambda: (custom.get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "bad").get("status") or {}).get("message"),
            "the failure status")
        assert "spec.pools[0]" in status and "minReplicas (5) > maxReplicas (4)" in status
        got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "bad")
        assert got["status"]["phase"] == "Failed"
        events = wait_for(lambda: [e for e in core.list_namespaced_event("default").items
                                   if e.reason == "InvalidSpec"], "the InvalidSpec event")
        assert "minReplicas (5) > maxReplicas (4)" in events[0].message
        assert not _object_exists(custom.get_namespaced_custom_object, "ray.io", "v1", "default",
                                  "rayclusters", "bad")
    assert runner.exit_code == 0, runner.output


@pytest.mark.slow
def test_ended_rayjob_gives_the_final_phase_and_frees_the_cluster(kubeconfig, api, controller):
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    core.create_node(gpu_node("a100-1", A100, 4))
    with KopfRunner(OPERATOR_ARGS) as runner:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                               job("done", job_spec(controller.url)))
        wait_for(lambda: custom.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayclusters", "done"), "the RayCluster")
        # The operator creates the RayJob after its cluster: wait for it too before patching.
        wait_for(lambda: custom.get_namespaced_custom_object(
            "ray.io", "v1", "default", "rayjobs", "done"), "the RayJob")
        # KubeRay's part: the job succeeded.
        custom.patch_namespaced_custom_object(
            "ray.io", "v1", "default", "rayjobs", "done",
            {"status": {"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete"}})
        status = wait_for(lambda: (lambda s: s if s.get("phase") == "Finished" else None)(
            custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "done")
            .get("status") or {}), "the final phase")
        assert status["jobStatus"] == "SUCCEEDED"
        wait_for(lambda: not _object_exists(custom.get_namespaced_custom_object, "ray.io", "v1",
                                            "default", "rayclusters", "done"), "cluster gone")
    assert runner.exit_code == 0, runner.output
