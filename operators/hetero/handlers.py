"""kopf handlers: thin edges that parse, call a pure function and apply the result.

Run with ``python -m operators.hetero --namespace NS``
(or ``kopf run --standalone -m operators.hetero.handlers``).

- HeteroTrainingJob created, changed or seen at start-up: validate the spec (a bad one is a
  permanent error with a Warning event and ``status.phase: Failed``), render the ConfigMap,
  RayCluster and RayJob, apply them, write ``status``.
- HeteroTrainingJob deleted: delete its children (owner references would too, on a real cluster).
- Node watch event: tell each affected run's controller (``POST /v1/node-events``), then set pool
  replicas to what the usable nodes hold, within min/max.
- Every ``STATUS_INTERVAL_S``: read the controller's metrics into ``status``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import kopf

from operators.hetero import GROUP, PLURAL, VERSION
from operators.hetero.delivery import with_retries
from operators.hetero.kube import Kube, load_client
from operators.hetero.nodes import NodeState, node_event, node_state
from operators.hetero.notify import fetch_metrics, send_node_event
from operators.hetero.reconcile import desired_replicas, replica_patch, status_from_metrics
from operators.hetero.render import controller_url, render_children, render_raycluster
from operators.hetero.spec import JobSpec, parse_job_spec
from orchestrator.errors import SpecError, TransientError

STATUS_INTERVAL_S = 15.0
RETRY_DELAY_S = 5.0
log = logging.getLogger(__name__)


def _now_iso() -> str:
    return dt.datetime.now(tz=dt.UTC).isoformat(timespec="seconds")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own credentials: the pod's service account, else the kubeconfig (as load_client)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/hetero-operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # Watch the namespace given on the command line without listing namespaces or CRDs: the
    # operator's RBAC grants neither (least privilege).
    settings.scanning.disabled = True
    memo.kube = Kube(load_client())
    memo.node_states = {}


def _write_status(kube: Kube, body: Any, status: dict[str, Any]) -> None:
    meta = body["metadata"]
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HeteroTrainingJob",
           "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
    kube.patch_status(obj, status)


def _parse_or_fail(kube: Kube, body: Any) -> JobSpec:
    try:
        return parse_job_spec(dict(body.get("spec") or {}))
    except SpecError as exc:
        kopf.warn(body, reason="InvalidSpec", message=str(exc))
        _write_status(kube, body, {"phase": "Failed", "message": str(exc)})
        raise kopf.PermanentError(str(exc)) from exc


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Render the job's children from its spec and apply them; write the first status."""
    kube: Kube = memo.kube
    spec = _parse_or_fail(kube, body)
    replicas = desired_replicas(spec, memo.node_states.values()) if memo.node_states else None
    try:
        for child in render_children(dict(body), spec, replicas):
            kube.apply(child)
    except TransientError as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc
    phase = (body.get("status") or {}).get("phase")
    _write_status(kube, body, {
        "phase": phase if phase not in (None, "Failed") else "Pending",
        "message": "RayCluster and RayJob applied",
        "pools": {p.name: {"deviceType": p.deviceType, "minReplicas": p.minReplicas,
                           "maxReplicas": p.maxReplicas,
                           "replicas": (replicas or {}).get(p.name, p.initial_replicas)}
                  for p in spec.pools},
        "controllerURL": controller_url(body["metadata"]["name"],
                                        body["metadata"]["namespace"], spec),
    })


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Delete the children (a real API server would also collect them by owner reference)."""
    kube: Kube = memo.kube
    try:
        spec = parse_job_spec(dict(body.get("spec") or {}))
    except SpecError:
        return  # nothing was rendered for an invalid spec
    try:
        for child in reversed(render_children(dict(body), spec)):
            kube.delete(child)
    except TransientError as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_DELAY_S) from exc


@kopf.index(GROUP, VERSION, PLURAL)
def hetero_jobs(name: str, namespace: str, spec: kopf.Spec, **_: Any) -> dict:
    """Index of jobs by (namespace, name), for the Node handler."""
    return {(namespace, name): dict(spec)}


def _affected(spec: JobSpec, state: NodeState) -> bool:
    return state.device_type is None or any(
        p.deviceType == state.device_type or p.gpu_product == state.gpu_product for p in spec.pools
    )


@kopf.on.event("", "v1", "nodes")
def node_changed(
    type: str, body: kopf.Body, memo: kopf.Memo, hetero_jobs: kopf.Index, **_: Any
) -> None:
    """Report the Node's change to each affected controller, then resize the pools."""
    name = body["metadata"]["name"]
    previous: NodeState | None = memo.node_states.get(name)
    current = None if type == "DELETED" else node_state(dict(body))
    if current is None:
        memo.node_states.pop(name, None)
    else:
        memo.node_states[name] = current
    event = node_event(current, previous, now_unix_s=time.time())
    if event is None:
        return
    log.info("node %s: %s (%s)", name, event.event, event.reason)
    for (namespace, job_name), specs in hetero_jobs.items():
        for raw_spec in specs:
            state = current or previous
            _handle_node_event_for_job(memo, namespace, job_name, raw_spec, event, state)


def _handle_node_event_for_job(memo, namespace, job_name, raw_spec, event, state) -> None:
    try:
        spec = parse_job_spec(raw_spec)
    except SpecError:
        return
    if state is not None and not _affected(spec, state):
        return
    url = controller_url(job_name, namespace, spec)
    try:
        with_retries(lambda: send_node_event(url, event))
    except TransientError as exc:
        log.warning("%s", exc)  # the controller's own heartbeat still catches the change
    _resize_pools(memo.kube, namespace, job_name, spec, memo.node_states.values())


def _resize_pools(kube: Kube, namespace: str, job_name: str, spec: JobSpec, nodes) -> None:
    wanted = desired_replicas(spec, nodes)
    cluster = kube.get(render_raycluster(job_name, namespace, spec))
    if cluster is None:
        return
    patch = replica_patch(cluster, wanted)
    if patch is not None:
        log.info("job %s/%s: pool replicas -> %s", namespace, job_name, wanted)
        kube.patch_custom(cluster, patch)


@kopf.timer(GROUP, VERSION, PLURAL, interval=STATUS_INTERVAL_S, initial_delay=STATUS_INTERVAL_S)
def refresh_status(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Copy the controller's phase, devices, throughput, plan and recoveries into status."""
    try:
        spec = parse_job_spec(dict(body.get("spec") or {}))
    except SpecError:
        return
    meta = body["metadata"]
    try:
        text = fetch_metrics(controller_url(meta["name"], meta["namespace"], spec))
    except TransientError as exc:
        log.debug("%s", exc)  # the controller is not up yet, or restarting
        return
    previous = dict(body.get("status") or {})
    _write_status(memo.kube, body, status_from_metrics(text, previous, now_iso=_now_iso()))
