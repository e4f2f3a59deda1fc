"""Per-layer cost tables with prefix sums, the cost model's working data.

A :class:`CostTables` answers, for a (device type, microbatch size, tp), every planner layer's
forward/backward/update seconds and memory, taking measured profiles where they exist and the
analytic estimate elsewhere (and remembering which). Prefix sums make any contiguous stage's cost
an O(1) lookup, which the planner's partitioning relies on.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, pairwise

from orchestrator.costmodel import comm, memory
from orchestrator.costmodel.compute import LayerTime, analytic_layer_time
from orchestrator.costmodel.presets import ORCHESTRATOR, RuntimePreset, StateTerms
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.devices import DeviceType, Dtype
from orchestrator.spec.model import LayerKind, ModelSpec, TrainingSpec
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileSet, RuntimeConstants

_UNSET = object()


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
    # Optimizer seconds charged once per pipeline stage whatever layers it holds (sources such as
    # Sailor measure the step of a stage, not of a layer); 0 where the update is per layer.
    stage_update_s: float = 0.0
    # Activations of a stage that does not start at layer 0, where they differ (16-bit compute:
    # the stage's input arrives in 16 bits and its residual stream stays so); None: the same.
    # ``activation_prefix_bytes`` bounds them from above, so the partition search may use it.
    boundary_activation_prefix_bytes: tuple[float, ...] | None = None
    # Activation recompute (``CostTables.table(..., recompute=True)``): per layer, the bytes its
    # recomputed forward holds during its own backward (one microbatch's full activations; 0 for
    # layers run whole). A stage peaks at the largest of its layers' on top of what is in flight.
    transient_bytes: tuple[float, ...] = ()
    recompute: bool = False
    # Seconds a stage's forward and backward calls cost per microbatch beyond their layers, once
    # per stage whatever layers it holds (``CostTables.call_overhead_s``); the layers' times are
    # then net of it. 0: the layers' times as profiled, each call charged with every layer.
    call_s: float = 0.0
    _memory_prefix_cache: dict[int, list[float]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _largest_cache: dict[int, tuple[float, float]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def largest_layer(self, in_flight: int) -> tuple[float, float]:
        """The largest single layer's compute seconds and memory bytes (cached)."""
        found = self._largest_cache.get(in_flight)
        if found is None:
            compute = self.compute_prefix_s
            mem = self.memory_prefix_bytes(in_flight)
            found = (
                max(b - a for a, b in pairwise(compute)) + self.call_s,
                max(b - a for a, b in pairwise(mem)),
            )
            self._largest_cache[in_flight] = found
        return found

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
        """Forward + backward seconds of one microbatch through a stage of layers
        ``[start, end)``: its layers' own times and the stage's calls once."""
        layers_s = self.compute_prefix_s[end] - self.compute_prefix_s[start]
        return layers_s + (self.call_s if end > start else 0.0)

    def forward_s(self, start: int, end: int) -> float:
        return sum(t.forward_s for t in self.times[start:end])

    def backward_s(self, start: int, end: int) -> float:
        return sum(t.backward_s for t in self.times[start:end])

    def update_s(self, start: int, end: int) -> float:
        """Optimizer seconds of a stage holding layers ``[start, end)``."""
        per_layer = self.update_prefix_s[end] - self.update_prefix_s[start]
        return per_layer + (self.stage_update_s if end > start else 0.0)

    def state_bytes(self, start: int, end: int) -> float:
        return self.state_prefix_bytes[end] - self.state_prefix_bytes[start]

    def activation_bytes(self, start: int, end: int) -> float:
        """One microbatch's activations of a stage holding layers ``[start, end)``."""
        prefix = self.activation_prefix_bytes
        if start > 0 and self.boundary_activation_prefix_bytes is not None:
            prefix = self.boundary_activation_prefix_bytes
        return prefix[end] - prefix[start]

    def transient_max_bytes(self, start: int = 0, end: int | None = None) -> float:
        """The largest recompute transient among layers ``[start, end)`` (0 without recompute)."""
        return max(self.transient_bytes[start:end], default=0.0)

    def memory_bytes(self, start: int, end: int, in_flight: int) -> float:
        """State plus ``in_flight`` microbatches of activations for layers ``[start, end)``, plus
        the recompute transient where the stage recomputes."""
        held = self.state_bytes(start, end) + in_flight * self.activation_bytes(start, end)
        return held + self.transient_max_bytes(start, end)


def _proxy_hidden_size(profiles: ProfileSet) -> float | None:
    """A profiled model's hidden size, read from its measured block parameters (12 h^2 + 13 h
    per GPT block at tp 1, so h ~ sqrt(params / 12))."""
    for f in profiles.files:
        for e in f.entries:
            if e.tp != 1:
                continue
            blocks = sorted(e.layers)[1:-1]
            params = [b for i in blocks if (b := e.layers[i].param_bytes)]
            if params and f.dtype:
                dtype_bytes = 4 if f.dtype == "fp32" else 2
                return math.sqrt(params[0] / dtype_bytes / 12)
    return None


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


def _prefix(values: list[float]) -> tuple[float, ...]:
    return (0.0, *accumulate(values))


def recomputed_table(
    base: LayerTable,
    model: ModelSpec,
    microbatch_size: int,
    cast_bytes_per_param: float = 0.0,
    layer_params: Sequence[int] | None = None,
) -> LayerTable:
    """``base`` with activation recompute on every block (``torch.utils.checkpoint`` per block,
    as the engine runs it; embedding and head run whole).

    A recomputed block keeps, per microbatch in flight, only its input: the ``[b, s, h]`` hidden
    states, whole on every tensor-parallel rank (no sequence parallel). Its backward first runs
    its forward again, so the block's backward costs its forward more, and while it does the
    block's full activations of that one microbatch are live: the transient.

    Under autocast a block's 16-bit weight copies (``cast_bytes_per_param``) are saved only by the
    forward that backward needs, so with recompute they leave the held state and join the
    transient: they exist while that one block is re-run. ``layer_params``: each layer's
    parameter count, where the caller has them counted (else counted from ``model``).
    """
    boundary = comm.boundary_activation_bytes(model, microbatch_size)
    # 16-bit compute: a stage that does not start at the embedding receives its input in 16 bits
    # and its residual stream stays so; each recomputed block then keeps a 16-bit input.
    later = base.boundary_activation_prefix_bytes
    later_boundary = microbatch_size * model.sequence_length * model.hidden_size * 2
    later_activations: list[float] = []
    times: list[LayerTime] = []
    activations: list[float] = []
    transients: list[float] = []
    states: list[float] = []
    for layer, (t, (a, b), (sa, sb)) in enumerate(
        zip(
            base.times,
            pairwise(base.activation_prefix_bytes),
            pairwise(base.state_prefix_bytes),
            strict=True,
        )
    ):
        if model.layer_kind(layer) is not LayerKind.BLOCK:
            times.append(t)
            activations.append(b - a)
            transients.append(0.0)
            states.append(sb - sa)
            if later is not None:
                later_activations.append(later[layer + 1] - later[layer])
            continue
        params = model.layer_params(layer) if layer_params is None else layer_params[layer]
        cast = params / base.tp * cast_bytes_per_param
        states.append(sb - sa - cast)
        times.append(
            LayerTime(
                forward_s=t.forward_s,
                backward_s=t.backward_s + t.forward_s,
                update_s=t.update_s,
                estimated=t.estimated,
            )
        )
        activations.append(boundary)
        later_activations.append(later_boundary)
        transients.append(b - a + cast)
    return replace(
        base,
        times=tuple(times),
        compute_prefix_s=_prefix([t.forward_s + t.backward_s for t in times]),
        state_prefix_bytes=_prefix(states),
        activation_prefix_bytes=_prefix(activations),
        boundary_activation_prefix_bytes=None if later is None else _prefix(later_activations),
        transient_bytes=tuple(transients),
        recompute=True,
        _memory_prefix_cache={},
        _largest_cache={},
    )


class CostTables:
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

    def _memory_entry(self, device_type: str, microbatch_size: int, tp: int) -> ProfileEntry | None:
        """An entry with measured activation memory at this (microbatch size, tp): this device
        type's, else another type's (activation and parameter bytes depend on the model and the
        runtime, not on the GPU), so a type without a time profile still gets measured memory."""
        own = self.profiles.lookup(device_type, microbatch_size, tp)
        if own is not None and any(t.activation_bytes is not None for t in own.layers.values()):
            return own
        for f in self.profiles.files:
            other = self.profiles.lookup(f.device_type, microbatch_size, tp)
            if other is not None and any(
                t.activation_bytes is not None for t in other.layers.values()
            ):
                return other
        return None

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

    def _measured(
        self, device_type: str, microbatch_size: int, tp: int
    ) -> tuple[ProfileEntry | None, float, float]:
        """The profile entry to use and the factors to scale its times and its activation memory
        by (1.0 when exact).

        Without an entry at this microbatch size, the nearest measured one at the same tp is scaled
        linearly in the microbatch size (its numbers then count as estimated).
        """
        exact = self.profiles.lookup(device_type, microbatch_size, tp)
        if exact is not None:
            return exact, 1.0, 1.0
        measured = [
            e
            for f in self.profiles.files
            if f.device_type == device_type
            for e in f.entries
            if e.tp == tp
        ]
        if not measured:
            entry, speed = self._transferred(device_type, microbatch_size, tp)
            return entry, speed, 1.0
        nearest = min(
            measured, key=lambda e: (abs(e.microbatch_size - microbatch_size), e.microbatch_size)
        )
        scale = microbatch_size / nearest.microbatch_size
        return nearest, scale, scale

    def _transferred(
        self, device_type: str, microbatch_size: int, tp: int
    ) -> tuple[ProfileEntry | None, float]:
        """A device type with no profile of this model: another type's measured entry, scaled by
        how much slower the two types measured on a proxy model, or (None, 1) when no pair exists.

        The proxy is the model profiled on both types whose hidden size is nearest (log scale) to
        this one's: achieved speed depends on matmul shapes, so a like-sized model transfers best.
        The factor is the median, over the proxy's shared (microbatch, tp) entries, of the ratio of
        block seconds (target over reference). The result counts as estimated.
        """
        candidates = []
        for reference in self.profiles.device_types():
            entry = self.profiles.lookup(reference, microbatch_size, tp)
            if entry is None:
                continue
            ratio = self._speed_ratio(device_type, reference)
            if ratio is not None:
                candidates.append((ratio[0], -ratio[1], reference, entry, ratio[2]))
        if not candidates:
            return None, 1.0
        _, _, _, entry, factor = min(candidates, key=lambda c: c[:3])
        return entry, factor

    def _speed_ratio(self, target: str, reference: str) -> tuple[float, int, float] | None:
        """(hidden-size distance of the proxy, shared entries, median target/reference ratio)."""
        best: tuple[float, int, float] | None = None
        models = {f.model for f in self.all_profiles.files if f.model != self.model.name}
        for name in sorted(models):
            proxy = self.all_profiles.for_model(name)
            ratios = []
            for f in proxy.files:
                if f.device_type != target:
                    continue
                for e in f.entries:
                    ref = proxy.lookup(reference, e.microbatch_size, e.tp)
                    if ref is None:
                        continue
                    shared = sorted(set(e.layers) & set(ref.layers))[1:-1]  # blocks only
                    num = sum(e.layers[i].forward_s + e.layers[i].backward_s for i in shared)
                    den = sum(ref.layers[i].forward_s + ref.layers[i].backward_s for i in shared)
                    if num > 0 and den > 0:
                        ratios.append(num / den)
            if not ratios:
                continue
            hidden = _proxy_hidden_size(proxy)
            distance = abs(math.log(hidden / self.model.hidden_size)) if hidden else float("inf")
            found = (distance, len(ratios), statistics.median(ratios))
            if best is None or (found[0], -found[1]) < (best[0], -best[1]):
                best = found
        return best

    def _derived_from_tp1(
        self, device_type: str, microbatch_size: int, tp: int, tp_comm_s: float
    ) -> tuple[list[LayerTime], LayerTable] | None:
        """Times at ``tp`` > 1 for a device type measured at tp 1 only: each layer's measured
        tp-1 time scaled by the analytic ratio of its tp-``tp`` to its tp-1 time, plus the
        tensor-parallel all-reduce of a block. Without it a type's tp-1 plans would be costed
        from its measurement and its tp plans from datasheet peaks, two scales that need not
        agree (an emulated device runs at a fraction of its datasheet's speed); None when the
        type has no measured (or borrowed) tp-1 entry either (then all its times are analytic,
        on one scale)."""
        if tp == 1 or self._measured(device_type, microbatch_size, 1)[0] is None:
            return None
        base = self.table(device_type, microbatch_size, 1)
        model, training = self.model, self.training
        device = self.device_types[device_type]
        times = []
        for layer, one in enumerate(base.times):
            at_1 = analytic_layer_time(model, training, device, layer, microbatch_size, 1, 0.0)
            at_tp = analytic_layer_time(model, training, device, layer, microbatch_size, tp, 0.0)
            comm_s = tp_comm_s if model.layer_kind(layer) is LayerKind.BLOCK else 0.0
            times.append(
                LayerTime(
                    forward_s=one.forward_s * at_tp.forward_s / at_1.forward_s + comm_s,
                    backward_s=one.backward_s * at_tp.backward_s / at_1.backward_s + comm_s,
                    update_s=one.update_s * at_tp.update_s / at_1.update_s
                    if at_1.update_s > 0
                    else one.update_s,
                    estimated=True,
                )
            )
        return times, base

    def _build(self, device_type: str, microbatch_size: int, tp: int) -> LayerTable:
        model, training = self.model, self.training
        device = self.device_types[device_type]
        intra = self._intra.get(device_type, device.intra_node_bandwidth_bytes_per_s)
        tp_comm_s = comm.tp_allreduce_per_pass_s(model, microbatch_size, tp, intra)
        entry, scale, memory_scale = self._measured(device_type, microbatch_size, tp)
        memory_entry = self._memory_entry(device_type, microbatch_size, tp)
        exact = self.profiles.lookup(device_type, microbatch_size, tp) is not None
        # Borrowed from another device type: the update scales with its speed too.
        transferred = entry is not None and device_type not in self.profiles.device_types()
        update_scale = scale if transferred else 1.0
        times: list[LayerTime] = []
        activations: list[float] = []
        sixteen_bit = training.runtime_precision is not Dtype.FP32
        # Each profiled layer was its own call: net its share out, charge the stage's calls once
        # (a borrowed entry's calls belong to another device type: summed as they are).
        calls = None if transferred or entry is None else self.call_overhead_s(device_type)
        call_forward_s, call_backward_s = calls or (0.0, 0.0)
        boundary_activations: list[float] = []
        # The analytic estimate reads a layer's kind and parameter count alone: blocks alike
        # share one (each table costs all its layers at once).
        analytic: dict[tuple[LayerKind, int], LayerTime] = {}
        layer_params = self.layer_params()

        for layer in range(model.num_planner_layers):
            measured = entry.layers.get(layer) if entry is not None else None
            measured_memory = memory_entry.layers.get(layer) if memory_entry is not None else None
            if measured is None:
                kind = model.layer_kind(layer)
                same = (kind, layer_params[layer])
                estimate = analytic.get(same)
                if estimate is None:
                    estimate = analytic[same] = analytic_layer_time(
                        model,
                        training,
                        device,
                        layer,
                        microbatch_size,
                        tp,
                        tp_comm_s if kind.value == "block" else 0.0,
                    )
                times.append(estimate)
            else:
                update_s = measured.update_s
                if update_s is None:  # not measured: the update is memory-bound, estimate it
                    update_s = analytic_layer_time(
                        model, training, device, layer, microbatch_size, tp, 0.0
                    ).update_s
                times.append(
                    LayerTime(
                        forward_s=max(0.0, measured.forward_s - call_forward_s) * scale,
                        backward_s=max(0.0, measured.backward_s - call_backward_s) * scale,
                        update_s=update_s * update_scale,
                        estimated=not exact,
                    )
                )
            measured_bytes = _activation_bytes(measured, sixteen_bit)
            memory_bytes = _activation_bytes(measured_memory, sixteen_bit)
            if measured_bytes is not None:
                activations.append(measured_bytes * memory_scale)
            elif memory_bytes is not None:
                activations.append(memory_bytes)
            else:
                activations.append(
                    memory.activation_bytes_per_microbatch(model, layer, microbatch_size, tp)
                )
            boundary = _boundary_activation_bytes(measured, sixteen_bit)
            if boundary is not None:
                boundary_activations.append(boundary * memory_scale)
            elif measured is None or measured.activation_bytes is None:
                boundary = _boundary_activation_bytes(measured_memory, sixteen_bit)
                boundary_activations.append(activations[-1] if boundary is None else boundary)
            else:
                boundary_activations.append(activations[-1])
        terms = self.state_terms(device_type)
        states = [
            layer_params[i] / tp * (terms.state + _cast_bytes(model, i, terms.cast_weights))
            for i in range(len(times))
        ]
        stage_update_s = entry.stage_update_s if entry is not None else None
        derived = (
            self._derived_from_tp1(device_type, microbatch_size, tp, tp_comm_s)
            if entry is None
            else None
        )
        if derived is not None:
            times, base = derived
            stage_update_s = base.stage_update_s / tp
            call_forward_s, call_backward_s = base.call_s, 0.0
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
            stage_update_s=(stage_update_s or 0.0) * update_scale,
            boundary_activation_prefix_bytes=(
                _prefix(boundary_activations) if boundary_activations != activations else None
            ),
            call_s=call_forward_s + call_backward_s,
        )
