"""Uneven batch shares across replicas by water-filling, and the step time of a selection.

A replica whose stages take ``T_s`` per microbatch finishes ``m`` microbatches after
``(m - 1) * max_s T_s + sum_s T_s``. Water-filling gives every replica as many microbatches as it
can finish by a common deadline ``T`` and lowers ``T`` until the global batch no longer fits, so
fast replicas take larger shares and all replicas finish together.
"""

from __future__ import annotations

import heapq
import math

from orchestrator.costmodel import comm
from orchestrator.planner.templates import Template, TypeInfo

_BISECTIONS = 80


class Group:
    """``count`` identical replicas of one template (read only). A slotted class: the search
    builds one per selection it scores, where a frozen dataclass costs several times as much."""

    __slots__ = ("count", "template")

    def __init__(self, template: Template, count: int) -> None:
        self.template = template
        self.count = count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return self.template == other.template and self.count == other.count

    def __hash__(self) -> int:
        return hash((self.template, self.count))

    def __repr__(self) -> str:
        return f"Group(template={self.template!r}, count={self.count!r})"


def _microbatches_by(template: Template, deadline_s: float) -> int:
    """Microbatches one replica of ``template`` completes by ``deadline_s`` (0 if none)."""
    if deadline_s < template.sum_s:
        return 0
    return int((deadline_s - template.sum_s) / template.bottleneck_s) + 1


def pipeline_deadline_s(groups: list[Group], total_microbatches: int) -> float | None:
    """Least common deadline by which the groups finish ``total_microbatches`` (each replica at
    least one), or None when there are more replicas than microbatches."""
    replicas = sum(g.count for g in groups)
    if replicas == 0 or replicas > total_microbatches:
        return None
    shape = [(g.count, g.template.sum_s, g.template.bottleneck_s) for g in groups]

    def done_by(deadline_s: float) -> int:
        return sum(c * (int((deadline_s - s) / t) + 1) for c, s, t in shape if deadline_s >= s)

    lo = max(s for _, s, _ in shape)  # every replica runs at least one microbatch
    if done_by(lo) >= total_microbatches:
        return lo
    # Bracket from the continuous relaxation: with x = (T - s) / t, floor(x) + 1 lies in
    # (x, x + 1], so the deadline lies between the T solving sum c (x + 1) = M and the T solving
    # sum c x = M -- an interval at most one bottleneck wide.
    rate = sum(c / t for c, _, t in shape)
    offset = sum(c * s / t for c, s, t in shape)
    lo = max(lo, (total_microbatches - replicas + offset) / rate)
    hi = max(lo, (total_microbatches + offset) / rate) * (1 + 1e-12)
    while done_by(hi) < total_microbatches:  # guards float rounding only
        hi += max(t for _, _, t in shape)
    # The count steps up only where some replica finishes a microbatch (s + k t): where the
    # bracket holds few such instants, the least one that suffices is found among them by
    # bisection over the sorted instants, each taken a hair late (as the bisection over time
    # below ends a hair above the step).
    events = _finish_instants(shape, lo, hi)
    if events is not None and done_by(lo * _LATE) >= total_microbatches:
        return lo * _LATE  # the relaxation's end itself suffices
    if events is not None:
        first, last = 0, len(events)  # done_by fails before events[first], holds at events[last]
        while first < last:
            half = (first + last) // 2
            if done_by(events[half]) >= total_microbatches:
                last = half
            else:
                first = half + 1
        if last < len(events):
            return events[last]
        return hi
    for _ in range(_BISECTIONS):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        if done_by(mid) >= total_microbatches:
            hi = mid
        else:
            lo = mid
    return hi


_MAX_INSTANTS = 64
_LATE = 1 + 1e-12


def _finish_instants(
    shape: list[tuple[int, float, float]], lo: float, hi: float
) -> list[float] | None:
    """The instants ``s + k t`` in ``[lo, hi)`` at which some group's replicas finish a
    microbatch, each a relative 1e-12 late (so the floor in the count cannot round it below its
    step), sorted; None where there are more than ``_MAX_INSTANTS``."""
    out: list[float] = []
    for _, s, t in shape:
        k = max(0, math.ceil((lo - s) / t) - 1)
        while True:
            instant = (s + k * t) * _LATE
            if instant >= hi:
                break
            if instant >= lo:
                out.append(instant)
                if len(out) > _MAX_INSTANTS:
                    return None
            k += 1
    out.sort()
    return out


def assign_microbatches(groups: list[Group], total_microbatches: int) -> list[list[int]]:
    """Microbatches per replica, group by group, adding up to ``total_microbatches``."""
    deadline = pipeline_deadline_s(groups, total_microbatches)
    if deadline is None:
        raise ValueError("more replicas than microbatches")
    counts = [[_microbatches_by(g.template, deadline)] * g.count for g in groups]
    excess = sum(map(sum, counts)) - total_microbatches
    # Trim the excess from the replicas that would finish last, one microbatch at a time;
    # ties go to the later group and replica, deterministically.
    heap = [
        (-_finish_s(groups[gi].template, m), -gi, -ri)
        for gi, row in enumerate(counts)
        for ri, m in enumerate(row)
        if m > 1
    ]
    heapq.heapify(heap)
    while excess > 0:
        _, neg_gi, neg_ri = heapq.heappop(heap)
        gi, ri = -neg_gi, -neg_ri
        counts[gi][ri] -= 1
        excess -= 1
        if counts[gi][ri] > 1:
            finish = _finish_s(groups[gi].template, counts[gi][ri])
            heapq.heappush(heap, (-finish, neg_gi, neg_ri))
    return counts


def _finish_s(template: Template, microbatches: int) -> float:
    return (microbatches - 1) * template.bottleneck_s + template.sum_s


def allreduce_bandwidth(groups: list[Group], infos: dict[str, TypeInfo]) -> float:
    """Slowest link among all replicas: intra-node if every replica sits on one node."""
    used = {name for g in groups for name in g.template.usage}
    devices = sum(g.count * g.template.num_devices for g in groups)
    if len(used) == 1:
        info = infos[next(iter(used))]
        if devices <= info.devices_per_node:
            return info.intra_node_bandwidth_bytes_per_s
    return min(infos[name].network_share_bytes_per_s for name in used)


def selection_step_s(
    groups: list[Group], global_batch_size: int, infos: dict[str, TypeInfo]
) -> float | None:
    """Predicted step time of instantiating ``groups`` (None if infeasible)."""
    groups = [g for g in groups if g.count > 0]
    if not groups:
        return None
    mbs = groups[0].template.microbatch_size
    deadline = pipeline_deadline_s(groups, math.ceil(global_batch_size / mbs))
    if deadline is None:
        return None
    pipeline_s = max(_finish_s(g.template, _microbatches_by(g.template, deadline)) for g in groups)
    replicas = sum(g.count for g in groups)
    bandwidth = allreduce_bandwidth(groups, infos)
    tail_s = max(_tail_s(g.template, replicas, bandwidth) for g in groups)
    return pipeline_s + tail_s


def _tail_s(template: Template, replicas: int, bandwidth: float) -> float:
    """The template's slowest stage's gradient all-reduce among ``replicas`` plus its optimizer
    step, kept on the template per (replicas, bandwidth): the search scores each template in
    many selections of the same few sizes."""
    key = (replicas, bandwidth)
    found = template.tail_cache.get(key)
    if found is None:
        found = template.tail_cache[key] = max(
            comm.ring_allreduce_s(nbytes, replicas, bandwidth) + update_s
            for nbytes, update_s in zip(template.grad_bytes, template.update_s, strict=True)
        )
    return found
