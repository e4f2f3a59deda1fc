"""Exact contiguous layer split across a pipeline's stages.

Given the stages' device types (in order), each layer's cost on each, and each stage's memory cap,
find boundaries that minimise the bottleneck (the slowest stage's per-microbatch time) subject to
memory. For a candidate bottleneck ``T`` a greedy pass decides feasibility exactly: each stage, in
order, takes as many layers as fit in ``T`` and in its memory (taking more never hurts the stages
after it, since their range only shrinks). Bisection over ``T`` then finds the least feasible
bottleneck to a relative precision of 1e-9, i.e. exactly for planning purposes.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from orchestrator.costmodel.tables import LayerTable

_RELATIVE_PRECISION = 1e-9
_MAX_BISECTIONS = 60


@dataclass(frozen=True)
class StageCosts:
    """What the split needs to know about one stage position."""

    table: LayerTable
    comm_s: float  # p2p seconds per microbatch added to this stage (sends forward and back)
    in_flight: int  # microbatches of activations held at peak
    memory_cap_bytes: float


@dataclass(frozen=True)
class Split:
    boundaries: tuple[int, ...]  # p + 1 values, 0 first and num_layers last
    stage_s: tuple[float, ...]  # per-microbatch seconds of each stage, comm included

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


def _furthest_end(stage: StageCosts, start: int, budget_s: float, last_allowed: int) -> int:
    """Largest end in (start, last_allowed] whose stage fits the time budget and memory."""
    compute = stage.table.compute_prefix_s
    by_time = bisect_right(compute, compute[start] + budget_s - stage.comm_s, lo=start) - 1
    mem = stage.table.memory_prefix_bytes(stage.in_flight)
    by_memory = bisect_right(mem, mem[start] + stage.memory_cap_bytes, lo=start) - 1
    return min(by_time, by_memory, last_allowed)


def _greedy(stages: list[StageCosts], num_layers: int, bottleneck_s: float) -> list[int] | None:
    """Boundaries if every stage fits ``bottleneck_s`` and memory, else None."""
    p = len(stages)
    boundaries = [0]
    start = 0
    for s, stage in enumerate(stages):
        last_allowed = num_layers - (p - 1 - s)  # leave one layer for each later stage
        end = _furthest_end(stage, start, bottleneck_s, last_allowed)
        if end <= start:
            return None
        if s == p - 1 and end < num_layers:
            return None
        boundaries.append(end)
        start = end
    return boundaries


def split_layers(stages: list[StageCosts], num_layers: int) -> Split | None:
    """The split minimising the bottleneck, or None if no split fits in memory."""
    if not stages or len(stages) > num_layers:
        return None
    hi = max(s.table.compute_prefix_s[num_layers] + s.comm_s for s in stages) * (1 + 1e-12)
    best = _greedy(stages, num_layers, hi)
    if best is None:
        return None  # memory rules out every split, whatever the time budget
    lo = 0.0
    for _ in range(_MAX_BISECTIONS):
        if hi - lo <= _RELATIVE_PRECISION * hi:
            break
        mid = (lo + hi) / 2
        found = _greedy(stages, num_layers, mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    stage_s = tuple(
        stage.table.compute_s(best[i], best[i + 1]) + stage.comm_s for i, stage in enumerate(stages)
    )
    return Split(boundaries=tuple(best), stage_s=stage_s)
