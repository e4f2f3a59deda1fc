"""Storage and pod settings, image pinning, the job section's schema, security and monitoring."""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml
from chart_support import (
    CHART,
    EXAMPLES,
    KUBERNETES_VERSION,
    ROOT,
    by_kind,
    helm,
    ray_pod_specs,
    render,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4
POD_VALUES = {
    "storage": {"claimName": "training-data", "mountPath": "/mnt/checkpoints"},
    "serviceAccount": {"name": "bucket-reader"},
    "imagePullSecrets": [{"name": "regcred"}],
    "pod": {
        "labels": {"team": "ml"},
        "annotations": {"example.com/owner": "ml"},
        "env": [{"name": "HF_HOME", "value": "/mnt/checkpoints/hf"}],
        "envFrom": [{"secretRef": {"name": "bucket-credentials"}}],
        "volumes": [{"name": "datasets", "csi": {"driver": "gcsfuse.csi.storage.gke.io",
                                                 "volumeAttributes": {"bucketName": "data"}}}],
        "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In",
                 "values": ["us-central1-a"]}]}]}}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                         "effect": "NoSchedule"}],
        "priorityClassName": "training",
        "tmpSize": "50Gi",
    },
}


@pytest.fixture(scope="module")
def with_pod_values(tmp_path_factory):
    path = tmp_path_factory.mktemp("values") / "pod.yaml"
    path.write_text(yaml.safe_dump(POD_VALUES))
    return path


def test_pod_settings_reach_every_ray_pod(with_pod_values) -> None:
    objects = render(EXAMPLES / "three-pools.yaml", with_pod_values)
    templates = ray_pod_specs(objects)
    assert len(templates) == 4
    for template in templates:
        meta, pod = template["metadata"], template["spec"]
        assert meta["labels"]["team"] == "ml"
        assert meta["annotations"]["example.com/owner"] == "ml"
        assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        assert pod["serviceAccountName"] == "bucket-reader"
        assert pod["automountServiceAccountToken"] is False
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["priorityClassName"] == "training"
        assert pod["affinity"] == POD_VALUES["pod"]["affinity"]
        assert {"key": "dedicated", "operator": "Equal", "value": "ml",
                "effect": "NoSchedule"} in pod["tolerations"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["storage"]["persistentVolumeClaim"] == {"claimName": "training-data"}
        assert volumes["datasets"]["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
        assert volumes["tmp"]["emptyDir"]["sizeLimit"] == "50Gi"
        (container,) = pod["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/mnt/checkpoints"] == "storage" and mounts["/data"] == "datasets"
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_HOME"]["value"] == "/mnt/checkpoints/hf"
        assert container["envFrom"] == [{"secretRef": {"name": "bucket-credentials"}}]
        assert container["resources"]["requests"]["ephemeral-storage"] == "50Gi"
    # The spot pool keeps its own toleration beside the shared one.
    spot = next(t for t in templates
                if t["metadata"]["labels"].get("orchestrator.io/pool") == "l4-spot")["spec"]
    assert any(t["key"] == "cloud.google.com/gke-spot" for t in spot["tolerations"])


def test_pod_settings_are_valid_kubernetes(with_pod_values, kuberay_validators) -> None:
    for obj in render(EXAMPLES / "one-pool.yaml", with_pod_values):
        if obj["kind"] == "RayJob":
            assert not list(kuberay_validators["RayJob"].iter_errors(obj))


def test_operator_path_gets_the_same_pod_settings(with_pod_values) -> None:
    from operators.hetero.render import render_raycluster
    from operators.hetero.spec import parse_job_spec

    objects = render(EXAMPLES / "operator.yaml", with_pod_values)
    (job,) = by_kind(objects, "HeteroTrainingJob")
    spec = parse_job_spec(job["spec"])
    cluster = render_raycluster("llm-orchestrator", "training", spec)
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    for pod in (head, worker):
        assert pod["serviceAccountName"] == "bucket-reader"
        assert {v["name"] for v in pod["volumes"]} >= {"storage", "datasets", "tmp"}
        assert pod["priorityClassName"] == "training"
    mounts = {m["name"]: m for m in head["containers"][0]["volumeMounts"]}
    assert mounts["node-events-token"]["mountPath"] == "/var/run/orchestrator/node-events"
    assert head["volumes"][-1]["secret"]["secretName"] == "llm-orchestrator-node-events"


def test_every_ray_container_gets_its_node_name_as_a_ray_label() -> None:
    for template in ray_pod_specs(render(EXAMPLES / "three-pools.yaml")):
        env = template["spec"]["containers"][0]["env"]
        names = [e["name"] for e in env]
        by_name = {e["name"]: e for e in env}
        assert by_name["K8S_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        # Defined before the variable that refers to it: Kubernetes expands $(K8S_NODE_NAME).
        assert names.index("K8S_NODE_NAME") < names.index("RAY_OVERRIDE_LABELS")
        assert json.loads(by_name["RAY_OVERRIDE_LABELS"]["value"]) == {
            "orchestrator.io/node-name": "$(K8S_NODE_NAME)"}


def test_digest_pins_the_image() -> None:
    objects = render(EXAMPLES / "one-pool.yaml", sets=(f"image.digest={DIGEST}",))
    for template in ray_pod_specs(objects):
        image = template["spec"]["containers"][0]["image"]
        assert image == f"ghcr.io/orchestrator/orchestrator@{DIGEST}"
    objects = render(EXAMPLES / "operator.yaml", sets=(f"image.digest={DIGEST}",))
    assert by_kind(objects, "HeteroTrainingJob")[0]["spec"]["image"].endswith("@" + DIGEST)


@pytest.mark.parametrize(("sets", "words"), [
    (("job.trainig.steps=3",), ["/job", "trainig"]),
    (("job.training.steps=many",), ["/job/training/steps"]),
    (("job.checkpoint.dir=/c", "job.checkpoint.interval_steps=-1"),
     ["/job/checkpoint/interval_steps"]),
    (("image.digest=sha256:abc",), ["/image/digest"]),
    (("storage.mountPath=relative",), ["/storage/mountPath"]),
    (("pod.priorityclass=x",), ["priorityclass"]),
])
def test_bad_values_fail_helm_template(sets, words) -> None:
    args = ["template", "llm", str(CHART), "-f", str(EXAMPLES / "one-pool.yaml")]
    for s in sets:
        args += ["--set", s]
    result = helm(*args, check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr


def test_job_schema_is_generated_from_the_job_model() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "chart_job_schema.py"),
                             "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_token_secret_is_mounted_into_the_head_and_the_operator() -> None:
    objects = render(EXAMPLES / "operator.yaml")
    (secret,) = by_kind(objects, "Secret")
    assert secret["metadata"]["name"] == "llm-orchestrator-node-events"
    assert len(secret["data"]["token"]) >= 48
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE"] == "/var/run/orchestrator/node-events/token"
    assert {v["name"]: v for v in pod["volumes"]}["node-events-token"]["secret"] == {
        "secretName": "llm-orchestrator-node-events"}
    (job,) = by_kind(objects, "HeteroTrainingJob")
    assert job["spec"]["nodeEventsTokenSecret"] == "llm-orchestrator-node-events"
    direct = render(EXAMPLES / "one-pool.yaml")
    head = ray_pod_specs(direct)[0]["spec"]
    env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    assert env["ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE"] == "/var/run/orchestrator/node-events/token"


def test_network_policy_admits_only_the_operator_and_prometheus_to_the_controller() -> None:
    (policy,) = by_kind(render(EXAMPLES / "operator.yaml"), "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "orchestrator.io/job": "llm-orchestrator"}
    rules = policy["spec"]["ingress"]
    by_port = {}
    for rule in rules:
        for port in rule.get("ports") or [{"port": "any"}]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    # The job's own pods reach everything; nobody else reaches an unlisted port.
    assert by_port["any"] == [{"podSelector": {"matchLabels": {
        "orchestrator.io/job": "llm-orchestrator"}}}]
    assert set(by_port) == {"any", 9400, 8080, 8265}
    controller = by_port[9400]
    operator = {"app.kubernetes.io/instance": "llm", "app.kubernetes.io/component": "operator"}
    assert {"podSelector": {"matchLabels": operator}} in controller
    assert any(p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
               == "prometheus" for p in controller)
    assert [p["podSelector"]["matchLabels"] for p in by_port[8265]] == [
        {"app.kubernetes.io/name": "kuberay-operator"}]
    (deployment,) = by_kind(render(EXAMPLES / "operator.yaml"), "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "operator"
    assert labels["app.kubernetes.io/instance"] == "llm"
    off = render(EXAMPLES / "one-pool.yaml", sets=("networkPolicy.enabled=false",))
    assert not by_kind(off, "NetworkPolicy")


def test_head_has_a_disruption_budget() -> None:
    (pdb,) = by_kind(render(EXAMPLES / "one-pool.yaml"), "PodDisruptionBudget")
    kubernetes_validate.validate(pdb, KUBERNETES_VERSION, strict=True)
    assert pdb["spec"]["maxUnavailable"] == 0
    assert pdb["spec"]["selector"]["matchLabels"] == {"orchestrator.io/job": "llm-orchestrator",
                                                      "ray.io/node-type": "head"}
    assert not by_kind(render(EXAMPLES / "operator-only.yaml"), "PodDisruptionBudget")


def test_operator_rbac_covers_finalizers_and_reads_pods() -> None:
    (role,) = by_kind(render(EXAMPLES / "operator.yaml"), "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules[(("orchestrator.io",), ("heterotrainingjobs/finalizers",))] == {"update"}
    assert rules[(("",), ("pods",))] == {"get", "list", "watch"}


def test_k8s_job_mode_submitter_is_restricted() -> None:
    objects = render(EXAMPLES / "one-pool.yaml", sets=("rayJob.submissionMode=K8sJobMode",))
    (rayjob,) = by_kind(objects, "RayJob")
    pod = rayjob["spec"]["submitterPodTemplate"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    labels = rayjob["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    assert labels["orchestrator.io/job"] == "llm-orchestrator"  # admitted by the NetworkPolicy


def test_prometheus_rule_ships_the_alerts_and_a_controller_down_alert() -> None:
    objects = render(EXAMPLES / "one-pool.yaml",
                     sets=("monitoring.enabled=true", "monitoring.rules.enabled=true"))
    (rule,) = by_kind(objects, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    shipped = yaml.safe_load((CHART / "files" / "alert-rules.yaml").read_text())
    for group in shipped["groups"]:
        for r in group["rules"]:
            assert alerts[r["alert"]]["expr"] == r["expr"]
    assert alerts["OrchestratorControllerAbsent"]["expr"].startswith("absent(up{")
    assert 'namespace="training"' in alerts["OrchestratorControllerAbsent"]["expr"]
    assert alerts["OrchestratorControllerDown"]["expr"].endswith("== 0")
    assert "{{ $labels.run }}" in alerts["OrchestratorJobStalled"]["annotations"]["summary"]
    assert not by_kind(render(EXAMPLES / "one-pool.yaml", sets=("monitoring.enabled=true",)),
                       "PrometheusRule")


def test_checkpoints_without_shared_storage_fail_in_chart_and_operator() -> None:
    result = helm("template", "llm", str(CHART), "-f", str(EXAMPLES / "one-pool.yaml"),
                  "--set", "storage.claimName=", check=False)
    assert result.returncode != 0
    assert "job.checkpoint.dir" in result.stderr and "storage.claimName" in result.stderr
    # A volume of one's own at the checkpoint path is fine too.
    render(EXAMPLES / "one-pool.yaml", sets=(
        "storage.claimName=", "pod.volumes[0].name=ckpt",
        "pod.volumes[0].persistentVolumeClaim.claimName=mine",
        "pod.volumeMounts[0].name=ckpt", "pod.volumeMounts[0].mountPath=/mnt/checkpoints"))

    from operators.hetero.spec import parse_job_spec
    from orchestrator.errors import SpecError

    (job,) = by_kind(render(EXAMPLES / "operator.yaml"), "HeteroTrainingJob")
    parse_job_spec(job["spec"])
    spec = {**job["spec"], "pod": {}}
    with pytest.raises(SpecError, match="no shared volume"):
        parse_job_spec(spec)
