"""Fixtures for the operator tests: a Kubernetes API emulator, a kubeconfig, a fake controller.

No Kubernetes API server can run on this machine, so the end-to-end tests use ``kmock``'s
KubernetesEmulator: a real HTTP server that stores objects in memory and serves list, watch,
get, create, patch and delete as the API does (merge patches only). The operator and the
``kubernetes`` client reach it over real HTTP through an ordinary kubeconfig.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import kmock
import kubernetes
import pytest
import yaml

from orchestrator.errors import UserError
from orchestrator.telemetry.node_events import parse_node_event

RESOURCES = {
    "orchestrator.io/v1alpha1/heterotrainingjobs": dict(
        namespaced=True, kind="HeteroTrainingJob", singular="heterotrainingjob",
        subresources={"status"}),
    "ray.io/v1/rayclusters": dict(namespaced=True, kind="RayCluster", singular="raycluster"),
    "ray.io/v1/rayjobs": dict(namespaced=True, kind="RayJob", singular="rayjob"),
    "v1/configmaps": dict(namespaced=True, kind="ConfigMap", singular="configmap"),
    "v1/nodes": dict(namespaced=False, kind="Node", singular="node"),
    "v1/pods": dict(namespaced=True, kind="Pod", singular="pod"),
    "v1/events": dict(namespaced=True, kind="Event", singular="event"),
    # Discovered by kopf (never listed: the operator runs with scanning disabled).
    "v1/namespaces": dict(namespaced=False, kind="Namespace", singular="namespace"),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


@attrs.define(kw_only=True)
class VersionedEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator that also stamps uid, creationTimestamp and resourceVersion.

    A real API server sets these; kopf's patches carry a JSON-patch ``test`` of resourceVersion
    (optimistic concurrency), which fails on objects that have none, and which a real server
    rejects with 422 when the version moved on.
    """

    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        # The parsed body is mutable: stamp it in place before the emulator stores it.
        if request.resource is not None and request.action == kmock.action.CREATE:
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp",
                            dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            meta["resourceVersion"] = str(next(self._versions))
        elif request.resource is not None and request.action == kmock.action.UPDATE:
            version = str(next(self._versions))
            if isinstance(request.data, dict):
                request.data.setdefault("metadata", {})["resourceVersion"] = version
            elif isinstance(request.data, list):  # JSON patch: its test ops run first
                request.data.append(
                    {"op": "add", "path": "/metadata/resourceVersion", "value": version})
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # A real API server answers a failed `test` op with 422; kopf then waits for the
            # newer version instead of retrying as for a server error.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc


class Emulator:
    """kmock's KubernetesEmulator served on 127.0.0.1 from a background thread."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        async with VersionedEmulator() as k8s, kmock.Server(k8s) as server:
            for key, info in RESOURCES.items():
                k8s.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            while not self._stop.is_set():
                await asyncio.sleep(0.05)

    def __enter__(self) -> Emulator:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Kubernetes API emulator did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as emu:
        yield emu


@pytest.fixture
def kubeconfig(emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig pointing at the emulator, set as KUBECONFIG (kopf and the client read it)."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": emulator.url}}],
        "users": [{"name": "tester", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


@pytest.fixture
def api(emulator: Emulator) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    config.host = emulator.url
    return kubernetes.client.ApiClient(config)


class FakeController:
    """A stand-in for the run's controller: records node events, serves fixed metrics text.

    The real controller serves the same two routes (telemetry); here we only need to see what the
    operator sends and to give it metrics to copy into status. Bodies are checked with the real
    controller's parser (``orchestrator.telemetry.node_events``): one it would refuse gets a 400
    and is not recorded, so a wire-format mismatch fails the tests.
    """

    def __init__(self, metrics_text: str = "", fail_first: int = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.metrics_text = metrics_text
        self.fail_first = fail_first
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner._lock:
                    if owner.fail_first > 0:
                        owner.fail_first -= 1
                        self.send_response(503)
                        self.end_headers()
                        return
                    if self.path == "/v1/node-events":
                        try:
                            parse_node_event(json.loads(body))
                        except UserError:
                            self.send_response(400)
                            self.end_headers()
                            return
                        owner.events.append(json.loads(body))
                self.send_response(202 if self.path == "/v1/node-events" else 404)
                self.end_headers()

            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                data = owner.metrics_text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def controller() -> Iterator[FakeController]:
    fake = FakeController()
    yield fake
    fake.close()
