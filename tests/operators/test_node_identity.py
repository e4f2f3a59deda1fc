"""Node identity on a real Ray node: the env the operator renders becomes a Ray node label.

The operator (and the chart) give every Ray container K8S_NODE_NAME from the downward API and
RAY_OVERRIDE_LABELS naming it; this starts a real Ray node in a subprocess with that env, after
Kubernetes' $(VAR) expansion as the kubelet applies it, and checks that the node carries
``orchestrator.io/node-name`` and that a node event naming the Kubernetes Node reaches the
controller (telemetry server, with its token) and removes exactly that Ray node from the
controller's snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from k8s_objects import job, job_spec
from prometheus_client import CollectorRegistry
from test_operator_restart import expand

from operators.hetero.nodes import NodeEvent, NodeEventKind
from operators.hetero.notify import send_node_event
from operators.hetero.render import NODE_NAME_LABEL, render_children
from operators.hetero.spec import parse_job_spec
from orchestrator.runtime.elastic.probe import RayClusterProbe
from orchestrator.telemetry import TelemetryServer
from orchestrator.telemetry.auth import TokenCheck

NODE = "gke-train-a100-pool-7f3k"
RAY_NODE_SCRIPT = """
import json, ray
ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, log_to_driver=False,
         labels={"orchestrator.io/device-type": "A100-80"})
print("ROWS=" + json.dumps(ray.nodes()))
ray.shutdown()
"""


def rendered_worker_env(node_name: str) -> dict[str, str]:
    body = job("gpt", job_spec())
    spec = parse_job_spec(body["spec"])
    _, cluster, _ = render_children(body, spec)
    container = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for var in container["env"]:
        field = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        env[var["name"]] = node_name if field == "spec.nodeName" else expand(var["value"], env)
    return env


@pytest.mark.slow
def test_a_real_ray_node_carries_its_kubernetes_node_name() -> None:
    pod_env = rendered_worker_env(NODE)
    assert pod_env["K8S_NODE_NAME"] == NODE
    # A short folder of its own: Ray's socket paths under pytest's deep tmp_path exceed the
    # 107-byte AF_UNIX limit, and a private root keeps other clusters' address files apart.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rni-", dir="/tmp"))
    env = {**os.environ, **pod_env, "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp)}
    result = subprocess.run([sys.executable, "-c", RAY_NODE_SCRIPT], env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    shutil.rmtree(ray_tmp, ignore_errors=True)
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("ROWS=")]
    rows = json.loads(line.removeprefix("ROWS="))
    (row,) = rows
    assert row["Labels"][NODE_NAME_LABEL] == NODE

    # The controller side: the event names the Kubernetes Node; the probe finds the Ray node.
    probe = RayClusterProbe(rows=lambda: rows, draining=lambda: {})
    assert [n.node_id for n in probe.snapshot().nodes] == [row["NodeID"]]
    server = TelemetryServer(
        CollectorRegistry(), port=0, node_events_auth=TokenCheck(required=True, token="t"),
        node_event_handler=lambda e: probe.post_node_event(e.node, e.event, e.deadline_unix_s))
    with server:
        event = NodeEvent(NODE, NodeEventKind.REMOVED, "A100-80", None, "Node deleted")
        assert send_node_event(server.url, event, token="t") == 202
    assert probe.snapshot().nodes == ()
