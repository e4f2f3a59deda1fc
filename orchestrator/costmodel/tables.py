"""Per-layer cost tables with prefix sums, the cost model's working data.

A :class:`CostTables` answers, for a (device type, microbatch size, tp), every planner layer's
forward/backward/update seconds and memory, taking measured profiles where they exist and the
analytic estimate elsewhere (and remembering which). Prefix sums make any contiguous stage's cost
an O(1) lookup, which the planner's partitioning relies on.

The parts: :mod:`.layer_table` (the table and its recomputed variant), :mod:`.table_sources`
(which measured entry stands in where none matches exactly), :mod:`.overheads` (the runtime's
fixed costs per device type); this module builds the tables and caches them.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel import comm, memory
from orchestrator.costmodel.compute import LayerTime, analytic_layer_time
from orchestrator.costmodel.layer_table import LayerTable, _prefix, recomputed_table
from orchestrator.costmodel.overheads import RuntimeOverheads
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset
from orchestrator.costmodel.table_sources import TableSources
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import DeviceType, Dtype
from orchestrator.spec.model import LayerKind, ModelSpec, TrainingSpec
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileSet

__all__ = ["CostTables", "LayerTable", "recomputed_table"]


def _activation_bytes(timing: LayerTiming | None, sixteen_bit: bool) -> float | None:
    """A layer's measured activation bytes at the runtime's compute precision (16-bit: the
    autocast measurement where there is one, else the fp32 one, an upper bound)."""
    if timing is None:
        return None
    if sixteen_bit and timing.activation_bytes_16bit is not None:
        return float(timing.activation_bytes_16bit)
    return None if timing.activation_bytes is None else float(timing.activation_bytes)


def _boundary_activation_bytes(timing: LayerTiming | None, sixteen_bit: bool) -> float | None:
    """A layer's 16-bit activations with its input arriving in 16 bits, where measured."""
    if not sixteen_bit or timing is None or timing.activation_bytes_16bit_boundary is None:
        return None
    return float(timing.activation_bytes_16bit_boundary)


def _cast_bytes(model: ModelSpec, layer: int, per_param: float) -> float:
    """Per-parameter bytes of 16-bit weight copies a layer keeps: none for embedding tables."""
    return 0.0 if model.layer_kind(layer) is LayerKind.EMBEDDING else per_param


class CostTables(RuntimeOverheads, TableSources):
    """Builds and caches :class:`LayerTable` objects for one model and training setting."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        device_types: dict[str, DeviceType],
        profiles: ProfileSet | None = None,
        intra_node_bandwidth_bytes_per_s: dict[str, float] | None = None,
        *,
        runtime: RuntimePreset = ORCHESTRATOR,
    ) -> None:
        self.model = model
        self.training = training
        self.device_types = device_types
        self.all_profiles = profiles or ProfileSet()
        self.profiles = self.all_profiles.for_model(model.name)
        self.runtime = runtime
        self._intra = intra_node_bandwidth_bytes_per_s or {}
        self._cache: dict[tuple[str, int, int, bool], LayerTable] = {}
        self._time_terms: dict[str, object] = {}
        self._params_prefix: list[int] | None = None
        self._layer_params: list[int] | None = None
        # Solved pipeline shapes, per (shape, microbatch, sharding): the search asks again for
        # the same shapes from its several selections (see planner/templates.build_template).
        self.templates: dict[object, object] = {}

    def params(self, start: int, end: int) -> int:
        """Parameters of planner layers ``[start, end)`` (a prefix sum: the search sums ranges
        of layers for every shape it solves)."""
        if self._params_prefix is None:
            prefix = [0]
            for count in self.layer_params():
                prefix.append(prefix[-1] + count)
            self._params_prefix = prefix
        return self._params_prefix[end] - self._params_prefix[start]

    def layer_params(self) -> list[int]:
        """Parameters of each planner layer (counted once: every table reads them all)."""
        if self._layer_params is None:
            model = self.model
            self._layer_params = [model.layer_params(i) for i in range(model.num_planner_layers)]
        return self._layer_params

    @classmethod
    def for_cluster(
        cls,
        model: ModelSpec,
        training: TrainingSpec,
        cluster: Cluster,
        profiles: ProfileSet | None = None,
        *,
        runtime: RuntimePreset = ORCHESTRATOR,
    ) -> CostTables:
        """Tables for the device types present in ``cluster`` (intra-node bandwidth per type: the
        slowest of its nodes), with the memory constants of ``runtime``."""
        intra: dict[str, float] = {}
        for node in cluster.nodes:
            name = node.device_type.name
            intra[name] = min(intra.get(name, float("inf")), node.intra_node_bandwidth_bytes_per_s)
        return cls(model, training, cluster.device_types, profiles, intra, runtime=runtime)

    def table(
        self, device_type: str, microbatch_size: int, tp: int, recompute: bool = False
    ) -> LayerTable:
        """Costs at this (device type, microbatch size, tp); ``recompute``: with activation
        recompute on the blocks (``recomputed_table``)."""
        key = (device_type, microbatch_size, tp, recompute)
        cached = self._cache.get(key)
        if cached is None:
            if recompute:
                base = self.table(device_type, microbatch_size, tp)
                cast = self.state_terms(device_type).cast_weights
                cached = recomputed_table(
                    base, self.model, microbatch_size, cast, self.layer_params()
                )
            else:
                cached = self._build(device_type, microbatch_size, tp)
            self._cache[key] = cached
        return cached

    def _build(self, device_type: str, microbatch_size: int, tp: int) -> LayerTable:
        """The table at (device type, microbatch size, tp), not recomputed: each layer measured
        where profiled (``_source``), else derived from the tp-1 table, else analytic."""
        device = self.device_types[device_type]
        intra = self._intra.get(device_type, device.intra_node_bandwidth_bytes_per_s)
        tp_comm_s = comm.tp_allreduce_per_pass_s(self.model, microbatch_size, tp, intra)
        source = self._source(device_type, microbatch_size, tp)
        times = self._layer_times(device, source, microbatch_size, tp, tp_comm_s)
        activations, boundary_activations = self._activations(source, microbatch_size, tp)
        layer_params = self.layer_params()
        terms = self.state_terms(device_type)
        states = [
            layer_params[i] / tp * (terms.state + _cast_bytes(self.model, i, terms.cast_weights))
            for i in range(len(times))
        ]
        entry = source.entry
        stage_update_s = entry.stage_update_s if entry is not None else None
        call_s = source.call_forward_s + source.call_backward_s
        derived = (
            self._derived_from_tp1(device_type, microbatch_size, tp, tp_comm_s)
            if entry is None
            else None
        )
        if derived is not None:
            times, base = derived
            stage_update_s = base.stage_update_s / tp
            call_s = base.call_s
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
            stage_update_s=(stage_update_s or 0.0) * source.update_scale,
            boundary_activation_prefix_bytes=(
                _prefix(boundary_activations) if boundary_activations != activations else None
            ),
            call_s=call_s,
        )

    def _source(self, device_type: str, microbatch_size: int, tp: int) -> _Source:
        """The measured entries that stand in for this table and how to read them (kept apart:
        the times and the activations read the same entries with different rules)."""
        entry, scale, memory_scale = self._measured(device_type, microbatch_size, tp)
        # Borrowed from another device type: the update scales with its speed too.
        transferred = entry is not None and device_type not in self.profiles.device_types()
        # Each profiled layer was its own call: net its share out, charge the stage's calls once
        # (a borrowed entry's calls belong to another device type: summed as they are).
        calls = None if transferred or entry is None else self.call_overhead_s(device_type)
        call_forward_s, call_backward_s = calls or (0.0, 0.0)
        return _Source(
            entry=entry,
            memory_entry=self._memory_entry(device_type, microbatch_size, tp),
            scale=scale,
            memory_scale=memory_scale,
            update_scale=scale if transferred else 1.0,
            call_forward_s=call_forward_s,
            call_backward_s=call_backward_s,
            exact=self.profiles.lookup(device_type, microbatch_size, tp) is not None,
        )

    def _layer_times(
        self,
        device: DeviceType,
        source: _Source,
        microbatch_size: int,
        tp: int,
        tp_comm_s: float,
    ) -> list[LayerTime]:
        """Each planner layer's seconds: measured (net of its call's share, scaled when
        borrowed), else the analytic estimate."""
        model, training = self.model, self.training
        entry = source.entry
        layer_params = self.layer_params()
        # The analytic estimate reads a layer's kind and parameter count alone: blocks alike
        # share one (each table costs all its layers at once).
        analytic: dict[tuple[LayerKind, int], LayerTime] = {}
        times: list[LayerTime] = []
        for layer in range(model.num_planner_layers):
            measured = entry.layers.get(layer) if entry is not None else None
            if measured is None:
                kind = model.layer_kind(layer)
                same = (kind, layer_params[layer])
                estimate = analytic.get(same)
                if estimate is None:
                    comm_s = tp_comm_s if kind.value == "block" else 0.0
                    estimate = analytic[same] = analytic_layer_time(
                        model, training, device, layer, microbatch_size, tp, comm_s
                    )
                times.append(estimate)
                continue
            update_s = measured.update_s
            if update_s is None:  # not measured: the update is memory-bound, estimate it
                update_s = analytic_layer_time(
                    model, training, device, layer, microbatch_size, tp, 0.0
                ).update_s
            times.append(
                LayerTime(
                    forward_s=max(0.0, measured.forward_s - source.call_forward_s) * source.scale,
                    backward_s=max(0.0, measured.backward_s - source.call_backward_s)
                    * source.scale,
                    update_s=update_s * source.update_scale,
                    estimated=not source.exact,
                )
            )
        return times

    def _activations(
        self, source: _Source, microbatch_size: int, tp: int
    ) -> tuple[list[float], list[float]]:
        """Each planner layer's activation bytes per microbatch, and the same with its input
        arriving in 16 bits (a stage's first layer): measured, else the memory entry's, else
        the analytic estimate."""
        model = self.model
        sixteen_bit = self.training.runtime_precision is not Dtype.FP32
        activations: list[float] = []
        boundary_activations: list[float] = []
        for layer in range(model.num_planner_layers):
            entry, memory_entry = source.entry, source.memory_entry
            measured = entry.layers.get(layer) if entry is not None else None
            measured_memory = memory_entry.layers.get(layer) if memory_entry is not None else None
            measured_bytes = _activation_bytes(measured, sixteen_bit)
            memory_bytes = _activation_bytes(measured_memory, sixteen_bit)
            if measured_bytes is not None:
                activations.append(measured_bytes * source.memory_scale)
            elif memory_bytes is not None:
                activations.append(memory_bytes)
            else:
                activations.append(
                    memory.activation_bytes_per_microbatch(model, layer, microbatch_size, tp)
                )
            boundary = _boundary_activation_bytes(measured, sixteen_bit)
            if boundary is not None:
                boundary_activations.append(boundary * source.memory_scale)
            elif measured is None or measured.activation_bytes is None:
                boundary = _boundary_activation_bytes(measured_memory, sixteen_bit)
                boundary_activations.append(activations[-1] if boundary is None else boundary)
            else:
                boundary_activations.append(activations[-1])
        return activations, boundary_activations


@dataclass(frozen=True)
class _Source:
    """The measured entries one table reads: ``entry`` for times (scaled by ``scale``, its
    update by ``update_scale``, net of the calls' seconds), ``memory_entry`` for activations."""

    entry: ProfileEntry | None
    memory_entry: ProfileEntry | None
    scale: float
    memory_scale: float
    update_scale: float
    call_forward_s: float
    call_backward_s: float
    exact: bool  # profiled at this very (device type, microbatch size, tp)
