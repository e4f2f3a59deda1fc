"""The fluid bound: a physical lower bound on step time.

Every sample must pass forward and backward through every layer somewhere. Let ``c[l][d]`` be the
fewest device-seconds per sample that layer ``l`` can take on a device of type ``d`` (best
microbatch size and tensor-parallel degree, no communication, no bubbles) and ``n[d]`` the number
of such devices. For any weights ``w[d] >= 0``, weighting each device's busy time by ``w[d]`` gives

    step_time >= B * sum_l min_d (w[d] c[l][d]) / sum_d (w[d] n[d])

(Lagrangian dual of the fractional assignment of layer work to device types; equality at the best
weights). With ``w[d] = 1 / sum_l c[l][d]`` and speed ratios that do not vary by layer, this is
"the best per-device sample rate summed over all devices". Weights are then improved by coordinate
ascent, so the bound stays valid where a type is relatively faster at some layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.costmodel.tables import CostTables

_ASCENT_FACTORS = (0.5, 0.8, 0.95, 1.05, 1.25, 2.0)
_ASCENT_ROUNDS = 40


@dataclass(frozen=True)
class FluidBound:
    step_time_s: float
    samples_per_s_by_type: dict[str, float]  # whole-model rate of one device of each type

    @property
    def throughput_samples_per_s(self) -> float:
        return 1.0 / self.step_time_s if self.step_time_s > 0 else float("inf")


def best_layer_cost_s(tables: CostTables, device_type: str, tp_options: list[int]) -> list[float]:
    """``c[l]``: least device-seconds per sample for each layer on ``device_type``."""
    num_layers = tables.model.num_planner_layers
    best = [float("inf")] * num_layers
    for mbs in tables.training.microbatch_sizes:
        for tp in tp_options:
            table = tables.table(device_type, mbs, tp)
            for layer, t in enumerate(table.times):
                best[layer] = min(best[layer], tp * (t.forward_s + t.backward_s) / mbs)
    return best


def _bound(
    costs: dict[str, list[float]], counts: dict[str, int], weights: dict[str, float]
) -> float:
    denom = sum(weights[d] * counts[d] for d in costs)
    if denom <= 0:
        return 0.0
    num_layers = len(next(iter(costs.values())))
    total = sum(min(weights[d] * costs[d][layer] for d in costs) for layer in range(num_layers))
    return total / denom


def fluid_bound(
    tables: CostTables,
    device_counts: dict[str, int],
    tp_options_by_type: dict[str, list[int]],
    global_batch_size: int,
) -> FluidBound:
    """Lower bound on the step time of any plan on these devices (see module docstring)."""
    types = sorted(d for d, n in device_counts.items() if n > 0)
    costs = {d: best_layer_cost_s(tables, d, tp_options_by_type.get(d, [1])) for d in types}
    weights = {d: 1.0 / sum(costs[d]) for d in types}
    best = _bound(costs, device_counts, weights)
    for _ in range(_ASCENT_ROUNDS):
        improved = False
        for d in types:
            for factor in _ASCENT_FACTORS:
                trial = dict(weights)
                trial[d] *= factor
                value = _bound(costs, device_counts, trial)
                if value > best * (1 + 1e-12):
                    best, weights, improved = value, trial, True
        if not improved:
            break
    return FluidBound(
        step_time_s=global_batch_size * best,
        samples_per_s_by_type={d: 1.0 / sum(costs[d]) for d in types},
    )


@dataclass(frozen=True)
class MemoryBound:
    """Least memory any plan needs, against what the cluster holds.

    Every layer's training state is held once per pipeline, and under 1F1B (or GPipe) every stage
    holds at least one microbatch of its layers' activations, so a pipeline holds at least
    ``state + activations of one microbatch`` summed over all layers, spread over at most all
    devices. Tensor parallelism does not lower the total (its ranks replicate part of the
    activations). Where the planner may recompute activations, each block counts only its input
    (a recomputing stage holds no more). And every layer must fit on one device at the largest
    tensor-parallel degree (recompute does not lower a single layer's need: while a block is
    recomputed its full activations are live).
    """

    pipeline_need_bytes: float  # state + one microbatch of activations, all layers
    state_bytes: float
    activation_bytes: float
    cluster_usable_bytes: float  # summed over every device
    # Per device type: (bytes its largest layer needs per device at its largest tp, usable bytes).
    largest_layer_by_type: dict[str, tuple[float, float]]

    @property
    def pipeline_shortfall_bytes(self) -> float:
        return self.pipeline_need_bytes - self.cluster_usable_bytes

    def layer_shortfall_bytes(self) -> float:
        """How much the largest layer lacks on the roomiest device type (<= 0: it fits one)."""
        return min(need - cap for need, cap in self.largest_layer_by_type.values())


def memory_bound(
    tables: CostTables,
    device_counts: dict[str, int],
    usable_bytes_by_type: dict[str, float],
    tp_options_by_type: dict[str, list[int]],
) -> MemoryBound:
    """The :class:`MemoryBound` at the smallest candidate microbatch size."""
    mbs = min(tables.training.microbatch_sizes)
    n = tables.model.num_planner_layers
    state = activations = float("inf")
    largest: dict[str, tuple[float, float]] = {}
    for d in sorted(device_counts):
        tps = tp_options_by_type.get(d, [1])
        for tp in tps:
            table = tables.table(d, mbs, tp, tables.training.activation_recompute)
            state = min(state, tp * table.state_bytes(0, n))
            activations = min(activations, tp * table.activation_bytes(0, n))
        top = tables.table(d, mbs, max(tps))
        need = max(top.memory_bytes(i, i + 1, 1) for i in range(n))
        largest[d] = (need, usable_bytes_by_type[d])
    return MemoryBound(
        pipeline_need_bytes=state + activations,
        state_bytes=state,
        activation_bytes=activations,
        cluster_usable_bytes=sum(usable_bytes_by_type[d] * k for d, k in device_counts.items()),
        largest_layer_by_type=largest,
    )
