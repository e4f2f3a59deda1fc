"""Per-layer cost tables with prefix sums, the cost model's working data.

A :class:`CostTables` answers, for a (device type, microbatch size, tp), every planner layer's
forward/backward/update seconds and memory, taking measured profiles where they exist and the
analytic estimate elsewhere (and remembering which). Prefix sums make any contiguous stage's cost
an O(1) lookup, which the planner's partitioning relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from orchestrator.costmodel import comm, memory
from orchestrator.costmodel.compute import LayerTime, analytic_layer_time
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import DeviceType
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.profiles import ProfileEntry, ProfileSet


@dataclass(frozen=True)
class LayerTable:
    """Costs of all planner layers on one device type at one (microbatch size, tp)."""

    device_type: str
    microbatch_size: int
    tp: int
    times: tuple[LayerTime, ...]
    # Prefix sums over layers: element i is the sum over layers [0, i).
    compute_prefix_s: tuple[float, ...]  # forward + backward of one microbatch
    update_prefix_s: tuple[float, ...]
    state_prefix_bytes: tuple[float, ...]
    activation_prefix_bytes: tuple[float, ...]  # one microbatch in flight
    estimated_layers: tuple[int, ...]
    _memory_prefix_cache: dict[int, list[float]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def memory_prefix_bytes(self, in_flight: int) -> list[float]:
        """Prefix sums of ``state + in_flight * activations`` (cached per in-flight count)."""
        found = self._memory_prefix_cache.get(in_flight)
        if found is None:
            found = [
                s + in_flight * a
                for s, a in zip(self.state_prefix_bytes, self.activation_prefix_bytes, strict=True)
            ]
            self._memory_prefix_cache[in_flight] = found
        return found

    def compute_s(self, start: int, end: int) -> float:
        return self.compute_prefix_s[end] - self.compute_prefix_s[start]

    def forward_s(self, start: int, end: int) -> float:
        return sum(t.forward_s for t in self.times[start:end])

    def backward_s(self, start: int, end: int) -> float:
        return sum(t.backward_s for t in self.times[start:end])

    def update_s(self, start: int, end: int) -> float:
        return self.update_prefix_s[end] - self.update_prefix_s[start]

    def state_bytes(self, start: int, end: int) -> float:
        return self.state_prefix_bytes[end] - self.state_prefix_bytes[start]

    def activation_bytes(self, start: int, end: int) -> float:
        return self.activation_prefix_bytes[end] - self.activation_prefix_bytes[start]

    def memory_bytes(self, start: int, end: int, in_flight: int) -> float:
        """State plus ``in_flight`` microbatches of activations for layers ``[start, end)``."""
        return self.state_bytes(start, end) + in_flight * self.activation_bytes(start, end)


def _prefix(values: list[float]) -> tuple[float, ...]:
    return (0.0, *accumulate(values))


class CostTables:
    """Builds and caches :class:`LayerTable` objects for one model and training setting."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        device_types: dict[str, DeviceType],
        profiles: ProfileSet | None = None,
        intra_node_bandwidth_bytes_per_s: dict[str, float] | None = None,
    ) -> None:
        self.model = model
        self.training = training
        self.device_types = device_types
        self.profiles = (profiles or ProfileSet()).for_model(model.name)
        self._intra = intra_node_bandwidth_bytes_per_s or {}
        self._cache: dict[tuple[str, int, int], LayerTable] = {}

    @classmethod
    def for_cluster(
        cls,
        model: ModelSpec,
        training: TrainingSpec,
        cluster: Cluster,
        profiles: ProfileSet | None = None,
    ) -> CostTables:
        """Tables for the device types present in ``cluster`` (intra-node bandwidth per type: the
        slowest of its nodes)."""
        intra: dict[str, float] = {}
        for node in cluster.nodes:
            name = node.device_type.name
            intra[name] = min(intra.get(name, float("inf")), node.intra_node_bandwidth_bytes_per_s)
        return cls(model, training, cluster.device_types, profiles, intra)

    def table(self, device_type: str, microbatch_size: int, tp: int) -> LayerTable:
        key = (device_type, microbatch_size, tp)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._build(device_type, microbatch_size, tp)
            self._cache[key] = cached
        return cached

    def _measured(
        self, device_type: str, microbatch_size: int, tp: int
    ) -> tuple[ProfileEntry | None, float]:
        """The profile entry to use and the factor to scale it by (1.0 when exact).

        Without an entry at this microbatch size, the nearest measured one at the same tp is scaled
        linearly in the microbatch size (its numbers then count as estimated).
        """
        exact = self.profiles.lookup(device_type, microbatch_size, tp)
        if exact is not None:
            return exact, 1.0
        measured = [
            e
            for f in self.profiles.files
            if f.device_type == device_type
            for e in f.entries
            if e.tp == tp
        ]
        if not measured:
            return None, 1.0
        nearest = min(
            measured, key=lambda e: (abs(e.microbatch_size - microbatch_size), e.microbatch_size)
        )
        return nearest, microbatch_size / nearest.microbatch_size

    def _build(self, device_type: str, microbatch_size: int, tp: int) -> LayerTable:
        model, training = self.model, self.training
        device = self.device_types[device_type]
        intra = self._intra.get(device_type, device.intra_node_bandwidth_bytes_per_s)
        tp_comm_s = comm.tp_allreduce_per_pass_s(model, microbatch_size, tp, intra)
        entry, scale = self._measured(device_type, microbatch_size, tp)
        times: list[LayerTime] = []
        activations: list[float] = []
        for layer in range(model.num_planner_layers):
            measured = entry.layers.get(layer) if entry is not None else None
            if measured is None:
                times.append(
                    analytic_layer_time(
                        model,
                        training,
                        device,
                        layer,
                        microbatch_size,
                        tp,
                        tp_comm_s if model.layer_kind(layer).value == "block" else 0.0,
                    )
                )
            else:
                update_s = measured.update_s
                if update_s is None:  # not measured: the update is memory-bound, estimate it
                    update_s = analytic_layer_time(
                        model, training, device, layer, microbatch_size, tp, 0.0
                    ).update_s
                times.append(
                    LayerTime(
                        forward_s=measured.forward_s * scale,
                        backward_s=measured.backward_s * scale,
                        update_s=update_s,
                        estimated=scale != 1.0,
                    )
                )
            if measured is not None and measured.activation_bytes is not None:
                activations.append(measured.activation_bytes * scale)
            else:
                activations.append(
                    memory.activation_bytes_per_microbatch(model, layer, microbatch_size, tp)
                )
        states = [memory.state_bytes(model, training, i, tp) for i in range(len(times))]
        return LayerTable(
            device_type=device_type,
            microbatch_size=microbatch_size,
            tp=tp,
            times=tuple(times),
            compute_prefix_s=_prefix([t.forward_s + t.backward_s for t in times]),
            update_prefix_s=_prefix([t.update_s for t in times]),
            state_prefix_bytes=_prefix(states),
            activation_prefix_bytes=_prefix(activations),
            estimated_layers=tuple(i for i, t in enumerate(times) if t.estimated),
        )
