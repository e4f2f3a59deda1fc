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
from orchestrator.spec.labels import (
    ACCELERATOR_LABEL,
    DEVICE_TYPE_LABEL,
    JOB_LABEL,
    NODE_NAME_LABEL,
    POOL_LABEL,
)

JOB_FILE_DIR = "/etc/orchestrator"
JOB_FILE = f"{JOB_FILE_DIR}/job.yaml"
METRICS_PORT_NAME = "orch-metrics"
# The Kubernetes Node a Ray pod runs on, as a Ray node label: the downward API puts spec.nodeName
# into K8S_NODE_NAME, and Ray reads extra node labels (JSON) from RAY_OVERRIDE_LABELS at
# `ray start`; Kubernetes expands $(K8S_NODE_NAME) there because it is defined first.
NODE_NAME_ENV = "K8S_NODE_NAME"
RAY_LABELS_ENV = "RAY_OVERRIDE_LABELS"
TOKEN_DIR = "/var/run/orchestrator/node-events"
TOKEN_FILE_ENV = "ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE"
# Cluster autoscaler must not evict a Ray pod to pack nodes: the operator moves work off first.
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
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


def _volumes(name: str, spec: JobSpec, head: bool = False) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "job", "configMap": {"name": configmap_name(name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": spec.pod.tmpSize}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        *spec.pod.volumes,
    ]
    if head and spec.nodeEventsTokenSecret:
        volumes.append({"name": "node-events-token",
                        "secret": {"secretName": spec.nodeEventsTokenSecret}})
    return volumes


def _volume_mounts(spec: JobSpec, head: bool = False) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "job", "mountPath": JOB_FILE_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
        *spec.pod.volumeMounts,
    ]
    if head and spec.nodeEventsTokenSecret:
        mounts.append({"name": "node-events-token", "mountPath": TOKEN_DIR, "readOnly": True})
    return mounts


def ray_env(spec: JobSpec, head: bool = False) -> list[dict[str, Any]]:
    """Environment of a Ray container: HOME, the Node name as a Ray label, the token file."""
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp/home"},
        {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": RAY_LABELS_ENV, "value": f'{{"{NODE_NAME_LABEL}": "$({NODE_NAME_ENV})"}}'},
        *spec.pod.env,
    ]
    if head and spec.nodeEventsTokenSecret:
        env.append({"name": TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/token"})
    return env


def _container(
    name: str, spec: JobSpec, cpu: str, memory: str, gpus: int, head: bool = False
) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = gpus
    container: dict[str, Any] = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.imagePullPolicy,
        "resources": {
            "requests": {"cpu": cpu, "memory": memory, "ephemeral-storage": spec.pod.tmpSize},
            "limits": limits,
        },
        "securityContext": _security_context(),
        "volumeMounts": _volume_mounts(spec, head),
        "env": ray_env(spec, head),
    }
    if spec.pod.envFrom:
        container["envFrom"] = list(spec.pod.envFrom)
    return container


def _pod_metadata(name: str, spec: JobSpec, extra: dict[str, str] | None = None) -> dict:
    return {
        "labels": {JOB_LABEL: name, **(extra or {}), **spec.pod.labels},
        "annotations": {SAFE_TO_EVICT: "false", **spec.pod.annotations},
    }


def _pod_settings(spec: JobSpec) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": _pod_security_context(),
    }
    pod = spec.pod
    if pod.serviceAccountName:
        settings["serviceAccountName"] = pod.serviceAccountName
    if pod.imagePullSecrets:
        settings["imagePullSecrets"] = list(pod.imagePullSecrets)
    if pod.affinity:
        settings["affinity"] = dict(pod.affinity)
    if pod.priorityClassName:
        settings["priorityClassName"] = pod.priorityClassName
    return settings


def _head_group(name: str, spec: JobSpec) -> dict[str, Any]:
    container = _container("ray-head", spec, spec.head.cpu, spec.head.memory, 0, head=True)
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
            "metadata": _pod_metadata(name, spec),
            "spec": {
                **_pod_settings(spec),
                **({"tolerations": list(spec.pod.tolerations)} if spec.pod.tolerations else {}),
                "containers": [container],
                "volumes": _volumes(name, spec, head=True),
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
            "metadata": _pod_metadata(name, spec, {POOL_LABEL: pool.name}),
            "spec": {
                **_pod_settings(spec),
                "nodeSelector": node_selector,
                "tolerations": [*spec.pod.tolerations, *pool.tolerations],
                "containers": [container],
                "volumes": _volumes(name, spec),
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
