"""Pure operator functions: spec validation, rendering, node events, pool sizing, status."""

from __future__ import annotations

import pytest
import yaml
from k8s_objects import gpu_node, job, job_spec

from operators.hetero.delivery import with_retries
from operators.hetero.devices import device_type_for_product, known_device_types
from operators.hetero.nodes import NodeEventKind, node_event, node_state
from operators.hetero.reconcile import (
    desired_replicas,
    pool_capacity_pods,
    replica_patch,
    status_from_metrics,
)
from operators.hetero.render import controller_url, render_children, render_raycluster
from operators.hetero.spec import parse_job_spec
from orchestrator.errors import SpecError, TransientError

A100 = "NVIDIA-A100-SXM4-80GB"
NOW_S = 1_800_000_000.0


# -- spec -----------------------------------------------------------------------------------


def test_spec_defaults_and_products() -> None:
    spec = parse_job_spec(job_spec())
    assert [p.gpu_product for p in spec.pools] == [A100, "Tesla-T4"]
    assert spec.metrics_port == 9400
    assert spec.job_document()["metrics"] == {"host": "0.0.0.0", "port": 9400}


@pytest.mark.parametrize(("mutate", "words"), [
    (lambda s: s["pools"][0].update(minReplicas=5),
     ["spec.pools[0]", "minReplicas (5) > maxReplicas (4)"]),
    (lambda s: s["pools"][1].update(gpus=2), ["spec.pools[1].gpus", "remove the field"]),
    (lambda s: s["pools"][0].update(deviceType="MI300X"), ["MI300X", "gpuProduct"]),
    (lambda s: s["pools"][1].update(name="a100"), ["unique", "a100"]),
    (lambda s: s["pools"][0].update(name="A100"), ["spec.pools[0].name"]),
    (lambda s: s.pop("image"), ["spec.image", "add the field"]),
    (lambda s: s.update(pools=[]), ["spec.pools"]),
])
def test_bad_spec_names_the_field(mutate, words) -> None:
    spec = job_spec()
    mutate(spec)
    with pytest.raises(SpecError) as info:
        parse_job_spec(spec)
    for word in words:
        assert word in str(info.value)


def test_unknown_device_type_allowed_with_explicit_product() -> None:
    spec = job_spec()
    spec["pools"][0].update(deviceType="MI300X", gpuProduct="AMD-MI300X")
    assert parse_job_spec(spec).pools[0].gpu_product == "AMD-MI300X"


def test_device_table_covers_catalog_names() -> None:
    assert {"A100-80", "H100", "L4", "T4"} <= set(known_device_types())
    assert device_type_for_product("NVIDIA-A100-80GB-PCIe") == "A100-80"
    assert device_type_for_product("Unknown-GPU") is None
    assert device_type_for_product("Unknown-GPU", {"Unknown-GPU": "X"}) == "X"


# -- rendering ------------------------------------------------------------------------------


def test_children_are_owned_named_after_the_job_and_pass_the_job_through() -> None:
    body = job("gpt", job_spec())
    body["metadata"]["uid"] = "u-1"
    spec = parse_job_spec(body["spec"])
    configmap, cluster, rayjob = render_children(body, spec, {"a100": 3})
    for child in (configmap, cluster, rayjob):
        assert child["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert child["metadata"]["namespace"] == "default"
    assert configmap["metadata"]["name"] == "gpt-job"
    assert yaml.safe_load(configmap["data"]["job.yaml"])["checkpoint"] == {
        "dir": "/ckpt", "interval_steps": 10}
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert groups["a100"]["replicas"] == 3  # given
    assert groups["t4"]["replicas"] == 1  # its minReplicas
    assert groups["t4"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == 1
    assert rayjob["spec"]["clusterSelector"] == {"ray.io/cluster": "gpt"}


def test_controller_url_defaults_to_the_head_service() -> None:
    spec = parse_job_spec(job_spec())
    assert controller_url("gpt", "ml", spec) == "http://gpt-head-svc.ml.svc:9400"
    spec = parse_job_spec(job_spec("http://10.0.0.5:9500/"))
    assert controller_url("gpt", "ml", spec) == "http://10.0.0.5:9500"


# -- node events ----------------------------------------------------------------------------


def state(**kwargs):
    return node_state(gpu_node("n1", A100, 4, **kwargs))


def test_first_sight_of_a_usable_gpu_node_is_added() -> None:
    event = node_event(state(), None, now_unix_s=NOW_S)
    assert event.event is NodeEventKind.ADDED and event.device_type == "A100-80"
    assert (event.ray_node_labels or {})["orchestrator.io/device-type"] == "A100-80"
    assert event.to_json()["event"] == "node_joined"


def test_no_event_without_change_or_for_cpu_nodes() -> None:
    assert node_event(state(), state(), now_unix_s=NOW_S) is None
    cpu = node_state({"metadata": {"name": "cpu-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "False"}]}})
    assert node_event(cpu, None, now_unix_s=NOW_S) is None
    assert node_event(None, cpu, now_unix_s=NOW_S) is None


@pytest.mark.parametrize("ready", ["False", "Unknown"])
def test_not_ready(ready) -> None:
    event = node_event(state(ready=ready), state(), now_unix_s=NOW_S)
    assert event.event is NodeEventKind.NOT_READY


def test_cordon_by_flag_or_taint() -> None:
    assert node_event(state(unschedulable=True), state(), now_unix_s=NOW_S).event is (
        NodeEventKind.CORDONED)
    taint = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    assert node_event(state(taints=taint), state(), now_unix_s=NOW_S).event is (
        NodeEventKind.CORDONED)


def test_spot_taint_deadline_from_time_added_plus_notice() -> None:
    taint = [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule",
              "timeAdded": "2030-01-01T00:00:00Z"}]  # 1893456000 s, not now
    event = node_event(state(taints=taint), state(), now_unix_s=NOW_S)
    assert event.event is NodeEventKind.SPOT_TERMINATION
    assert event.deadline_unix_s == 1893456000.0 + 30.0  # GCE's 30 s notice


def test_spot_taint_without_time_uses_now() -> None:
    taint = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]
    event = node_event(state(taints=taint), state(), now_unix_s=NOW_S)
    assert event.deadline_unix_s == NOW_S + 120.0


def test_spot_wins_over_not_ready_and_is_reported_once() -> None:
    taint = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]
    both = state(taints=taint, ready="False")
    assert node_event(both, state(), now_unix_s=NOW_S).event is NodeEventKind.SPOT_TERMINATION
    # Already tainted before: the NotReady that follows is the next event.
    tainted = state(taints=taint)
    assert node_event(both, tainted, now_unix_s=NOW_S).event is NodeEventKind.NOT_READY


def test_removed_and_back_again() -> None:
    assert node_event(None, state(), now_unix_s=NOW_S).event is NodeEventKind.REMOVED
    event = node_event(state(), state(ready="False"), now_unix_s=NOW_S)
    assert event.event is NodeEventKind.ADDED and event.reason == "node usable again"


# -- pool sizing and status -----------------------------------------------------------------


def test_replicas_follow_capacity_within_bounds() -> None:
    spec = parse_job_spec(job_spec())  # a100: 4 GPUs per pod, 0..4; t4: 1 per pod, 1..8
    nodes = [node_state(gpu_node(f"a{i}", A100, 8)) for i in range(3)]  # 3 x 8 / 4 = 6 pods
    nodes.append(node_state(gpu_node("a-cordoned", A100, 8, unschedulable=True)))
    assert pool_capacity_pods(spec.pools[0], nodes) == 6
    # a100 clamped to its max 4; no T4 nodes, t4 held at its min 1.
    assert desired_replicas(spec, nodes) == {"a100": 4, "t4": 1}
    assert desired_replicas(spec, nodes[:1]) == {"a100": 2, "t4": 1}


def test_pool_node_selector_must_match() -> None:
    spec_dict = job_spec()
    spec_dict["pools"][0]["nodeSelector"] = {"pool": "reserved"}
    spec = parse_job_spec(spec_dict)
    plain = node_state(gpu_node("a", A100, 4))
    reserved = node_state(gpu_node("b", A100, 4, labels={"pool": "reserved"}))
    assert pool_capacity_pods(spec.pools[0], [plain, reserved]) == 1


def test_replica_patch_only_when_something_changes() -> None:
    spec = parse_job_spec(job_spec())
    cluster = render_raycluster("gpt", "default", spec, {"a100": 2, "t4": 1})
    assert replica_patch(cluster, {"a100": 2, "t4": 1}) is None
    patch = replica_patch(cluster, {"a100": 1, "t4": 1})
    groups = patch["spec"]["workerGroupSpecs"]
    assert [(g["groupName"], g["replicas"]) for g in groups] == [("a100", 1), ("t4", 1)]
    assert groups[0]["template"] == cluster["spec"]["workerGroupSpecs"][0]["template"]


METRICS = """\
# TYPE orchestrator_controller_state gauge
orchestrator_controller_state{run="r",state="running"} 0.0
orchestrator_controller_state{run="r",state="recovering"} 1.0
# TYPE orchestrator_devices gauge
orchestrator_devices{run="r",device_type="L4",state="alive"} 3.0
orchestrator_devices{run="r",device_type="L4",state="draining"} 1.0
# TYPE orchestrator_predicted_throughput_samples_per_second gauge
orchestrator_predicted_throughput_samples_per_second{run="r"} 40.0
# TYPE orchestrator_recoveries counter
orchestrator_recoveries_total{run="r",reason="spot"} 2.0
"""


def test_status_from_metrics_and_last_recovery() -> None:
    status = status_from_metrics(METRICS, {}, now_iso="t1")
    assert status["phase"] == "Recovering"
    assert status["devicesByType"] == {"L4": 3}
    assert status["plan"]["predictedThroughputSamplesPerS"] == 40.0
    assert status["throughputSamplesPerS"] is None  # not yet measured
    assert status["lastRecovery"] == {"time": "t1", "reason": "spot", "counts": {"spot": 2}}
    # Same counts later: the last recovery keeps its time.
    again = status_from_metrics(METRICS, status, now_iso="t2")
    assert again["lastRecovery"]["time"] == "t1"


def test_status_keeps_phase_when_metrics_say_nothing() -> None:
    assert status_from_metrics("", {"phase": "Pending"}, now_iso="t")["phase"] == "Pending"


# -- retries --------------------------------------------------------------------------------


def test_with_retries_retries_transient_errors_only() -> None:
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("not yet")
        return "ok"

    assert with_retries(flaky, attempts=3, backoff_s=0.5, sleep=sleeps.append) == "ok"
    assert sleeps == [0.5, 1.0]
    with pytest.raises(TransientError):
        with_retries(lambda: (_ for _ in ()).throw(TransientError("down")), attempts=2,
                     sleep=sleeps.append)
    with pytest.raises(KeyError):
        with_retries(lambda: {}["x"], sleep=sleeps.append)
