"""What the Ray cluster holds: device types, device counts and emulated speeds, from ray.nodes().

:func:`nodes_from_rows` is pure (it reads the rows ``ray.nodes()`` returns), so its rules are tested
without Ray; :func:`discover_nodes` calls Ray. :func:`cluster_from_nodes` turns the live nodes into
the :class:`~orchestrator.spec.cluster.Cluster` the planner and the cost model read.
:func:`pin_by_node_id` turns the node names a plan file may pin (``<device type>-<index>``) into
the Ray node ids the controller works with, once, at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import SpecError, UserError
from orchestrator.spec.cluster import Cluster, Node
from orchestrator.spec.devices import DeviceCatalog
from orchestrator.spec.labels import CPU_DEVICE_TYPE, DEVICE_TYPE_LABEL, device_type_from_labels
from orchestrator.spec.plan import Plan
from orchestrator.worker.emulation import parse_speed


@dataclass(frozen=True)
class RayNode:
    """One live Ray node as the runtime sees it.

    ``type_label`` is the label key that named the device type (``None`` for an unlabelled CPU
    node); placement selects nodes by that key. ``uses_gpus`` says whether the node's devices are
    its ``GPU`` resources (else its CPUs). ``name`` is ``<device type>-<index>``, stable for a given
    set of nodes, and is what plans write in ``stages[].node``.
    """

    node_id: str
    address: str
    name: str
    device_type: str
    type_label: str | None
    num_devices: int
    uses_gpus: bool
    emulated_speed: float | None
    labels: Mapping[str, str]

    @property
    def emulated(self) -> bool:
        return self.emulated_speed is not None


def _device_type_of(labels: Mapping[str, str], has_gpus: bool) -> tuple[str, str | None]:
    labelled = device_type_from_labels(labels)
    if labelled is not None:
        return labelled
    if has_gpus:
        return "", None  # GPUs of unknown type: reported by cluster_from_nodes
    return CPU_DEVICE_TYPE, None


def nodes_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[RayNode]:
    """Live nodes with at least one device, sorted by (device type, node id), named in order."""
    found: list[tuple[str, str | None, Mapping[str, Any], Mapping[str, str]]] = []
    for row in rows:
        if not row.get("Alive", False):
            continue
        resources = row.get("Resources", {}) or {}
        labels = dict(row.get("Labels", {}) or {})
        has_gpus = float(resources.get("GPU", 0)) >= 1
        devices = int(resources.get("GPU", 0)) if has_gpus else int(resources.get("CPU", 0))
        if devices < 1:
            continue  # e.g. a head node started with num_cpus=0 to keep work off it
        device_type, key = _device_type_of(labels, has_gpus)
        found.append((device_type, key, row, labels))
    found.sort(key=lambda item: (item[0], str(item[2]["NodeID"])))
    nodes: list[RayNode] = []
    index_by_type: dict[str, int] = {}
    for device_type, key, row, labels in found:
        resources = row.get("Resources", {}) or {}
        has_gpus = float(resources.get("GPU", 0)) >= 1
        index = index_by_type.get(device_type, 0)
        index_by_type[device_type] = index + 1
        node_id = str(row["NodeID"])
        nodes.append(
            RayNode(
                node_id=node_id,
                address=str(row.get("NodeManagerAddress", "")),
                name=f"{device_type or 'unknown'}-{index}",
                device_type=device_type,
                type_label=key,
                num_devices=int(resources.get("GPU", 0)) if has_gpus else int(resources["CPU"]),
                uses_gpus=has_gpus,
                emulated_speed=parse_speed(labels, where=f"node {node_id[:12]}"),
                labels=labels,
            )
        )
    return nodes


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` ("auto": the one this process runs in)."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        raise UserError(
            f"cannot connect to a Ray cluster at {address!r}: {str(exc).splitlines()[0]}",
            field="cluster.address",
            fix="start one with `ray start --head`, or set cluster.address / --address",
        ) from None


def pin_by_node_id(plan: Plan, nodes: Sequence[RayNode]) -> Plan:
    """``plan`` with each stage pinned by node name pinned by that node's Ray id instead."""
    ids = {n.name: n.node_id for n in nodes}
    return plan.with_stages(
        lambda s: s.model_copy(update={"node": ids[s.node]}) if s.node in ids else s
    )


def one_backend(nodes: Sequence[RayNode]) -> tuple[list[RayNode], str | None]:
    """The nodes a plan may use, and a note when some were left out.

    A plan never mixes CPU ranks (gloo) with GPU ranks (NCCL): one process group runs one
    backend, and a GPU stage's step would wait on CPU stages many times slower. Where the
    cluster has both, the GPU nodes are used (a CPU-only node beside GPUs is usually the Ray head
    or a service node) and the note names the CPU nodes left out and how to use them instead.
    """
    gpu = [n for n in nodes if n.uses_gpus]
    cpu = [n for n in nodes if not n.uses_gpus]
    if not gpu or not cpu:
        return list(nodes), None
    note = (
        f"planning on the {len(gpu)} GPU nodes only, leaving out {len(cpu)} CPU nodes "
        f"({', '.join(n.name for n in cpu)}): a plan never mixes CPU (gloo) and GPU (NCCL) "
        "ranks; to train on the CPU nodes, run the job on a cluster without GPU nodes"
    )
    return gpu, note


def check_one_backend(plan: Plan, nodes: Sequence[RayNode]) -> None:
    """Raise :class:`SpecError` if ``plan`` puts stages on both CPU and GPU nodes."""
    gpu_types = {n.device_type for n in nodes if n.uses_gpus}
    cpu_types = {n.device_type for n in nodes if not n.uses_gpus}
    used = set(plan.device_counts())
    on_gpu, on_cpu = sorted(used & gpu_types), sorted(used & cpu_types - gpu_types)
    if on_gpu and on_cpu:
        raise SpecError(
            f"the plan puts stages on CPU nodes ({', '.join(on_cpu)}, gloo) and on GPU nodes "
            f"({', '.join(on_gpu)}, NCCL); one plan runs one backend",
            field="plan.replicas[].stages[].device_type",
            fix=f"plan for one kind: drop the {', '.join(on_cpu)} stages (or run on CPU nodes "
            "only)",
        )


def discover_nodes() -> list[RayNode]:
    """The live nodes of the Ray cluster this process is connected to."""
    import ray

    return nodes_from_rows(ray.nodes())


def cluster_from_nodes(nodes: Sequence[RayNode], catalog: DeviceCatalog | None = None) -> Cluster:
    """The planner's view of the live nodes; unknown device types are a clear error."""
    catalog = catalog or DeviceCatalog.builtin()
    out: list[Node] = []
    for node in nodes:
        if not node.device_type:
            raise SpecError(
                f"node {node.node_id[:12]} ({node.address}) has GPUs but no device-type label",
                field=DEVICE_TYPE_LABEL,
                fix=f"start it with --labels {DEVICE_TYPE_LABEL}=<catalog name, e.g. A100-80>",
            )
        if node.device_type not in catalog:
            raise SpecError(
                f"node {node.node_id[:12]} ({node.address}) has unknown device type "
                f"{node.device_type!r}",
                field=node.type_label or DEVICE_TYPE_LABEL,
                fix=f"label it {DEVICE_TYPE_LABEL}=<one of {', '.join(catalog.names())}>",
            )
        out.append(Node.from_device(node.name, catalog[node.device_type], node.num_devices))
    return Cluster(nodes=tuple(out))


def emulated_reference_speed(nodes: Sequence[RayNode]) -> float | None:
    """The speed that runs unstretched; None if nothing is emulated.

    Speeds are relative to the host's real speed (1.0). The reference is 1.0, or the fastest
    emulated speed when one is above 1.0: labels 1.0 and 0.25 run the fast type at real speed and
    stretch the slow one 4x; labels 0.5 and 0.125 keep the same 4x gap with both stretched, which
    leaves CPU time to spare when many emulated workers share few cores.
    """
    speeds = [n.emulated_speed for n in nodes if n.emulated_speed is not None]
    return max(1.0, *speeds) if speeds else None


def slowdown_factor(node: RayNode, reference_speed: float | None) -> float:
    """How much a worker on ``node`` stretches its compute: reference speed / node speed (>= 1)."""
    if node.emulated_speed is None or reference_speed is None:
        return 1.0
    return max(1.0, reference_speed / node.emulated_speed)
