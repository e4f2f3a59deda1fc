"""The chart, rendered by the real helm binary and checked against real schemas.

Built-in kinds are validated against Kubernetes' own schemas (kubernetes-validate, strict: unknown
fields fail); RayCluster and RayJob against KubeRay's CRD schemas (tests/helm/crds), and
HeteroTrainingJob against the chart's own CRD, all with unknown fields rejected.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from chart_support import (
    CHART,
    EXAMPLES,
    HTJ_CRD,
    KUBERNETES_VERSION,
    by_kind,
    cluster_specs,
    helm,
    ray_pod_specs,
    render,
)

VALUES_FILES = ["one-pool.yaml", "three-pools.yaml", "operator.yaml", "operator-only.yaml"]
# Kinds no schema here covers: Prometheus Operator CRDs (checked by hand below).
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
CUSTOM_KINDS = {"RayCluster", "RayJob", "HeteroTrainingJob"}


def test_helm_lint_passes_with_every_example() -> None:
    helm("lint", "--strict", str(CHART))
    for name in VALUES_FILES:
        helm("lint", "--strict", str(CHART), "-f", str(EXAMPLES / name))


@pytest.mark.parametrize("values_file", [*VALUES_FILES, None])
def test_every_rendered_object_is_valid(values_file, kuberay_validators) -> None:
    files = [EXAMPLES / values_file] if values_file else []
    sets = ("monitoring.enabled=true", "monitoring.rules.enabled=true")
    objects = render(*files, sets=sets if values_file is None else ())
    assert objects
    for obj in objects:
        kind = obj["kind"]
        if kind in CUSTOM_KINDS:
            errors = sorted(kuberay_validators[kind].iter_errors(obj), key=str)
            assert not errors, f"{kind}: " + "; ".join(
                f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])
        elif kind in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_schema_validation_catches_a_typo(kuberay_validators) -> None:
    """The strict KubeRay schema is not vacuous: a misspelt field in a worker group fails."""
    rayjob = by_kind(render(EXAMPLES / "one-pool.yaml"), "RayJob")[0]
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    assert list(kuberay_validators["RayJob"].iter_errors(rayjob))
    with pytest.raises(kubernetes_validate.ValidationError):
        configmap = by_kind(render(EXAMPLES / "one-pool.yaml"), "ConfigMap")[0]
        configmap["dataa"] = {}
        kubernetes_validate.validate(configmap, KUBERNETES_VERSION, strict=True)


def test_three_pools_give_three_worker_groups_with_device_labels() -> None:
    objects = render(EXAMPLES / "three-pools.yaml")
    (cluster,) = cluster_specs(objects)
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert sorted(groups) == ["a100", "h100", "l4-spot"]
    expected_product = {"h100": "NVIDIA-H100-80GB-HBM3", "a100": "NVIDIA-A100-SXM4-80GB",
                        "l4-spot": "NVIDIA-L4"}
    expected_type = {"h100": "H100", "a100": "A100-80", "l4-spot": "L4"}
    expected_gpus = {"h100": 8, "a100": 4, "l4-spot": 1}
    for name, group in groups.items():
        pod = group["template"]["spec"]
        assert group["labels"]["orchestrator.io/device-type"] == expected_type[name]
        assert group["labels"]["ray.io/accelerator-type"] == expected_type[name]
        assert pod["nodeSelector"]["nvidia.com/gpu.product"] == expected_product[name]
        limits = pod["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == expected_gpus[name]
    spot = groups["l4-spot"]["template"]["spec"]
    assert spot["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert spot["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
    assert (groups["a100"]["minReplicas"], groups["a100"]["maxReplicas"]) == (0, 4)


def test_gpu_product_can_be_overridden_per_pool() -> None:
    override = "pools[0].gpuProduct=NVIDIA-A100-80GB-PCIe"
    objects = render(EXAMPLES / "one-pool.yaml", sets=(override,))
    (cluster,) = cluster_specs(objects)
    pod = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-80GB-PCIe"


def test_job_spec_is_mounted_and_run_by_the_rayjob() -> None:
    objects = render(EXAMPLES / "one-pool.yaml")
    values = yaml.safe_load((EXAMPLES / "one-pool.yaml").read_text())
    (configmap,) = [c for c in by_kind(objects, "ConfigMap")
                    if c["metadata"]["name"] == "llm-orchestrator-job"]
    assert yaml.safe_load(configmap["data"]["job.yaml"]) == values["job"]
    (rayjob,) = by_kind(objects, "RayJob")
    assert rayjob["spec"]["entrypoint"] == "orchestrator run /etc/orchestrator/job.yaml"
    assert not by_kind(objects, "RayCluster")  # the RayJob brings its own cluster
    (cluster,) = cluster_specs(objects)
    head = cluster["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    assert volumes[mounts["/etc/orchestrator"]]["configMap"]["name"] == "llm-orchestrator-job"
    ports = {p["name"]: p["containerPort"] for p in head["containers"][0]["ports"]}
    assert ports["orch-metrics"] == 9400


def test_metrics_port_follows_the_job_spec() -> None:
    objects = render(EXAMPLES / "one-pool.yaml", sets=("job.metrics.port=9555",))
    (cluster,) = cluster_specs(objects)
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in head["ports"]}["orch-metrics"] == 9555


def _pod_specs(objects):
    for template in ray_pod_specs(objects):
        yield template["spec"]
    for rayjob in by_kind(objects, "RayJob"):
        if "submitterPodTemplate" in rayjob["spec"]:
            yield rayjob["spec"]["submitterPodTemplate"]["spec"]
    for deployment in by_kind(objects, "Deployment"):
        yield deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_secure_defaults(values_file) -> None:
    objects = render(EXAMPLES / values_file)
    pods = list(_pod_specs(objects))
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["readOnlyRootFilesystem"] is True
            assert "privileged" not in sc
            resources = container["resources"]
            assert resources["requests"] and resources["limits"]
            assert {"cpu", "memory"} <= set(resources["limits"])


def test_ray_pods_get_no_api_token() -> None:
    objects = render(EXAMPLES / "three-pools.yaml")
    pods = [t["spec"] for t in ray_pod_specs(objects)]
    assert len(pods) == 4
    assert all(p["automountServiceAccountToken"] is False for p in pods)


def test_operator_rbac_is_least_privilege() -> None:
    objects = render(EXAMPLES / "operator.yaml")
    (cluster_role,) = by_kind(objects, "ClusterRole")
    cluster_verbs = {v for rule in cluster_role["rules"] for v in rule["verbs"]}
    assert cluster_verbs == {"get", "list", "watch"}  # read-only cluster-wide
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_resources == {"nodes"}
    (role,) = by_kind(objects, "Role")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"]
    assert not any("secrets" in rule["resources"] for rule in role["rules"])
    (binding,) = by_kind(objects, "RoleBinding")
    (account,) = by_kind(objects, "ServiceAccount")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]


def test_operator_mode_renders_one_job_resource_the_operator_accepts(kuberay_validators) -> None:
    from operators.hetero.spec import parse_job_spec

    objects = render(EXAMPLES / "operator.yaml")
    assert not by_kind(objects, "RayCluster") and not by_kind(objects, "RayJob")
    (job,) = by_kind(objects, "HeteroTrainingJob")
    assert not by_kind(objects, "CustomResourceDefinition")  # in crds/, not a template
    spec = parse_job_spec(job["spec"])
    assert [p.deviceType for p in spec.pools] == ["A100-80", "T4"]
    assert [p.gpu_product for p in spec.pools] == ["NVIDIA-A100-SXM4-80GB", "Tesla-T4"]
    (deployment,) = by_kind(objects, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "operators.hetero"]
    assert "--namespace=training" in container["args"]


def test_operator_off_installs_no_operator_objects() -> None:
    objects = render(EXAMPLES / "one-pool.yaml")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Deployment", "CustomResourceDefinition", "ClusterRole", "Role",
                        "HeteroTrainingJob"}


def test_chart_and_operator_render_the_same_worker_groups() -> None:
    """Both paths to a RayCluster (chart alone, or operator) give the same pools."""
    from operators.hetero.render import render_raycluster
    from operators.hetero.spec import parse_job_spec

    values = yaml.safe_load((EXAMPLES / "three-pools.yaml").read_text())
    (chart_cluster,) = cluster_specs(render(EXAMPLES / "three-pools.yaml"))
    storage = values["storage"]
    pod = {"volumes": [{"name": "storage",
                        "persistentVolumeClaim": {"claimName": storage["claimName"]}}],
           "volumeMounts": [{"name": "storage", "mountPath": storage["mountPath"]}]}
    spec = parse_job_spec({"image": "img:1", "pools": values["pools"], "job": values["job"],
                           "pod": pod})
    operator_cluster = render_raycluster("llm-orchestrator", "training", spec)
    keys = ("groupName", "replicas", "minReplicas", "maxReplicas", "labels")
    for chart_group, op_group in zip(chart_cluster["workerGroupSpecs"],
                                     operator_cluster["spec"]["workerGroupSpecs"], strict=True):
        assert {k: chart_group[k] for k in keys} == {k: op_group[k] for k in keys}
        chart_pod, op_pod = chart_group["template"]["spec"], op_group["template"]["spec"]
        assert chart_pod["nodeSelector"] == op_pod["nodeSelector"]
        assert chart_pod["tolerations"] == op_pod["tolerations"]
        assert (chart_pod["containers"][0]["resources"]
                == json.loads(json.dumps(op_pod["containers"][0]["resources"])))


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitoring_targets_the_named_metrics_port_on_the_head(kind) -> None:
    objects = render(EXAMPLES / "one-pool.yaml",
                     sets=("monitoring.enabled=true", f"monitoring.kind={kind}"))
    (monitor,) = by_kind(objects, kind)
    other = ({"PodMonitor", "ServiceMonitor"} - {kind}).pop()
    assert not by_kind(objects, other)
    endpoints = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
    assert [e["port"] for e in endpoints] == ["orch-metrics", "metrics"]
    if kind == "PodMonitor":
        # The RayJob's cluster name is generated: select the head pod by the job label.
        assert monitor["spec"]["selector"]["matchLabels"] == {
            "orchestrator.io/job": "llm-orchestrator", "ray.io/node-type": "head"}
    else:
        (service,) = by_kind(objects, "Service")
        # KubeRay labels head pods with ray.io/cluster and ray.io/node-type.
        assert service["spec"]["selector"] == {"orchestrator.io/job": "llm-orchestrator",
                                               "ray.io/node-type": "head"}
        assert {p["targetPort"] for p in service["spec"]["ports"]} == {"orch-metrics", "metrics"}
        labels = service["metadata"]["labels"]
        assert all(labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())


def test_monitoring_off_renders_no_monitor() -> None:
    kinds = {o["kind"] for o in render(EXAMPLES / "one-pool.yaml")}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "Service", "PrometheusRule"}


def test_dashboard_configmap_carries_the_grafana_label(tmp_path: Path) -> None:
    """Rendered from files/grafana-dashboard.json; a chart copy with a minimal one if absent."""
    chart = CHART
    if not (CHART / "files" / "grafana-dashboard.json").exists():
        chart = tmp_path / "orchestrator"
        shutil.copytree(CHART, chart)
        (chart / "files" / "grafana-dashboard.json").write_text(
            json.dumps({"title": "orchestrator", "panels": []}))
    dashboard_text = (chart / "files" / "grafana-dashboard.json").read_text()
    objects = render(EXAMPLES / "one-pool.yaml", chart=chart)
    (configmap,) = [c for c in by_kind(objects, "ConfigMap")
                    if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    (data,) = configmap["data"].values()
    assert json.loads(data) == json.loads(dashboard_text)
    off = render(EXAMPLES / "one-pool.yaml", chart=chart, sets=("dashboard.enabled=false",))
    assert not [c for c in by_kind(off, "ConfigMap")
                if c["metadata"]["labels"].get("grafana_dashboard") == "1"]


BAD_VALUES = [
    # (--set arguments, words the error must contain)
    (("pools[0].maxReplicas=four",), ["maxReplicas", "integer"]),
    (("pools[0].gpus=2",), ["gpus"]),
    (("pools[0].name=A100_Pool",), ["name"]),
    (("monitoring.kind=Prometheus",), ["kind"]),
    (("pools[0].minReplicas=5", "pools[0].maxReplicas=2"), ["minReplicas (5) > maxReplicas (2)"]),
    (("pools[0].deviceType=MI300X",), ["MI300X", "gpuProduct"]),
    (("pools[1].name=a100", "pools[1].deviceType=T4", "pools[1].maxReplicas=1"),
     ["a100", "unique"]),
]


@pytest.mark.parametrize(("sets", "words"), BAD_VALUES)
def test_bad_values_fail_with_a_message_naming_the_field(sets, words) -> None:
    args = ["template", "llm", str(CHART), "-f", str(EXAMPLES / "one-pool.yaml")]
    for s in sets:
        args += ["--set", s]
    result = helm(*args, check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr


def test_sample_heterotrainingjob_is_valid(kuberay_validators) -> None:
    from operators.hetero.spec import parse_job_spec

    sample = yaml.safe_load((EXAMPLES / "heterotrainingjob.yaml").read_text())
    errors = list(kuberay_validators["HeteroTrainingJob"].iter_errors(sample))
    assert not errors, [e.message for e in errors]
    spec = parse_job_spec(sample["spec"])
    assert [p.name for p in spec.pools] == ["a100", "l4"]


def test_operator_crd_is_a_valid_kubernetes_object() -> None:
    crd = yaml.safe_load(HTJ_CRD.read_text())
    kubernetes_validate.validate(crd, KUBERNETES_VERSION, strict=True)
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
