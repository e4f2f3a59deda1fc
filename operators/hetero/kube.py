"""Writes to the Kubernetes API, through the official ``kubernetes`` client.

``apply`` creates an object or, where it exists, merge-patches it to the rendered state. API
failures that a retry may fix (5xx, 429, connection errors) become
:class:`~orchestrator.errors.TransientError`; the handlers turn that into a kopf retry.
"""

from __future__ import annotations

import os
from typing import Any

import kubernetes
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from orchestrator.errors import TransientError

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


def load_client() -> ApiClient:
    """An API client configured in-cluster (service account), else from the kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # Read KUBECONFIG now: the client library reads it once, when it is imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return ApiClient()


def _plural(kind: str) -> str:
    return kind.lower() + "s"


class Kube:
    """The few calls the operator makes, on one API client."""

    def __init__(self, client: ApiClient) -> None:
        self.core = CoreV1Api(client)
        self.custom = CustomObjectsApi(client)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise TransientError(f"{what}: API answered {exc.status} {exc.reason}") from exc
            raise
        except OSError as exc:  # urllib3 connection errors derive from OSError
            raise TransientError(f"{what}: {exc}") from exc

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The live object with the same kind, namespace and name, or None."""
        meta = obj["metadata"]
        try:
            if obj["kind"] == "ConfigMap":
                found = self._call("get", self.core.read_namespaced_config_map,
                                   meta["name"], meta["namespace"])
                return dict(self.core.api_client.sanitize_for_serialization(found))
            group, version = obj["apiVersion"].split("/")
            return dict(self._call("get", self.custom.get_namespaced_custom_object, group, version,
                                   meta["namespace"], _plural(obj["kind"]), meta["name"]))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any]) -> str:
        """Create ``obj``, or merge-patch the live one to it; return "created" or "patched"."""
        meta = obj["metadata"]
        what = f"{obj['kind']} {meta['namespace']}/{meta['name']}"
        exists = self.get(obj) is not None
        if obj["kind"] == "ConfigMap":
            if exists:
                self._call(what, self.core.patch_namespaced_config_map,
                           meta["name"], meta["namespace"], obj)
            else:
                self._call(what, self.core.create_namespaced_config_map, meta["namespace"], obj)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = _plural(obj["kind"])
            if exists:
                self._call(what, self.custom.patch_namespaced_custom_object, group, version,
                           meta["namespace"], plural, meta["name"], obj)
            else:
                self._call(what, self.custom.create_namespaced_custom_object, group, version,
                           meta["namespace"], plural, obj)
        return "patched" if exists else "created"

    def patch_custom(self, obj: dict[str, Any], patch: dict[str, Any]) -> None:
        """Merge-patch a custom object (``obj`` names it)."""
        meta = obj["metadata"]
        group, version = obj["apiVersion"].split("/")
        what = f"patch {obj['kind']} {meta['name']}"
        self._call(what, self.custom.patch_namespaced_custom_object, group, version,
                   meta["namespace"], _plural(obj["kind"]), meta["name"], patch)

    def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Merge-patch the status subresource of a custom object (``obj`` names it)."""
        meta = obj["metadata"]
        group, version = obj["apiVersion"].split("/")
        what = f"patch status of {obj['kind']} {meta['name']}"
        self._call(what, self.custom.patch_namespaced_custom_object_status, group, version,
                   meta["namespace"], _plural(obj["kind"]), meta["name"], {"status": status})

    def delete(self, obj: dict[str, Any]) -> bool:
        """Delete ``obj`` if it exists; return whether it did."""
        meta = obj["metadata"]
        try:
            if obj["kind"] == "ConfigMap":
                self._call("delete", self.core.delete_namespaced_config_map,
                           meta["name"], meta["namespace"])
            else:
                group, version = obj["apiVersion"].split("/")
                self._call("delete", self.custom.delete_namespaced_custom_object, group, version,
                           meta["namespace"], _plural(obj["kind"]), meta["name"])
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node, as plain dicts."""
        nodes = self._call("list nodes", self.core.list_node)
        return [self.core.api_client.sanitize_for_serialization(n) for n in nodes.items]

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Pods in ``namespace`` matching ``label_selector``, as plain dicts."""
        pods = self._call("list pods", self.core.list_namespaced_pod, namespace,
                          label_selector=label_selector)
        return [self.core.api_client.sanitize_for_serialization(p) for p in pods.items]

    def list_jobs(self, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        """Every HeteroTrainingJob in every namespace the client may read."""
        found = self._call("list jobs", self.custom.list_cluster_custom_object,
                           group, version, plural)
        return list(found.get("items", []))
