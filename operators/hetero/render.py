"""Pure rendering: a HeteroTrainingJob -> the KubeRay RayCluster, RayJob and job ConfigMap.

The same objects the Helm chart renders when it runs without the operator (``helm/orchestrator``),
with the same names, so monitoring and docs apply to both. No API calls here.

Names: RayCluster and RayJob are named after the job; the ConfigMap is ``<job>-job``. KubeRay names
the head Service ``<cluster>-head-svc``.
"""

from __future__ import annotations

from typing import Any

import yaml

from operators.hetero import GROUP, KIND, VERSION
from operators.hetero.devices import GPU_PRODUCT_LABEL, GPU_RESOURCE
from operators.hetero.spec import JobSpec, PoolSpec
from orchestrator.spec.labels import ACCELERATOR_LABEL, DEVICE_TYPE_LABEL, JOB_LABEL, POOL_LABEL

JOB_FILE_DIR = "/etc/orchestrator"
JOB_FILE = f"{JOB_FILE_DIR}/job.yaml"
METRICS_PORT_NAME = "orch-metrics"
RAY_METRICS_PORT = 8080
RAY_UID = 1000  # the `ray` user of rayproject/ray images


def configmap_name(job_name: str) -> str:
    return f"{job_name}-job"


def head_service_name(job_name: str) -> str:
    """KubeRay's head Service for the RayCluster named after the job."""
    return f"{job_name}-head-svc"


def controller_url(job_name: str, namespace: str, spec: JobSpec) -> str:
    """Base URL of the run's controller (metrics and node events), in-cluster DNS by default."""
    if spec.controllerURL:
        return spec.controllerURL.rstrip("/")
    return f"http://{head_service_name(job_name)}.{namespace}.svc:{spec.metrics_port}"


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """An owner reference to the HeteroTrainingJob, so Kubernetes collects the children."""
    meta = job["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, namespace: str, job_name: str, owner: dict[str, Any] | None) -> dict:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {JOB_LABEL: job_name, "app.kubernetes.io/managed-by": "orchestrator-operator"},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def render_configmap(name: str, namespace: str, spec: JobSpec, owner: dict | None = None) -> dict:
    """The ConfigMap holding job.yaml, mounted at /etc/orchestrator in every Ray pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap_name(name), namespace, name, owner),
        "data": {"job.yaml": yaml.safe_dump(spec.job_document(), sort_keys=True)},
    }


def _security_context() -> dict[str, Any]:
    # Ray writes only under /tmp (sessions, logs, spilled objects) and /dev/shm (object store),
    # both emptyDir volumes below, so the root filesystem stays read-only.
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _volumes(name: str) -> list[dict[str, Any]]:
    return [
        {"name": "job", "configMap": {"name": configmap_name(name)}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]


def _volume_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "job", "mountPath": JOB_FILE_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]


def _container(name: str, spec: JobSpec, cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
        "securityContext": _security_context(),
        "volumeMounts": _volume_mounts(),
        "env": [{"name": "HOME", "value": "/tmp/home"}],
    }


def _head_group(name: str, spec: JobSpec) -> dict[str, Any]:
    container = _container("ray-head", spec, spec.head.cpu, spec.head.memory, 0)
    container["ports"] = [
        {"name": "gcs", "containerPort": 6379},
        {"name": "dashboard", "containerPort": 8265},
        {"name": "client", "containerPort": 10001},
        {"name": "metrics", "containerPort": RAY_METRICS_PORT},
        {"name": METRICS_PORT_NAME, "containerPort": spec.metrics_port},
    ]
    return {
        # No training on the head: zero GPUs and zero CPUs for Ray tasks.
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "metadata": {"labels": {JOB_LABEL: name}},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": _pod_security_context(),
                "containers": [container],
                "volumes": _volumes(name),
            },
        },
    }


def _worker_group(name: str, spec: JobSpec, pool: PoolSpec, replicas: int) -> dict[str, Any]:
    container = _container("ray-worker", spec, pool.cpu, pool.memory, pool.gpusPerPod)
    node_selector = {**pool.nodeSelector, GPU_PRODUCT_LABEL: pool.gpu_product}
    return {
        "groupName": pool.name,
        "replicas": replicas,
        "minReplicas": pool.minReplicas,
        "maxReplicas": pool.maxReplicas,
        "labels": {DEVICE_TYPE_LABEL: pool.deviceType, ACCELERATOR_LABEL: pool.deviceType},
        "rayStartParams": {},
        "template": {
            "metadata": {"labels": {JOB_LABEL: name, POOL_LABEL: pool.name}},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": _pod_security_context(),
                "nodeSelector": node_selector,
                "tolerations": list(pool.tolerations),
                "containers": [container],
                "volumes": _volumes(name),
            },
        },
    }


def render_raycluster(
    name: str,
    namespace: str,
    spec: JobSpec,
    replicas: dict[str, int] | None = None,
    owner: dict | None = None,
) -> dict[str, Any]:
    """The RayCluster: a head group and one worker group per pool (``replicas`` by pool name)."""
    replicas = replicas or {}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _metadata(name, namespace, name, owner),
        "spec": {
            "rayVersion": spec.rayVersion,
            "suspend": spec.suspend,
            "headGroupSpec": _head_group(name, spec),
            "workerGroupSpecs": [
                _worker_group(name, spec, pool, replicas.get(pool.name, pool.initial_replicas))
                for pool in spec.pools
            ],
        },
    }


def render_rayjob(name: str, namespace: str, spec: JobSpec, owner: dict | None = None) -> dict:
    """The RayJob that runs ``orchestrator run`` on the RayCluster above (selected by name)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(name, namespace, name, owner),
        "spec": {
            "entrypoint": f"orchestrator run {JOB_FILE}",
            "clusterSelector": {"ray.io/cluster": name},
            # HTTPMode: KubeRay submits through the head's dashboard; no submitter pod.
            "submissionMode": "HTTPMode",
        },
    }


def render_children(job: dict[str, Any], spec: JobSpec, replicas: dict[str, int] | None = None):
    """All children of a HeteroTrainingJob object, in the order they are applied."""
    meta = job["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    owner = owner_reference(job)
    return [
        render_configmap(name, namespace, spec, owner),
        render_raycluster(name, namespace, spec, replicas, owner),
        render_rayjob(name, namespace, spec, owner),
    ]
