"""Node labels: the one place that names them, and the one rule that reads a device type.

A node's device type is the project's :data:`DEVICE_TYPE_LABEL` (a device catalog name such as
``A100-80``) as written, or else Ray's :data:`ACCELERATOR_LABEL` mapped through the catalog's
aliases (:meth:`~orchestrator.spec.devices.DeviceCatalog.resolve`). A node without GPUs and
without labels is a :data:`CPU_DEVICE_TYPE` node whose devices are its CPUs.
:data:`EMULATED_SPEED_LABEL` marks a node's emulated relative speed (e.g. ``0.25``); it only takes
effect where a worker finds no real GPU. The Ray runtime, the workers' emulation, the Kubernetes
operator and the chart's docs all use these names (docs/runtime-ray.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.spec.devices import DeviceCatalog

DEVICE_TYPE_LABEL = "orchestrator.io/device-type"
EMULATED_SPEED_LABEL = "orchestrator.io/emulated-speed"
POOL_LABEL = "orchestrator.io/pool"
JOB_LABEL = "orchestrator.io/job"
# The Kubernetes Node a Ray pod runs on (the operator sets it on every Ray pod).
NODE_NAME_LABEL = "orchestrator.io/node-name"
# Labels a posted node event may name a node by, besides its Ray node id and host name.
NODE_NAME_LABELS = (NODE_NAME_LABEL, "kubernetes.io/hostname")
ACCELERATOR_LABEL = "ray.io/accelerator-type"  # Ray's own
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own, set on every node

# The device type of a node with neither GPUs nor a device-type label.
CPU_DEVICE_TYPE = "cpu"


def device_type_from_labels(
    labels: Mapping[str, str], catalog: DeviceCatalog | None = None
) -> tuple[str, str] | None:
    """``(device type, label key that named it)``, or ``None`` when no label names one.

    A name the catalog does not know comes back as written: the caller reports it with the node.
    """
    own = labels.get(DEVICE_TYPE_LABEL)
    if own:
        return own, DEVICE_TYPE_LABEL
    ray_type = labels.get(ACCELERATOR_LABEL)
    if ray_type:
        resolved = (catalog or DeviceCatalog.builtin()).resolve(ray_type)
        return resolved or ray_type, ACCELERATOR_LABEL
    return None
