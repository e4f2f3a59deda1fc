"""kopf handlers: thin edges that parse, call a pure function and apply the result.

Run with ``python -m operators.hetero --namespace NS``
(or ``kopf run --standalone -m operators.hetero.handlers``).

- HeteroTrainingJob created, changed or seen at start-up: validate the spec (a bad one is a
  permanent error with a Warning event and ``status.phase: Failed``), render the ConfigMap,
  RayCluster and RayJob, apply them, write ``status``.
- HeteroTrainingJob deleted: delete its children (owner references would too, on a real cluster).
- Node watch event: tell each affected run's controller (``POST /v1/node-events``, with the
  bearer token of the node-events Secret), then resize the pools.
- Every ``STATUS_INTERVAL_S``: report nodes whose NotReady outlasted the grace period; when the
  RayJob has ended, write the final phase and delete the RayCluster (its GPUs go back); else read
  the controller's metrics into ``status``.

Resizing never works from a partial view: it lists Nodes and the job's pods first (a fresh,
complete view, also right after a restart, when the watch has not yet replayed every Node), and
it shrinks a pool only by naming the pods on departing nodes (``scaleStrategy.workersToDelete``).
Where the lists cannot be read, nothing is resized.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from dataclasses import replace
from typing import Any

import kopf

from operators.hetero import GROUP, PLURAL, VERSION
from operators.hetero.delivery import with_retries
from operators.hetero.kube import Kube, load_client
from operators.hetero.nodes import (
    NodeEvent,
    NodeEventKind,
    NodeState,
    node_event,
    node_state,
)
from operators.hetero.notify import fetch_metrics, send_node_event
from operators.hetero.reconcile import (
    desired_replicas,
    pod_info,
    scale_patch,
    status_from_metrics,
)
from operators.hetero.render import (
    JOB_LABEL,
    controller_url,
    render_children,
    render_raycluster,
    render_rayjob,
)
from operators.hetero.spec import JobSpec, parse_job_spec
from orchestrator.errors import SpecError, TransientError
from orchestrator.spec.node_events_token import TOKEN_FILE_ENV, read_token_file

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
    memo.lost_reported = {}  # (namespace, job) -> names of nodes reported lost by the timer
    memo.token = _token()


def _token() -> str | None:
    """The node-events token (``ORCHESTRATOR_NODE_EVENTS_TOKEN_FILE``), None where unset."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        return read_token_file(path)
    except (OSError, ValueError) as exc:
        # Without it every event would be refused; say so once, loudly, and keep resizing.
        log.error("%s=%s unreadable (%s): node events will be refused", TOKEN_FILE_ENV, path, exc)
        return None


def _fresh_nodes(kube: Kube) -> dict[str, NodeState]:
    """Every Node, read now (TransientError where the API cannot list them)."""
    now = time.time()
    states = (node_state(n, now_unix_s=now) for n in kube.list_nodes())
    return {s.name: s for s in states}


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
    meta = body["metadata"]
    if job_ended(dict(body.get("status") or {})):
        # Its RayCluster was shut down when the RayJob ended; re-applying would bring the GPUs
        # back for nothing (e.g. on an operator restart).
        _write_status(kube, body, {"message": "the job has ended; delete and re-create the "
                                              "HeteroTrainingJob to run it again"})
        return
    try:
        live = kube.get(render_raycluster(meta["name"], meta["namespace"], spec))
        if live is not None:
            # An existing cluster keeps its replicas: only the scaling path below changes them,
            # from a complete view and by naming pods.
            replicas = {g["groupName"]: int(g.get("replicas") or 0)
                        for g in live["spec"].get("workerGroupSpecs") or []}
        else:
            replicas = desired_replicas(spec, _fresh_nodes(kube).values())
        for child in render_children(dict(body), spec, replicas):
            kube.apply(child)
        if live is not None:
            _resize_pools(kube, meta["namespace"], meta["name"], spec)
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
    now = time.time()
    previous: NodeState | None = memo.node_states.get(name)
    current = None if type == "DELETED" else node_state(dict(body), now_unix_s=now)
    if (current is not None and previous is not None and not current.ready
            and previous.not_ready_since_unix_s is not None):
        # Still NotReady: the grace period runs from when it was first seen so.
        since = min(previous.not_ready_since_unix_s,
                    current.not_ready_since_unix_s or previous.not_ready_since_unix_s)
        current = replace(current, not_ready_since_unix_s=since).at(now)
    if current is None:
        memo.node_states.pop(name, None)
    else:
        memo.node_states[name] = current
    event = node_event(current, previous, now_unix_s=now)
    if event is None:
        return
    log.info("node %s: %s (%s)", name, event.event, event.reason)
    for (namespace, job_name), specs in hetero_jobs.items():
        for raw_spec in specs:
            state = current or previous
            if event.event is NodeEventKind.NOT_READY:
                memo.lost_reported.setdefault((namespace, job_name), set()).add(name)
            _handle_node_event_for_job(memo, namespace, job_name, raw_spec, event, state)


def _handle_node_event_for_job(memo, namespace, job_name, raw_spec, event, state) -> None:
    try:
        spec = parse_job_spec(raw_spec)
    except SpecError:
        return
    if state is not None and not _affected(spec, state):
        return
    _notify(memo, controller_url(job_name, namespace, spec), event)
    try:
        _resize_pools(memo.kube, namespace, job_name, spec)
    except TransientError as exc:
        log.warning("job %s/%s not resized: %s", namespace, job_name, exc)


def _notify(memo: kopf.Memo, url: str, event: NodeEvent) -> None:
    try:
        with_retries(lambda: send_node_event(url, event, token=memo.token))
    except TransientError as exc:
        log.warning("%s", exc)  # the controller's own heartbeat still catches the change
    except PermissionError as exc:
        log.error("%s", exc)


def _resize_pools(kube: Kube, namespace: str, job_name: str, spec: JobSpec) -> None:
    """Resize the job's pools from a complete view: every Node and the job's pods, read now."""
    cluster = kube.get(render_raycluster(job_name, namespace, spec))
    if cluster is None:
        return
    nodes = _fresh_nodes(kube)
    pods = [pod_info(p) for p in kube.list_pods(namespace, f"{JOB_LABEL}={job_name}")]
    wanted = desired_replicas(spec, nodes.values())
    patch = scale_patch(cluster, wanted, pods, nodes)
    if patch is not None:
        groups = {g["groupName"]: (g["replicas"], (g.get("scaleStrategy") or {}).get(
            "workersToDelete", [])) for g in patch["spec"]["workerGroupSpecs"]}
        log.info("job %s/%s: pool replicas and pods to delete -> %s", namespace, job_name, groups)
        kube.patch_custom(cluster, patch)


@kopf.timer(GROUP, VERSION, PLURAL, interval=STATUS_INTERVAL_S, initial_delay=STATUS_INTERVAL_S)
def refresh_status(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Copy the controller's phase, devices, throughput, plan and recoveries into status."""
    try:
        spec = parse_job_spec(dict(body.get("spec") or {}))
    except SpecError:
        return
    meta = body["metadata"]
    _report_expired_not_ready(memo, meta["namespace"], meta["name"], spec)
    if _finish_if_done(memo.kube, body, spec):
        return
    try:
        text = fetch_metrics(controller_url(meta["name"], meta["namespace"], spec))
    except TransientError as exc:
        log.debug("%s", exc)  # the controller is not up yet, or restarting
        return
    previous = dict(body.get("status") or {})
    _write_status(memo.kube, body, status_from_metrics(text, previous, now_iso=_now_iso()))


def _report_expired_not_ready(memo: kopf.Memo, namespace: str, job_name: str,
                              spec: JobSpec) -> None:
    """Nodes NotReady past the grace period since the last watch event: report and resize.

    A NotReady node often gets no further watch events (its kubelet is what stopped), so the
    grace period runs out here, on the job's timer.
    """
    now = time.time()
    reported = memo.lost_reported.setdefault((namespace, job_name), set())
    expired = []
    for name, state in list(memo.node_states.items()):
        current = state.at(now)
        memo.node_states[name] = current
        if not current.lost:
            reported.discard(name)
        elif name not in reported and current.is_gpu_node and _affected(spec, current):
            expired.append(current)
    for state in expired:
        reported.add(state.name)
        event = node_event(state, replace(state, lost=False), now_unix_s=now)
        if event is not None:
            log.info("node %s: %s (%s)", state.name, event.event, event.reason)
            _notify(memo, controller_url(job_name, namespace, spec), event)
    if expired:
        try:
            _resize_pools(memo.kube, namespace, job_name, spec)
        except TransientError as exc:
            log.warning("job %s/%s not resized: %s", namespace, job_name, exc)


# RayJob status.jobStatus values that end a job, and the phase each means.
FINAL_PHASE = {"SUCCEEDED": "Finished", "FAILED": "Failed", "STOPPED": "Failed"}


def job_ended(status: dict[str, Any]) -> bool:
    """Whether a job's status says its RayJob has ended (the operator wrote the final phase)."""
    return str(status.get("jobStatus")) in FINAL_PHASE


def _finish_if_done(kube: Kube, body: kopf.Body, spec: JobSpec) -> bool:
    """Once the RayJob has ended: final phase in status, RayCluster deleted. True if ended."""
    meta = body["metadata"]
    try:
        rayjob = kube.get(render_rayjob(meta["name"], meta["namespace"], spec))
    except TransientError as exc:
        log.debug("%s", exc)
        return False
    job_status = ((rayjob or {}).get("status") or {}).get("jobStatus")
    phase = FINAL_PHASE.get(str(job_status))
    if phase is None:
        return False
    try:
        deleted = kube.delete(render_raycluster(meta["name"], meta["namespace"], spec))
    except TransientError as exc:
        log.warning("RayCluster of %s/%s not deleted yet: %s", meta["namespace"], meta["name"], exc)
        return True
    previous = dict(body.get("status") or {})
    if deleted or previous.get("phase") != phase:
        _write_status(kube, body, {
            "phase": phase,
            "jobStatus": job_status,
            "message": f"RayJob ended ({job_status}); its RayCluster was shut down",
        })
    return True
