"""Usable memory per device type, lowered when a worker runs out of memory.

After an out-of-memory error on a device type, the planner must not plan that type to the memory
it ran out at again. :class:`MemoryCaps` keeps, per device type, the usable bytes to plan with:
what the error measured (the memory the process held when the allocation failed), less a margin;
when the error measured nothing, the current usable figure less ``step_fraction``. A cap only
ever goes down. :meth:`MemoryCaps.apply` returns a device type with its framework overhead raised
so that its usable memory is the cap (peak speed and name unchanged: placement is unaffected).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.spec.devices import DeviceType


@dataclass
class MemoryCaps:
    """Device type -> usable bytes the planner may plan with (only types that ran out)."""

    margin_fraction: float = 0.05  # below the measured figure: fragmentation varies by plan
    step_fraction: float = 0.10  # lowered by this much when the error measured nothing
    usable_bytes: dict[str, float] = field(default_factory=dict)

    def lower(
        self, device_type: DeviceType, measured_usable_bytes: float | None
    ) -> tuple[float, float]:
        """Record an out-of-memory on ``device_type``; returns (usable before, usable now)."""
        before = self.usable(device_type)
        if measured_usable_bytes is not None and measured_usable_bytes > 0:
            target = measured_usable_bytes * (1 - self.margin_fraction)
        else:
            target = before * (1 - self.step_fraction)
        now = min(before, target)
        self.usable_bytes[device_type.name] = now
        return before, now

    def usable(self, device_type: DeviceType) -> float:
        return min(
            float(device_type.usable_memory_bytes),
            self.usable_bytes.get(device_type.name, float("inf")),
        )

    def apply(self, device_type: DeviceType) -> DeviceType:
        """``device_type`` planned with its cap (itself when it has none)."""
        cap = self.usable_bytes.get(device_type.name)
        if cap is None or cap >= device_type.usable_memory_bytes:
            return device_type
        overhead = device_type.memory_bytes - int(cap)
        return device_type.model_copy(update={"framework_overhead_bytes": overhead})
