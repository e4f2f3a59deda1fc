"""Why no plan fits: the real cause, with its figures.

The memory lower bound (training state plus one microbatch in flight per layer, against the
whole cluster) proves a shortfall when there is one. When the bound is met and still nothing
fits, the cause is one of these, checked in order and named with figures:

- the largest layer fits no device, even at the largest tensor-parallel degree the heads allow;
- too few devices for the pipeline depth the model needs (or ``max_pipeline_stages`` caps it);
- activations in flight: under 1F1B the first of ``p`` stages holds up to ``p`` microbatches,
  which for an even split is about one microbatch of the whole model's activations, on top of its
  share of the state, however deep the pipeline.

Pure: reads cost tables only. Sizes are printed in GiB, or in MiB below one GiB, so a message
never claims a shortfall of "0.0 GiB".
"""

from __future__ import annotations

import math

from orchestrator.costmodel.bound import memory_bound
from orchestrator.costmodel.tables import CostTables
from orchestrator.planner.templates import TypeInfo

GiB = 1024**3
MiB = 1024**2


def size_text(num_bytes: float) -> str:
    """``12.3 GiB``, or ``45.6 MiB`` below one GiB (a real shortfall never reads as 0.0)."""
    if abs(num_bytes) >= GiB:
        return f"{num_bytes / GiB:.1f} GiB"
    return f"{max(num_bytes / MiB, 0.1) if num_bytes > 0 else 0.0:.1f} MiB"


def _have(infos: dict[str, TypeInfo]) -> str:
    return "; ".join(
        f"{d}: {i.num_devices} x {size_text(i.memory_cap_bytes)} usable"
        for d, i in sorted(infos.items())
    )


def _tp_note(tables: CostTables, info: TypeInfo) -> str:
    """Why the tensor-parallel degree stops where it does, when the heads are the reason."""
    heads = tables.model.num_heads
    top = max(info.tp_options)
    wider = [t for t in (2, 4, 8, 16) if t > top and t <= info.devices_per_node]
    if wider and heads % wider[0] != 0 and wider[0] <= tables.training.max_tensor_parallel:
        return f" (tp {wider[0]} does not divide num_heads {heads})"
    return ""


def _min_depth(tables: CostTables, d: str, mbs: int, cap: float) -> int | None:
    """The fewest even-split stages whose every stage holds its state and one microbatch."""
    table = tables.table(d, mbs, 1)
    n = tables.model.num_planner_layers
    for p in range(1, n + 1):
        size = math.ceil(n / p)
        bounds = [(s, min(s + size, n)) for s in range(0, n, size)]
        if all(table.memory_bytes(a, b, 1) <= cap for a, b in bounds):
            return len(bounds)
    return None


def _first_stage_need(tables: CostTables, d: str, mbs: int, depth: int) -> tuple[float, float]:
    """(state, activations in flight) of the first of ``depth`` even stages under 1F1B."""
    table = tables.table(d, mbs, 1)
    n = tables.model.num_planner_layers
    end = math.ceil(n / depth)
    return table.state_bytes(0, end), depth * table.activation_bytes(0, end)


def explain(tables: CostTables, infos: dict[str, TypeInfo]) -> str:
    """One sentence naming why no plan fits, with the figures that show it."""
    bound = memory_bound(
        tables,
        {d: i.num_devices for d, i in infos.items()},
        {d: i.memory_cap_bytes for d, i in infos.items()},
        {d: list(i.tp_options) for d, i in infos.items()},
    )
    have = _have(infos)
    mbs = min(tables.training.microbatch_sizes)
    if bound.pipeline_shortfall_bytes > 0:
        return (
            f"one pipeline needs >= {size_text(bound.pipeline_need_bytes)} (training state "
            f"{size_text(bound.state_bytes)} + one microbatch of {mbs} in flight per layer "
            f"{size_text(bound.activation_bytes)}) and the whole cluster has "
            f"{size_text(bound.cluster_usable_bytes)} usable ({have}): missing "
            f"{size_text(bound.pipeline_shortfall_bytes)}"
        )
    if bound.layer_shortfall_bytes() > 0:
        parts = [
            f"{d}: its largest layer needs {size_text(need)} per device at tp "
            f"{max(infos[d].tp_options)}{_tp_note(tables, infos[d])}, has {size_text(cap)} usable "
            f"(missing {size_text(need - cap)})"
            for d, (need, cap) in sorted(bound.largest_layer_by_type.items())
        ]
        return "no device holds the largest layer: " + "; ".join(parts)
    return _depth_or_in_flight(tables, infos, mbs, have)


def _depth_or_in_flight(tables: CostTables, infos: dict[str, TypeInfo], mbs: int, have: str) -> str:
    """The bound is met: name the pipeline depth or the microbatches in flight."""
    cap_stages = tables.training.max_pipeline_stages
    # The type with the most memory per device is the one that needs the fewest stages.
    best = max(sorted(infos), key=lambda d: infos[d].memory_cap_bytes)
    cap = infos[best].memory_cap_bytes
    depth = _min_depth(tables, best, mbs, cap)
    total_devices = sum(i.num_devices for i in infos.values())
    if depth is not None and cap_stages is not None and depth > cap_stages:
        return (
            f"the model needs a pipeline of at least {depth} stages on {best} "
            f"({size_text(cap)} usable each) to hold its state and one microbatch of {mbs} per "
            f"layer, but max_pipeline_stages is {cap_stages}: raise max_pipeline_stages"
        )
    if depth is not None and depth > total_devices:
        return (
            f"too few devices for the pipeline depth: the model needs at least {depth} stages on "
            f"{best} ({size_text(cap)} usable each) and the cluster has {total_devices} devices "
            f"({have})"
        )
    depth = min(depth or total_devices, total_devices, cap_stages or total_devices)
    state, in_flight = _first_stage_need(tables, best, mbs, depth)
    return (
        f"activations in flight: under 1F1B the first of {depth} stages holds up to {depth} "
        f"microbatches of {mbs} at once ({size_text(in_flight)} of activations) beside its "
        f"training state ({size_text(state)}), {size_text(state + in_flight)} against "
        f"{size_text(cap)} usable per {best} device; deeper pipelines do not help, since each "
        f"stage's microbatches in flight grow as its layers shrink ({have})"
    )
