"""Cluster description: node groups of one device type each, and the network between nodes.

Users write a :class:`ClusterSpec` (YAML/JSON, see docs/formats.md). :meth:`ClusterSpec.resolve`
checks it against the device catalog and returns a :class:`Cluster`, the frozen value the cost model
and planner read. Nodes are named ``<group>-<index>``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from orchestrator.errors import SpecError
from orchestrator.spec.devices import DeviceCatalog, DeviceType

# 100 Gb/s Ethernet, the common cloud default between GPU nodes (e.g. AWS p4d has 4x100 Gb/s EFA;
# a single 100 Gb/s NIC is the conservative figure): 12.5 GB/s.
DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S = 12.5e9
MAX_NODES_PER_GROUP = 4096
MAX_DEVICES_PER_NODE = 64


class NodeGroupSpec(BaseModel):
    """``num_nodes`` identical nodes, each with ``devices_per_node`` devices of one type."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    device_type: str = Field(min_length=1)
    # Upper bounds: far above any cluster the planner is meant for, low enough that a typo
    # (1e9 nodes) is refused at once instead of taking minutes or all memory.
    num_nodes: PositiveInt = Field(le=MAX_NODES_PER_GROUP)
    devices_per_node: PositiveInt = Field(le=MAX_DEVICES_PER_NODE)
    intra_node_bandwidth_bytes_per_s: PositiveFloat | None = None
    # The node's network bandwidth, shared by its devices; a link between two nodes runs at the
    # slower of the two nodes' values.
    inter_node_bandwidth_bytes_per_s: PositiveFloat | None = None


class NetworkSpec(BaseModel):
    """Cluster-wide network defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inter_node_bandwidth_bytes_per_s: PositiveFloat = DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S


class ClusterSpec(BaseModel):
    """What a user writes to describe a cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_groups: list[NodeGroupSpec] = Field(min_length=1)
    network: NetworkSpec = NetworkSpec()
    device_types: list[DeviceType] = []

    @model_validator(mode="after")
    def _unique_group_names(self) -> ClusterSpec:
        counts = Counter(g.name for g in self.node_groups)
        dupes = sorted(n for n, c in counts.items() if c > 1)
        if dupes:
            raise ValueError(f"node group names must be unique; repeated: {', '.join(dupes)}")
        counts = Counter(d.name for d in self.device_types)
        dupes = sorted(n for n, c in counts.items() if c > 1)
        if dupes:
            raise ValueError(f"device type names must be unique; repeated: {', '.join(dupes)}")
        return self

    def catalog(self) -> DeviceCatalog:
        """The built-in catalog with this file's ``device_types`` added or overriding."""
        return DeviceCatalog.builtin(self.device_types)

    def resolve(self) -> Cluster:
        """Check device types against the catalog and build the frozen :class:`Cluster`."""
        catalog = self.catalog()
        nodes: list[Node] = []
        for index, group in enumerate(self.node_groups):
            if group.device_type not in catalog:
                raise SpecError(
                    f"unknown device type {group.device_type!r}",
                    field=f"node_groups[{index}].device_type",
                    fix=f"use one of {', '.join(catalog.names())} "
                    "(`orchestrator devices` lists them) or define it under device_types",
                )
            device = catalog[group.device_type]
            intra = (
                group.intra_node_bandwidth_bytes_per_s or device.intra_node_bandwidth_bytes_per_s
            )
            inter = (
                group.inter_node_bandwidth_bytes_per_s
                or self.network.inter_node_bandwidth_bytes_per_s
            )
            for i in range(group.num_nodes):
                nodes.append(
                    Node(
                        name=f"{group.name}-{i}",
                        group=group.name,
                        device_type=device,
                        num_devices=group.devices_per_node,
                        intra_node_bandwidth_bytes_per_s=intra,
                        inter_node_bandwidth_bytes_per_s=inter,
                    )
                )
        return Cluster(nodes=tuple(nodes))


@dataclass(frozen=True)
class Node:
    """One machine: ``num_devices`` devices of ``device_type``."""

    name: str
    group: str
    device_type: DeviceType
    num_devices: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float

    @classmethod
    def from_device(cls, name: str, device: DeviceType, num_devices: int) -> Node:
        """A discovered node (its own group): the device type's typical intra-node bandwidth and
        the default network, where nothing more is known about its links."""
        return cls(
            name=name,
            group=device.name,
            device_type=device,
            num_devices=num_devices,
            intra_node_bandwidth_bytes_per_s=device.intra_node_bandwidth_bytes_per_s,
            inter_node_bandwidth_bytes_per_s=DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S,
        )

    @property
    def network_share_bytes_per_s(self) -> float:
        """One device's share of the node's network when all devices talk at once."""
        return self.inter_node_bandwidth_bytes_per_s / self.num_devices


@dataclass(frozen=True)
class Cluster:
    """The resolved cluster the cost model and planner read. Nodes in a fixed order."""

    nodes: tuple[Node, ...]

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def max_devices_per_node(self) -> dict[str, int]:
        """Device type -> the most devices of that type on one node (tensor parallel's bound)."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.device_type.name] = max(out.get(n.device_type.name, 0), n.num_devices)
        return out

    @cached_property
    def device_types(self) -> dict[str, DeviceType]:
        """Device types present, by name, in order of first appearance."""
        out: dict[str, DeviceType] = {}
        for n in self.nodes:
            out.setdefault(n.device_type.name, n.device_type)
        return out

    @cached_property
    def device_counts(self) -> dict[str, int]:
        """Number of devices of each type present."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.device_type.name] = counts.get(n.device_type.name, 0) + n.num_devices
        return counts

    @property
    def num_devices(self) -> int:
        return sum(n.num_devices for n in self.nodes)

    def nodes_of_type(self, device_type: str) -> list[Node]:
        return [n for n in self.nodes if n.device_type.name == device_type]
