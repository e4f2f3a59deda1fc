"""What the cost model says of a plan: per-device figures and the whole step's.

Its own module so that the terms (``costmodel.sharding`` and others) can name the figures they
adjust without importing the estimator that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceEstimate:
    """Figures for the devices of one stage (all ``tp`` of them alike)."""

    replica: int
    stage: int
    device_type: str
    node: str | None
    tp: int
    layers: tuple[int, int]
    microbatch_s: float  # forward + backward + p2p of one microbatch
    compute_s: float  # busy time in the pipeline this step
    allreduce_s: float
    update_s: float
    memory_bytes: float  # everything the device holds, framework footprint included
    memory_capacity_bytes: float  # the device's whole memory
    allreduce_total_s: float = 0.0  # the all-reduce's whole duration (allreduce_s: exposed part)
    framework_bytes: float = 0.0  # the runtime's fixed footprint, part of memory_bytes
    recompute: bool = False  # activation recompute on the stage's blocks

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_capacity_bytes


@dataclass(frozen=True)
class Estimate:
    """The cost model's verdict on one plan."""

    step_time_s: float
    throughput_samples_per_s: float
    pipeline_s: float
    allreduce_s: float
    update_s: float
    peak_memory_bytes: float
    fits: bool
    devices: tuple[DeviceEstimate, ...]
    estimated_device_types: tuple[str, ...] = field(default=())

    def memory_shortfall_by_type(self) -> dict[str, float]:
        """For each device type that does not fit: the largest excess in bytes."""
        out: dict[str, float] = {}
        for d in self.devices:
            if not d.fits:
                excess = d.memory_bytes - d.memory_capacity_bytes
                out[d.device_type] = max(out.get(d.device_type, 0.0), excess)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "step_time_s": self.step_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "pipeline_s": self.pipeline_s,
            "allreduce_s": self.allreduce_s,
            "update_s": self.update_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "estimated_device_types": list(self.estimated_device_types),
            "devices": [
                {
                    "replica": d.replica,
                    "stage": d.stage,
                    "device_type": d.device_type,
                    "node": d.node,
                    "tp": d.tp,
                    "layers": list(d.layers),
                    "microbatch_s": d.microbatch_s,
                    "compute_s": d.compute_s,
                    "allreduce_s": d.allreduce_s,
                    "allreduce_total_s": d.allreduce_total_s,
                    "update_s": d.update_s,
                    "memory_bytes": d.memory_bytes,
                    "memory_capacity_bytes": d.memory_capacity_bytes,
                    "framework_bytes": d.framework_bytes,
                    "recompute": d.recompute,
                    "fits": d.fits,
                }
                for d in self.devices
            ],
        }
