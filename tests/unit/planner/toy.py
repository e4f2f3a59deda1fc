"""Tiny literal clusters and profiles with round numbers, so tests can state the arithmetic."""

from __future__ import annotations

from orchestrator.spec import (
    ClusterSpec,
    DeviceType,
    ModelSpec,
    ProfileFile,
    ProfileSet,
    TrainingSpec,
)

GiB = 1024**3
HUGE_BANDWIDTH = 1e30  # makes communication cost ~0 so the arithmetic stays on compute


def device(
    name: str, memory_gib: float = 1000.0, intra_node_bandwidth_bytes_per_s: float = HUGE_BANDWIDTH
) -> DeviceType:
    return DeviceType(
        name=name,
        memory_bytes=int(memory_gib * GiB),
        peak_flops_per_s={"fp32": 1e12, "fp16": 1e12, "bf16": 1e12},
        memory_bandwidth_bytes_per_s=1e12,
        intra_node_bandwidth_bytes_per_s=intra_node_bandwidth_bytes_per_s,
        framework_overhead_bytes=0,
    )


def cluster(
    *groups: tuple[str, int, int],
    memory_gib: dict[str, float] | None = None,
    inter_node_bandwidth_bytes_per_s: float = HUGE_BANDWIDTH,
    intra_node_bandwidth_bytes_per_s: float = HUGE_BANDWIDTH,
) -> ClusterSpec:
    """``groups``: (device type, nodes, devices per node); types are defined on the fly."""
    memory_gib = memory_gib or {}
    names = sorted({g[0] for g in groups})
    return ClusterSpec(
        node_groups=[
            {"name": f"{t}{i}", "device_type": t, "num_nodes": n, "devices_per_node": k}
            for i, (t, n, k) in enumerate(groups)
        ],
        network={"inter_node_bandwidth_bytes_per_s": inter_node_bandwidth_bytes_per_s},
        device_types=[
            device(t, memory_gib.get(t, 1000.0), intra_node_bandwidth_bytes_per_s) for t in names
        ],
    )


def model(num_blocks: int = 2) -> ModelSpec:
    # Tiny shape: parameters and activations are negligible against 1000 GiB devices.
    return ModelSpec(
        name="toy",
        num_layers=num_blocks,
        hidden_size=8,
        num_heads=2,
        sequence_length=4,
        vocab_size=16,
        dtype="fp32",
    )


def profiles(
    seconds_per_layer: dict[str, float], num_planner_layers: int, update_s: float = 0.0
) -> ProfileSet:
    """Every layer takes ``s`` forward and ``2 s`` backward per microbatch of 1 on its type."""
    return ProfileSet(
        [
            ProfileFile(
                model="toy",
                device_type=t,
                entries=[
                    {
                        "microbatch_size": 1,
                        "tp": 1,
                        "layers": {
                            i: {"forward_s": s, "backward_s": 2 * s, "update_s": update_s}
                            for i in range(num_planner_layers)
                        },
                    }
                ],
            )
            for t, s in seconds_per_layer.items()
        ]
    )


def training(batch: int, microbatch_sizes: tuple[int, ...] = (1,)) -> TrainingSpec:
    return TrainingSpec(global_batch_size=batch, microbatch_sizes=list(microbatch_sizes))
