"""Which measured numbers cost a (device type, microbatch size, tp) that has no exact entry.

Without an entry at the microbatch size, the nearest measured one at the same tp is scaled; a
device type with no profile of the model borrows another type's entry, scaled by the two types'
speed ratio on a like-sized proxy model; a tp > 1 with no entry scales the type's tp-1 times by
the analytic tp ratio. Activation memory may come from another device type's entry (it depends on
the model and the runtime, not the GPU). Used by :class:`~.tables.CostTables` when it builds a
table.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from orchestrator.costmodel.compute import LayerTime, analytic_layer_time
from orchestrator.costmodel.layer_table import LayerTable
from orchestrator.spec.devices import DeviceType
from orchestrator.spec.model import LayerKind, ModelSpec, TrainingSpec
from orchestrator.spec.profiles import ProfileEntry, ProfileSet


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


class TableSources:
    """The entry lookups of :class:`~.tables.CostTables` (its attributes below)."""

    model: ModelSpec
    training: TrainingSpec
    device_types: dict[str, DeviceType]
    all_profiles: ProfileSet
    profiles: ProfileSet

    if TYPE_CHECKING:

        def table(
            self, device_type: str, microbatch_size: int, tp: int, recompute: bool = False
        ) -> LayerTable: ...

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
