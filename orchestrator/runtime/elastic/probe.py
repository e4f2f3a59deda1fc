"""The controller's :class:`~orchestrator.control.ports.ClusterProbe` on a live Ray cluster.

A snapshot is built from three sources, read at every :meth:`RayClusterProbe.snapshot` (the
controller calls it about once a second):

- ``ray.nodes()``: alive nodes with their labels and resources. A node's device type comes from
  the project's ``orchestrator.io/device-type`` label, else Ray's ``ray.io/accelerator-type``
  (the runtime's discovery rules, so plans place exactly as the worker group does); its device
  count is its ``GPU`` resource (its CPUs on a node without GPUs); its emulated speed rides along in
  its labels. Nodes whose type the device catalog does not know are left out (logged once).
- Ray's draining nodes (preemption notices with deadlines, in ms since the epoch; 0: none).
- Node events POSTed to the controller's ``/v1/node-events`` (the Kubernetes operator sees a node
  go NotReady or get a spot-termination taint before Ray's heartbeat does): a lost / not-ready /
  removed node leaves the snapshot at once; a preemption / spot-termination / cordon notice makes
  it draining with the posted deadline. Events name a node by Ray node id (or a unique prefix of at
  least 8 characters), host name, or the value of an ``orchestrator.io/node-name`` or
  ``kubernetes.io/hostname`` label. A posted event also wakes the controller
  (:meth:`RayClusterProbe.take_news`): it polls at its next step boundary instead of at the next
  poll period.

``node_selector`` restricts the run to nodes carrying the given labels (a pool of the cluster).
Deadlines are wall-clock seconds, the timebase of :class:`~orchestrator.control.ports.SystemClock`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import SpecError, TransientError
from orchestrator.runtime.discovery import nodes_from_rows, one_backend
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.labels import NODE_NAME_LABELS
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

log = logging.getLogger(__name__)

LOST_EVENTS = frozenset({"node_lost", "not_ready", "removed"})
DRAIN_EVENTS = frozenset({"preemption_notice", "spot_termination", "cordoned"})

# How often Ray's draining nodes are looked at between snapshots (``watch_drains``).
DRAIN_WATCH_INTERVAL_S = 0.1

Rows = Callable[[], list[dict[str, Any]]]
Draining = Callable[[], Mapping[str, int]]


@dataclass(frozen=True)
class PostedEvent:
    """A node event from outside Ray, as the probe keeps it."""

    node: str  # as posted: node id, id prefix, host name or name label
    event: str
    deadline_s: float | None


def ray_rows() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())


def ray_draining() -> Mapping[str, int]:
    """Ray's draining nodes: node id hex -> deadline in ms since the epoch (0: no deadline)."""
    from ray._private import state  # private API, checked on Ray 2.60 (platform facts)

    return dict(state.state.get_draining_nodes())


class RayClusterProbe:
    """Snapshots of the Ray cluster this process is connected to (see the module docstring)."""

    def __init__(
        self,
        *,
        catalog: DeviceCatalog | None = None,
        node_selector: Mapping[str, str] | None = None,
        rows: Rows = ray_rows,
        draining: Draining = ray_draining,
    ) -> None:
        self.catalog = catalog or DeviceCatalog.builtin()
        self.node_selector = dict(node_selector or {})
        self._rows = rows
        self._draining = draining
        self._sequence = 0
        self._posted: dict[str, PostedEvent] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        # Told (node id, wall time posted) of each posted loss at once, beside the snapshots:
        # the worker group abandons a step in flight on that node (docs/controller.md).
        self.on_lost: Callable[[str, float], None] | None = None
        # Told (node id, deadline, wall time posted) of each posted preemption notice at once:
        # a step in flight there that would outlast the deadline is abandoned.
        self.on_drain: Callable[[str, float | None, float], None] | None = None
        # Set by every posted event, taken by the controller at its next step boundary
        # (``take_news``): it polls then rather than at the next poll period, so a drain is
        # acted on within the step in flight.
        self._news = threading.Event()
        self.last_posted: tuple[str, str, float] | None = None  # (node, event, wall time)

    def post_node_event(self, node: str, event: str, deadline_s: float | None = None) -> None:
        """Merge an event posted from outside Ray into the following snapshots (thread-safe).

        A ``node_joined`` event clears what was posted for that node before.
        """
        posted_at_s = time.time()
        with self._lock:
            if event in LOST_EVENTS or event in DRAIN_EVENTS:
                self._posted[node] = PostedEvent(node, event, deadline_s)
            else:
                self._posted.pop(node, None)
            self.last_posted = (node, event, posted_at_s)
        self._news.set()
        lost, drain = self.on_lost, self.on_drain
        lost = lost if event in LOST_EVENTS else None
        drain = drain if event in DRAIN_EVENTS else None
        if lost is None and drain is None:
            return
        try:
            node_id = _resolve(node, _names_by_node_id(self._rows()))
        except Exception as exc:  # the GCS busy: the next snapshot still has the event
            log.warning("node event for %s not resolved at once: %s", node, exc)
            return
        if node_id is None:
            return
        if lost is not None:
            lost(node_id, posted_at_s)
        if drain is not None:
            drain(node_id, deadline_s, posted_at_s)

    def watch_drains(self, interval_s: float = DRAIN_WATCH_INTERVAL_S) -> threading.Event:
        """Look at Ray's draining nodes every ``interval_s`` on a daemon thread, and treat a
        new one (or a new deadline) like a posted preemption notice: ``on_drain`` is told at
        once and the controller polls at its next step boundary. Ray pushes no event for a
        drain (its GCS publishes none a client can subscribe to outside its own private
        pubsub), so a poll this cheap (one GCS call) stands in for it. Set the returned event
        to stop the thread."""
        stop = threading.Event()

        def watch() -> None:
            seen: dict[str, int] = {}
            while not stop.wait(interval_s):
                try:
                    now = dict(self._draining())
                except Exception:  # the GCS busy or gone: the next look, or the next poll
                    continue
                fresh = {n: d for n, d in now.items() if seen.get(n) != d}
                seen = now
                if not fresh:
                    continue
                self._news.set()
                drain = self.on_drain
                for node_id, deadline_ms in sorted(fresh.items()):
                    if drain is not None:
                        drain(node_id, deadline_ms / 1000.0 if deadline_ms else None, time.time())

        threading.Thread(target=watch, name="ray-drain-watch", daemon=True).start()
        return stop

    def take_news(self) -> bool:
        """True once after any event was posted (the controller then polls at once)."""
        if not self._news.is_set():
            return False
        self._news.clear()
        return True

    def snapshot(self) -> ClusterSnapshot:
        try:
            rows = self._rows()
            raw_draining = self._draining()
        except Exception as exc:  # the GCS restarting, a timeout: try again at the next poll
            raise TransientError(f"cannot read the Ray cluster: {exc}") from exc
        nodes = self._nodes(rows)
        draining: dict[str, float | None] = {
            node_id: (deadline_ms / 1000.0 if deadline_ms else None)
            for node_id, deadline_ms in raw_draining.items()
            if any(n.node_id == node_id for n in nodes)
        }
        nodes, draining = self._merge_posted(rows, nodes, draining)
        self._sequence += 1
        return ClusterSnapshot.of(self._sequence, nodes, draining)

    def _nodes(self, rows: list[dict[str, Any]]) -> list[NodeInfo]:
        selected = [r for r in rows if self._selected(r.get("Labels") or {})]
        try:
            found = nodes_from_rows(selected)
        except SpecError as exc:  # a bad emulation label: leave the probe usable, say why
            raise TransientError(str(exc)) from exc
        found, mixed = one_backend(found)  # never CPU and GPU ranks in one plan
        if mixed is not None:
            self._warn_once("mixed-backends", mixed)
        out = []
        for n in found:
            if n.device_type not in self.catalog:
                self._warn_once(
                    n.node_id,
                    f"node {n.node_id[:12]} has unknown device type "
                    f"{n.device_type!r}; it is not used",
                )
                continue
            out.append(NodeInfo(n.node_id, n.device_type, n.num_devices, dict(n.labels)))
        return out

    def _selected(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def _merge_posted(
        self,
        rows: Iterable[dict[str, Any]],
        nodes: list[NodeInfo],
        draining: dict[str, float | None],
    ) -> tuple[list[NodeInfo], dict[str, float | None]]:
        with self._lock:
            posted = list(self._posted.values())
        if not posted:
            return nodes, draining
        by_name = _names_by_node_id(rows)
        lost: set[str] = set()
        for ev in posted:
            node_id = _resolve(ev.node, by_name)
            if node_id is None:
                self._warn_once(f"event:{ev.node}", f"node event for unknown node {ev.node!r}")
                continue
            if ev.event in LOST_EVENTS:
                lost.add(node_id)
            elif node_id not in draining or draining[node_id] is None:
                draining[node_id] = ev.deadline_s
        kept = [n for n in nodes if n.node_id not in lost]
        ids = {n.node_id for n in kept}
        return kept, {k: v for k, v in draining.items() if k in ids}

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def _names_by_node_id(rows: Iterable[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in rows:
        node_id = str(row.get("NodeID", ""))
        labels = row.get("Labels") or {}
        names = {str(row.get("NodeManagerHostname", "")), str(row.get("NodeName", ""))}
        names |= {str(labels[k]) for k in NODE_NAME_LABELS if labels.get(k)}
        out[node_id] = {n for n in names if n}
    return out


def _resolve(name: str, by_name: Mapping[str, set[str]]) -> str | None:
    """The node id an event names: the id itself, a unique id prefix, or a unique name."""
    if name in by_name:
        return name
    if len(name) >= 8:
        prefixed = [i for i in by_name if i.startswith(name)]
        if len(prefixed) == 1:
            return prefixed[0]
    named = [i for i, names in by_name.items() if name in names]
    return named[0] if len(named) == 1 else None


def resolve_node(name: str, rows: Rows = ray_rows) -> str:
    """The id of the alive node ``name`` names (as node events name nodes); a name that fits no
    alive node, or several, is refused naming the fix."""
    alive = [row for row in rows() if row.get("Alive", False)]
    node_id = _resolve(name, _names_by_node_id(alive))
    if node_id is None:
        raise SpecError(
            f"{name!r} names no single alive Ray node",
            field="node",
            fix="name a node by its Ray node id (or a unique prefix of 8 or more characters), "
            "host name or orchestrator.io/node-name label",
        )
    return node_id
