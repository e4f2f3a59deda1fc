"""One device type's per-layer costs with prefix sums, and the same costs under recompute.

A :class:`LayerTable` holds, for a (device type, microbatch size, tp), every planner layer's
forward/backward/update seconds and memory; prefix sums make any contiguous stage's cost an O(1)
lookup, which the planner's partitioning relies on. :func:`recomputed_table` derives the table
of activation recompute on every block from the plain one. :class:`~.tables.CostTables` builds
and caches both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, pairwise

from orchestrator.costmodel import comm
from orchestrator.costmodel.compute import LayerTime
from orchestrator.spec.model import LayerKind, ModelSpec


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
