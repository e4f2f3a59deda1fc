"""Exact contiguous layer split across a pipeline's stages.

Given the stages' device types (in order), each layer's cost on each, and each stage's memory cap,
find boundaries that minimise the bottleneck (the slowest stage's per-microbatch time) subject to
memory, every stage holding at least one layer.

For a candidate bottleneck ``T``, feasibility is decided exactly by a reachability pass: stage ``s``
may end at ``e`` if some end ``b`` of stage ``s - 1`` is reachable and layers ``[b, e)`` fit ``T``
and stage ``s``'s memory. From one start the fitting ends form an interval ``(b, f(b)]`` (time and
memory only grow with more layers), so each stage's reachable ends are a union of intervals, found
with a difference array in ``O(n)`` plus a bisection per start. (A greedy pass, each stage taking
as many layers as fit, is not exact when stages differ per layer: taking more can force a later
stage onto a layer that is slow on its device, and the non-empty stages cannot give it back.)
Where every single layer fits the stage, the union over a range of reachable starts is one range,
so a check costs a few bisections per stage.
Bisection over ``T`` finds the least feasible bottleneck to a relative precision of 1e-7 (each
found split's own bottleneck tightens the upper end), i.e. exactly for planning purposes; the
boundaries come from walking the reachable sets backwards.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.costmodel.tables import LayerTable

_RELATIVE_PRECISION = 1e-7
_MAX_BISECTIONS = 60


@dataclass(frozen=True)
class StageCosts:
    """What the split needs to know about one stage position."""

    table: LayerTable
    comm_s: float  # p2p seconds per microbatch added to this stage (sends forward and back)
    in_flight: int  # microbatches of activations held at peak
    memory_cap_bytes: float

    def __post_init__(self) -> None:
        # Read by every pass of the split's bisection: looked up once, not per pass.
        object.__setattr__(self, "memory_prefix", self.table.memory_prefix_bytes(self.in_flight))

    memory_prefix: list[float] = field(init=False, compare=False, repr=False)


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
    # The stage's calls cost table.call_s once, whatever layers it takes.
    own_s = budget_s - stage.comm_s - stage.table.call_s
    by_time = bisect_right(compute, compute[start] + own_s, lo=start) - 1
    mem = stage.memory_prefix
    by_memory = bisect_right(mem, mem[start] + stage.memory_cap_bytes, lo=start) - 1
    return min(by_time, by_memory, last_allowed)


Intervals = list[tuple[int, int]]  # disjoint, sorted, inclusive ranges of layer boundaries


def _largest_layer(stage: StageCosts) -> tuple[float, float]:
    """The largest single layer's seconds and bytes on this stage."""
    return stage.table.largest_layer(stage.in_flight)


def _merge(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _reachable(
    stages: list[StageCosts],
    num_layers: int,
    bottleneck_s: float,
    largest: list[tuple[float, float]],
) -> list[Intervals]:
    """``out[s]``: the ends ``e`` such that stages ``0..s`` can cover layers ``[0, e)``."""
    starts: Intervals = [(0, 0)]
    out: list[Intervals] = []
    for stage, (layer_s, layer_bytes) in zip(stages, largest, strict=True):
        ends: Intervals = []
        every_layer_fits = (
            layer_s <= bottleneck_s - stage.comm_s and layer_bytes <= stage.memory_cap_bytes
        )
        # _furthest_end's terms, read once per stage.
        compute = stage.table.compute_prefix_s
        own_s = bottleneck_s - stage.comm_s - stage.table.call_s
        mem, cap = stage.memory_prefix, stage.memory_cap_bytes
        for lo, hi in starts:
            hi = min(hi, num_layers - 1)
            if lo > hi:
                continue
            if every_layer_fits:
                # f(b) >= b + 1 for every start b and f never decreases, so the union of the
                # (b, f(b)] over [lo, hi] is the one range [lo + 1, f(hi)].
                ends.append((lo + 1, _furthest_end(stage, hi, bottleneck_s, num_layers)))
                continue
            for b in range(lo, hi + 1):
                f = min(
                    bisect_right(compute, compute[b] + own_s, b) - 1,
                    bisect_right(mem, mem[b] + cap, b) - 1,
                    num_layers,
                )
                if f > b:
                    ends.append((b + 1, f))
        starts = _merge(ends) if len(ends) > 1 else ends
        out.append(starts)
    return out


def _latest_before(intervals: Intervals, end: int) -> int | None:
    """The largest boundary in ``intervals`` below ``end``."""
    for lo, hi in reversed(intervals):
        if lo < end:
            return min(hi, end - 1)
    return None


def _boundaries(
    stages: list[StageCosts],
    num_layers: int,
    bottleneck_s: float,
    largest: list[tuple[float, float]] | None = None,
) -> list[int] | None:
    """Boundaries if every stage fits ``bottleneck_s`` and memory, else None.

    Walking back from the last stage, each stage starts at the latest reachable boundary below
    the current end; the furthest end from a start never decreases with the start, so if that one
    cannot reach the end no earlier one can (and reachability says one can).
    """
    if largest is None:
        largest = [st.table.largest_layer(st.in_flight) for st in stages]
    reach = _reachable(stages, num_layers, bottleneck_s, largest)
    last = reach[-1]
    if not last or last[-1][1] < num_layers:
        return None
    boundaries = [num_layers]
    end = num_layers
    for s in range(len(stages) - 1, 0, -1):
        start = _latest_before(reach[s - 1], end)
        if start is None or _furthest_end(stages[s], start, bottleneck_s, num_layers) < end:
            raise AssertionError("layer split: reachable end without a start")
        boundaries.append(start)
        end = start
    boundaries.append(0)
    return boundaries[::-1]


def _greedy(stages: list[StageCosts], num_layers: int, bottleneck_s: float) -> list[int] | None:
    """Boundaries from filling each stage in turn, or None. A found split is valid; None is not
    proof that none exists (see the module docstring), so it only speeds up the search."""
    p = len(stages)
    boundaries = [0]
    start = 0
    last_allowed = num_layers - p  # leave one layer for each later stage
    for stage in stages:
        last_allowed += 1
        # _furthest_end, inlined (the search's most frequent pass).
        table = stage.table
        compute = table.compute_prefix_s
        own_s = bottleneck_s - stage.comm_s - table.call_s
        end = bisect_right(compute, compute[start] + own_s, start) - 1
        mem = stage.memory_prefix
        by_memory = bisect_right(mem, mem[start] + stage.memory_cap_bytes, start) - 1
        if by_memory < end:
            end = by_memory
        if last_allowed < end:
            end = last_allowed
        if end <= start:
            return None
        boundaries.append(end)
        start = end
    return boundaries if start == num_layers else None


def _greedy_event(
    stages: list[StageCosts], num_layers: int, bottleneck_s: float
) -> tuple[list[int] | None, float]:
    """:func:`_greedy`, and where it fails the least budget above ``bottleneck_s`` at which its
    pass could change: the least, over the stages it filled with time the binding limit, of the
    budget that stage needs to take one more layer (inf where time bound none). Every stage's
    end is the same for any budget below it, so the pass fails there too."""
    p = len(stages)
    boundaries = [0]
    start = 0
    event = float("inf")
    for s, stage in enumerate(stages):
        last_allowed = num_layers - (p - 1 - s)  # leave one layer for each later stage
        table = stage.table
        compute = table.compute_prefix_s
        # As _furthest_end computes it, so the pass takes the same ends.
        own_s = bottleneck_s - stage.comm_s - table.call_s
        by_time = bisect_right(compute, compute[start] + own_s, lo=start) - 1
        mem = stage.memory_prefix
        by_memory = bisect_right(mem, mem[start] + stage.memory_cap_bytes, lo=start) - 1
        end = min(by_time, by_memory, last_allowed)
        if by_time == end and end < min(by_memory, last_allowed):
            event = min(event, compute[end + 1] - compute[start] + stage.comm_s + table.call_s)
        if end <= start or (s == p - 1 and end < num_layers):
            return None, event
        boundaries.append(end)
        start = end
    return boundaries, event


def _bisect_greedy(
    stages: list[StageCosts], num_layers: int, lo: float, hi: float, best: list[int]
) -> tuple[float, float, list[int]]:
    """:func:`_bisect` with the greedy check, skipping the budgets at which a failed pass would
    fail again (:func:`_greedy_event`): ``lo`` moves up to just below the next budget where
    the pass can change, so the narrowing ends once that budget is ``hi`` itself. Same answer
    as plain bisection, in fewer passes."""
    for _ in range(_MAX_BISECTIONS):
        if hi - lo <= _RELATIVE_PRECISION * hi:
            break
        mid = (lo + hi) / 2
        found, event = _greedy_event(stages, num_layers, mid)
        if found is None:
            # Fails on [mid, event): the least budget that may succeed is event or above.
            lo = max(mid, min(event, hi) * (1 - _RELATIVE_PRECISION / 4))
        else:
            hi, best = min(mid, _bottleneck_s(stages, found)), found
    return lo, hi, best


Check = Callable[[list[StageCosts], int, float], "list[int] | None"]


def _bisect(
    check: Check, stages: list[StageCosts], num_layers: int, lo: float, hi: float, best: list[int]
) -> tuple[float, float, list[int]]:
    """Narrow ``(lo, hi]`` (``check`` fails at ``lo``, succeeds at ``hi`` with ``best``)."""
    for _ in range(_MAX_BISECTIONS):
        if hi - lo <= _RELATIVE_PRECISION * hi:
            break
        mid = (lo + hi) / 2
        found = check(stages, num_layers, mid)
        if found is None:
            lo = mid
        else:
            # The found split's own bottleneck may lie well below the budget: bisect from there.
            hi, best = min(mid, _bottleneck_s(stages, found)), found
    return lo, hi, best


def _bottleneck_s(stages: list[StageCosts], boundaries: list[int]) -> float:
    """The slowest stage's per-microbatch seconds under ``boundaries``."""
    return max(
        st.table.compute_s(boundaries[i], boundaries[i + 1]) + st.comm_s
        for i, st in enumerate(stages)
    )


def _no_time_limit_s(stages: list[StageCosts], num_layers: int) -> float:
    """A budget no stage's time can exceed (every stage holding the whole model)."""
    return max(s.table.compute_s(0, num_layers) + s.comm_s for s in stages) * (1 + 1e-12)


def fits_memory(stages: list[StageCosts], num_layers: int) -> bool:
    """Whether :func:`split_layers` finds a split (memory alone decides it), without solving
    for the least bottleneck: the same greedy and exact checks at a budget time cannot bind."""
    if not stages or len(stages) > num_layers:
        return False
    hi = _no_time_limit_s(stages, num_layers)
    if _greedy(stages, num_layers, hi) is not None:
        return True
    largest = [st.table.largest_layer(st.in_flight) for st in stages]
    if _greedy_is_exact(stages, num_layers, hi, largest):
        return False  # every layer fits every stage: greedy fails only where no split fits
    return _boundaries(stages, num_layers, hi, largest) is not None


_MARGIN = 1e-9  # relative room that float rounding of the prefix sums cannot cross
_SCALE = 1e-6  # budgets and caps this small beside a stage's totals get no shortcut


def _greedy_is_exact(
    stages: list[StageCosts], num_layers: int, budget_s: float, largest: list[tuple[float, float]]
) -> bool:
    """Whether the greedy pass decides exactly if some split fits ``budget_s``: where every
    single layer fits every stage's time and memory (with a margin rounding cannot cross), the
    furthest end from any start lies beyond it and never decreases with the start, so each
    greedy end is at least the end of any fitting split at that stage, and the pass fails only
    where no split fits."""
    for stage, (layer_s, layer_bytes) in zip(stages, largest, strict=True):
        own_s = budget_s - stage.comm_s
        total_s = stage.table.compute_prefix_s[num_layers]
        if own_s < _SCALE * max(total_s, budget_s) or layer_s > own_s * (1 - _MARGIN):
            return False
        cap = stage.memory_cap_bytes
        total_bytes = stage.memory_prefix[num_layers]
        if cap < _SCALE * max(total_bytes, cap) or layer_bytes > cap * (1 - _MARGIN):
            return False
    return True


def split_layers(stages: list[StageCosts], num_layers: int) -> Split | None:
    """The split minimising the bottleneck, or None if no split fits in memory."""
    if not stages or len(stages) > num_layers:
        return None
    hi = _no_time_limit_s(stages, num_layers)
    largest = [st.table.largest_layer(st.in_flight) for st in stages]

    def exact(stages: list[StageCosts], num_layers: int, budget_s: float) -> list[int] | None:
        return _boundaries(stages, num_layers, budget_s, largest)

    # Fast path: bisect with the greedy check, then certify with one exact check just below the
    # greedy optimum; only where the greedy answer is beaten does the exact bisection run.
    greedy = _greedy(stages, num_layers, hi)
    if greedy is not None:
        lo, hi, best = _bisect_greedy(stages, num_layers, 0.0, hi, greedy)
        if _greedy_is_exact(stages, num_layers, lo, largest) and not _greedy(
            stages, num_layers, lo
        ):
            better = None  # no split at lo: where every layer fits, greedy fails only so
        else:
            better = exact(stages, num_layers, lo)
        if better is not None:
            _, _, best = _bisect(exact, stages, num_layers, 0.0, lo, better)
    else:
        # Greedy failed with time unbounded: where every layer fits every stage, memory rules
        # out every split (greedy is exact there), else the exact check decides.
        greedy_decides = _greedy_is_exact(stages, num_layers, hi, largest)
        found = None if greedy_decides else exact(stages, num_layers, hi)
        if found is None:
            return None  # memory rules out every split, whatever the time budget
        _, _, best = _bisect(exact, stages, num_layers, 0.0, hi, found)
    stage_s = tuple(
        stage.table.compute_s(best[i], best[i + 1]) + stage.comm_s for i, stage in enumerate(stages)
    )
    return Split(boundaries=tuple(best), stage_s=stage_s)
