"""The runtime's fixed costs on a device type, as :class:`~.tables.CostTables` reads them.

What the runtime occupies per device, the per-parameter training-state bytes, and the seconds a
stage pays per microbatch, per step, per call and per point-to-point message beyond its layers:
what the profiler measured for our runtime where a profile carries it, else the preset's figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from orchestrator.costmodel.presets import RuntimePreset, StateTerms
from orchestrator.spec.devices import DeviceType
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.profiles import ProfileSet, RuntimeConstants

_UNSET = object()


class RuntimeOverheads:
    """The runtime-constant lookups of :class:`~.tables.CostTables` (its attributes below)."""

    model: ModelSpec
    training: TrainingSpec
    device_types: dict[str, DeviceType]
    all_profiles: ProfileSet
    profiles: ProfileSet
    runtime: RuntimePreset
    _time_terms: dict[str, object]

    def framework_overhead_bytes(self, device_type: str) -> float:
        """Fixed bytes the runtime occupies on one device of this type: what the profiler
        measured on the device itself for our runtime, else the preset's figure."""
        if self.runtime.measured_constants and self.runtime.framework_bytes is None:
            measured = self.all_profiles.runtime_constants(device_type, measured_on_device=True)
            if measured is not None:
                return float(measured.framework_bytes)
        return self.runtime.framework_overhead_bytes(self.device_types[device_type])

    def state_terms(self, device_type: str) -> StateTerms:
        """Per-parameter training-state bytes on this device type: the preset's terms, with the
        total the profiler measured for our runtime (same optimizer) where it did."""
        terms = self.runtime.state_terms(self.model, self.training)
        if not self.runtime.measured_constants:
            return terms
        measured = self.all_profiles.runtime_constants(device_type)
        if measured is None or measured.optimizer != self.training.optimizer.value:
            return terms
        optimizer = measured.state_bytes_per_param - terms.weights - terms.grads
        return replace(terms, optimizer=max(0.0, optimizer))

    def microbatch_overhead_s(self, device_type: str) -> float:
        """Fixed seconds a stage on this device type pays per microbatch beyond its layers:
        what the profiler measured for our runtime (emulated profiles too: their terms are
        what the emulated rank pays), else the preset's figure."""
        measured = self._measured_time_terms(device_type)
        if measured is not None and measured.microbatch_overhead_s is not None:
            return measured.microbatch_overhead_s
        return self.runtime.microbatch_overhead_s

    def step_overhead_s(self, device_type: str) -> float:
        """Fixed seconds per step on a rank of this device type: the rank's own per-step work
        plus the driver's round trip to it, as the profiler measured them for our runtime,
        else the preset's figure."""
        measured = self._measured_time_terms(device_type)
        if measured is None or measured.step_overhead_s is None:
            return self.runtime.step_overhead_s
        return measured.step_overhead_s + (measured.round_trip_s or 0.0)

    def call_overhead_s(self, device_type: str) -> tuple[float, float] | None:
        """Per-call seconds of a stage's forward and backward on this device type, as the
        profiler measured them for our runtime (``worker/call_terms.py``), or None (an older
        profile, another runtime): the layers' profiled times are then summed as they are."""
        measured = self._measured_time_terms(device_type)
        if measured is None or measured.call_forward_s is None or measured.call_backward_s is None:
            return None
        return measured.call_forward_s, measured.call_backward_s

    def p2p_latency_s(self, device_type: str) -> float:
        """Seconds one point-to-point message costs beyond its bytes on this device type, as
        the profiler measured it for our runtime (``worker/p2p_latency.py``), else 0."""
        measured = self._measured_time_terms(device_type)
        if measured is None or measured.p2p_latency_s is None:
            return 0.0
        return measured.p2p_latency_s

    def collective_cost(
        self, device_types: Iterable[str]
    ) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """((latency seconds, bytes per second) of one gather, the same of one reduction) of the
        layer-by-layer sharded path among holders of these device types, as the profiler
        measured them for our runtime (``worker/collective_cost.py``): the slowest type's
        latency and rate; None where any type has no measurement (the network's bandwidth then
        stands in)."""
        found: list[tuple[float, float, float, float]] = []
        for device_type in device_types:
            m = self._measured_time_terms(device_type)
            if m is None:
                return None
            gather_s, gather_rate = m.gather_latency_s, m.gather_bytes_per_s
            reduce_s, reduce_rate = m.reduce_latency_s, m.reduce_bytes_per_s
            if gather_s is None or gather_rate is None or reduce_s is None or reduce_rate is None:
                return None
            found.append((gather_s, gather_rate, reduce_s, reduce_rate))
        if not found:
            return None
        gather = (max(f[0] for f in found), min(f[1] for f in found))
        reduce = (max(f[2] for f in found), min(f[3] for f in found))
        return gather, reduce

    def allreduce_cost(self, device_types: Iterable[str]) -> tuple[float, float] | None:
        """(latency seconds, bytes per second) of one gradient all-reduce among holders of these
        device types, as the profiler measured it for our runtime (``worker/collective_cost.py``):
        the slowest type's; None where any type has no measurement (the network's bandwidth
        alone then prices it)."""
        found: list[tuple[float, float]] = []
        for device_type in device_types:
            m = self._measured_time_terms(device_type)
            if m is None or m.allreduce_latency_s is None or m.allreduce_bytes_per_s is None:
                return None
            found.append((m.allreduce_latency_s, m.allreduce_bytes_per_s))
        if not found:
            return None
        return max(f[0] for f in found), min(f[1] for f in found)

    def _measured_time_terms(self, device_type: str) -> RuntimeConstants | None:
        if not self.runtime.measured_constants:
            return None
        found = self._time_terms.get(device_type, _UNSET)
        if found is _UNSET:
            # The planned model's own profile first: the loss and batch sizes it reads back are
            # part of the terms; another model's figures stand in where it has none.
            found = self.profiles.runtime_constants(
                device_type, with_time_terms=True
            ) or self.all_profiles.runtime_constants(device_type, with_time_terms=True)
            self._time_terms[device_type] = found
        return found  # type: ignore[return-value]

    def usable_memory_bytes(self, device_type: str) -> float:
        """Device memory left for model state and activations under this runtime."""
        device = self.device_types[device_type]
        return max(0.0, device.memory_bytes - self.framework_overhead_bytes(device_type))
