"""What the controller knows of the cluster at one moment, and how two moments differ.

A :class:`ClusterSnapshot` lists the alive nodes (device type, device count, labels) and the
draining ones (preemption notices with deadlines), with a sequence number that grows with every
probe. :func:`diff_snapshots` says which nodes joined, were lost, started draining or changed.
:meth:`ClusterSnapshot.to_cluster` turns it into the :class:`~orchestrator.spec.cluster.Cluster`
the planner reads. The Ray probe builds snapshots from ``ray.nodes()``; tests build them by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.errors import SpecError
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.labels import DEVICE_TYPE_LABEL, EMULATED_SPEED_LABEL


@dataclass(frozen=True, eq=True)
class NodeInfo:
    """One alive node: ``num_devices`` accelerators of ``device_type`` (a catalog name)."""

    node_id: str
    device_type: str
    num_devices: int
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def emulated_speed(self) -> float | None:
        """Relative speed from the emulation label, ``None`` on a node that is not emulated."""
        raw = self.labels.get(EMULATED_SPEED_LABEL)
        return float(raw) if raw else None


@dataclass(frozen=True)
class ClusterSnapshot:
    """Alive nodes (sorted by id) and draining ones (node id -> deadline, ``None`` if unknown).

    Deadlines are in the timebase of the controller's :class:`~orchestrator.control.ports.Clock`.
    """

    sequence: int
    nodes: tuple[NodeInfo, ...]
    draining: Mapping[str, float | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        sequence: int,
        nodes: Iterable[NodeInfo],
        draining: Mapping[str, float | None] | None = None,
    ) -> ClusterSnapshot:
        """Build a snapshot with nodes in id order (so equal clusters compare equal)."""
        return cls(sequence, tuple(sorted(nodes, key=lambda n: n.node_id)), dict(draining or {}))

    @property
    def node_ids(self) -> frozenset[str]:
        return frozenset(n.node_id for n in self.nodes)

    def node(self, node_id: str) -> NodeInfo | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def devices_by_type(self, *, draining: bool = False) -> dict[str, int]:
        """Devices per type among the non-draining nodes (``draining=True``: among draining)."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            if (n.node_id in self.draining) == draining:
                counts[n.device_type] = counts.get(n.device_type, 0) + n.num_devices
        return dict(sorted(counts.items()))

    @property
    def num_devices(self) -> int:
        """Devices on alive, non-draining nodes."""
        return sum(self.devices_by_type().values())

    @functools.cached_property
    def emulated(self) -> bool:
        """True when any node carries the emulation label."""
        return any(n.emulated_speed is not None for n in self.nodes)

    def usable(self, exclude: Iterable[str] = ()) -> ClusterSnapshot:
        """The nodes a new plan may use: alive, not draining, not in ``exclude``."""
        skip = set(exclude) | set(self.draining)
        nodes = tuple(n for n in self.nodes if n.node_id not in skip)
        return ClusterSnapshot(self.sequence, nodes, {})

    def to_cluster(self, catalog: DeviceCatalog | None = None) -> Cluster:
        """The planner's :class:`Cluster`: one node per alive node, named by node id, grouped by
        device type; bandwidths from the catalog and the cluster default."""
        catalog = catalog or DeviceCatalog.builtin()
        nodes = []
        for n in self.nodes:
            if n.device_type not in catalog:
                raise SpecError(
                    f"node {n.node_id} has device type {n.device_type!r}, not in the catalog",
                    field=f"labels.{DEVICE_TYPE_LABEL}",
                    fix=f"label the node with one of {', '.join(catalog.names())}",
                )
            nodes.append(Node.from_device(n.node_id, catalog[n.device_type], n.num_devices))
        return Cluster(nodes=tuple(nodes))


@dataclass(frozen=True)
class SnapshotDiff:
    """How ``new`` differs from ``old``: each field sorted by node id."""

    joined: tuple[NodeInfo, ...] = ()
    lost: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()  # newly draining (a notice the old snapshot did not have)
    changed: tuple[NodeInfo, ...] = ()  # same id, different device type, count or labels

    @property
    def empty(self) -> bool:
        return not (self.joined or self.lost or self.draining or self.changed)


def diff_snapshots(old: ClusterSnapshot | None, new: ClusterSnapshot) -> SnapshotDiff:
    """Nodes joined, lost, newly draining or changed between two snapshots (``old`` may be None)."""
    if old is new:  # a probe that saw no change may hand back the same snapshot
        return SnapshotDiff()
    old_nodes = {n.node_id: n for n in old.nodes} if old else {}
    new_nodes = {n.node_id: n for n in new.nodes}
    old_draining = set(old.draining) if old else set()
    return SnapshotDiff(
        joined=tuple(new_nodes[i] for i in sorted(new_nodes.keys() - old_nodes.keys())),
        lost=tuple(sorted(old_nodes.keys() - new_nodes.keys())),
        draining=tuple(sorted(i for i in new.draining if i not in old_draining and i in new_nodes)),
        changed=tuple(
            new_nodes[i]
            for i in sorted(new_nodes.keys() & old_nodes.keys())
            if new_nodes[i] != old_nodes[i]
        ),
    )
