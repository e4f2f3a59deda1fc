"""Small builders of Kubernetes objects as the API returns them (dicts), for the operator tests."""

from __future__ import annotations

from typing import Any


def gpu_node(
    name: str,
    product: str,
    gpus: int,
    *,
    ready: str = "True",
    unschedulable: bool = False,
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **(labels or {})}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32"},
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def job(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "orchestrator.io/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def job_spec(controller_url: str | None = None, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "ghcr.io/orchestrator/orchestrator:0.1.0",
        "pools": [
            {"name": "a100", "deviceType": "A100-80", "gpusPerPod": 4,
             "minReplicas": 0, "maxReplicas": 4},
            {"name": "t4", "deviceType": "T4", "gpusPerPod": 1,
             "minReplicas": 1, "maxReplicas": 8},
        ],
        "job": {
            "name": "gpt",
            "model": {"factory": "orchestrator.models.gpt:make_gpt",
                      "shape": {"name": "gpt", "num_layers": 2, "hidden_size": 64,
                                "num_heads": 2, "sequence_length": 32, "vocab_size": 256}},
            "data": {},
            "checkpoint": {"dir": "/ckpt", "interval_steps": 10},
        },
        # Checkpoints on storage every pod shares.
        "pod": {"volumes": [{"name": "storage",
                             "persistentVolumeClaim": {"claimName": "training-data"}}],
                "volumeMounts": [{"name": "storage", "mountPath": "/ckpt"}]},
    }
    if controller_url:
        spec["controllerURL"] = controller_url
    spec.update(overrides)
    return spec
