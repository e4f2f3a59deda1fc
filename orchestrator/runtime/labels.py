"""Ray node labels and resources the runtime reads (documented in docs/runtime-ray.md).

A node's device type comes from :data:`DEVICE_TYPE_LABEL` (the project's label, a device catalog
name such as ``A100-80``) or else Ray's own :data:`ACCELERATOR_LABEL` when its value is a catalog
name. A node without GPUs and without labels is a ``cpu`` node whose devices are its CPUs.
:data:`EMULATED_SPEED_LABEL` marks a node's emulated relative speed (e.g. ``0.25``); it only takes
effect where a worker finds no real GPU.
"""

from __future__ import annotations

DEVICE_TYPE_LABEL = "orchestrator.io/device-type"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
EMULATED_SPEED_LABEL = "orchestrator.io/emulated-speed"
NODE_ID_LABEL = "ray.io/node-id"

# The device type of a node with neither GPUs nor a device-type label.
CPU_DEVICE_TYPE = "cpu"
