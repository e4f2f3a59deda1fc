"""Where the failure periods' training time went, by cause, from a run's events.

The time lost in a window is its wall time less what its committed steps would have taken at the
reference window's median step: every gap between committed steps counts its excess over one
reference step. Each gap's excess is shared among the causes whose intervals (from the
controller's events, wall clock) overlap it, in proportion to the overlap; what no interval
covers is ``other`` (steps slower than the reference for no recorded reason: the host's load).

Causes: ``detection`` (the kill -> the failure seen), ``backoff`` (the failure's wait before the
re-plan), ``recovery`` (re-plan, re-formation and the first step after it), ``boot`` (the
survivors training alone after the recovery until a joiner starts to warm: the schedule's wait
before the replacement starts, its node booting, the controller seeing it), ``warm-up`` (a
joiner's actor starting, importing torch and building its engine while training goes on),
``switch`` (the re-formation onto the joined node and the new plan's first step), ``checkpoint``
(reading and saving the layers). Their sum less the steps faster than the reference is the time
lost: failure seconds x (1 - goodput), up to the rounding of the committed counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

Row = tuple[float, int]
Interval = tuple[float, float, str]

CAUSES = (
    "detection", "backoff", "recovery", "boot", "warm-up", "switch", "checkpoint", "other",
)  # fmt: skip


def _next(
    events: Sequence[Mapping[str, Any]], after_s: float, test: Any
) -> Mapping[str, Any] | None:
    return next((e for e in events if e["time_s"] >= after_s and test(e)), None)


def _is_join(e: Mapping[str, Any]) -> bool:
    """A joiner starts to warm, or a join's switch is decided (one that needs no warm-up)."""
    return e["kind"] == "warming" or (e["kind"] == "replan" and e["data"].get("trigger") == "join")


def _is_overhead(e: Mapping[str, Any]) -> bool:
    return e["kind"] == "plan_chosen" and "switch_cost_s" in e["data"]


def intervals(events: Sequence[Mapping[str, Any]], kills_s: Sequence[float]) -> list[Interval]:
    """The causes' wall-time intervals of a run of ours."""
    events = sorted(events, key=lambda e: e["time_s"])
    out: list[Interval] = []
    for kill_s in kills_s:
        seen = _next(events, kill_s, lambda e: e["kind"] == "failure")
        if seen is None:
            continue
        out.append((kill_s, seen["time_s"], "detection"))
        retry = _next(events, seen["time_s"], lambda e: "backoff_s" in e["data"])
        backoff_s = float(retry["data"]["backoff_s"]) if retry is not None else 0.0
        out.append((seen["time_s"], seen["time_s"] + backoff_s, "backoff"))
        done = _next(
            events, seen["time_s"], lambda e: e["kind"] == "recovery" and "recovery_s" in e["data"]
        )
        if done is not None:
            out.append((seen["time_s"] + backoff_s, done["time_s"], "recovery"))
            # One node fewer until the replacement is seen and its joiner starts to warm (a
            # join that needs no warm-up: until its switch begins).
            joined = _next(events, done["time_s"], _is_join)
            later = [k for k in kills_s if k > kill_s]
            until_s = min([*later, joined["time_s"] if joined else float("inf")])
            out.append((done["time_s"], until_s, "boot"))
    for e in events:
        if e["kind"] == "warming":
            ready = _next(
                events, e["time_s"], lambda x: x["kind"] in ("warm_ready", "replan_skipped")
            )
            if ready is not None:
                out.append((e["time_s"], ready["time_s"], "warm-up"))
        if e["kind"] == "warm_ready" or (
            e["kind"] == "replan"
            and e["data"].get("trigger") == "join"
            and not any(
                w["kind"] == "warming" and 0 <= w["time_s"] - e["time_s"] < 1.0 for w in events
            )
        ):
            first = _next(events, e["time_s"], _is_overhead)
            if first is not None:
                out.append((e["time_s"], first["time_s"], "switch"))
        if e["kind"] == "checkpoint" and "duration_s" in e["data"]:
            out.append((e["time_s"] - float(e["data"]["duration_s"]), e["time_s"], "checkpoint"))
    return out


def breakdown(
    rows: Sequence[Row],
    spans: Sequence[Interval],
    since_s: float,
    until_s: float,
    step_s: float,
) -> dict[str, float]:
    """Seconds lost in ``[since_s, until_s]`` by cause, and ``faster`` (negative: steps quicker
    than the reference step ``step_s``)."""
    out = dict.fromkeys(CAUSES, 0.0)
    out["faster"] = 0.0
    inside = [r for r in rows if since_s < r[0] <= until_s]
    before = [r for r in rows if r[0] <= since_s]
    start: Row = (since_s, before[-1][1] if before else 0)
    gaps = list(itertools.pairwise([start, *inside]))
    last_t, last_d = inside[-1] if inside else start
    gaps.append(((last_t, last_d), (until_s, last_d)))  # the window ends in a gap
    for (a, da), (b, db) in gaps:
        if b <= a:
            continue
        normal_s = step_s * max(db - da, 0)  # what the steps committed here would take
        excess = (b - a) - normal_s
        if excess < 0:
            out["faster"] += excess
            continue
        overlaps: dict[str, float] = {}
        for s0, s1, cause in spans:
            o = min(b, s1) - max(a, s0)
            if o > 0:
                overlaps[cause] = overlaps.get(cause, 0.0) + o
        covered = min(sum(overlaps.values()), b - a)
        total = sum(overlaps.values())
        for cause, o in overlaps.items():
            out[cause] += excess * (covered / (b - a)) * (o / total)
        out["other"] += excess * (1.0 - covered / (b - a))
    return out


def step_slowdown(
    rows: Sequence[Row], spans: Sequence[Interval], cause: str, step_s: float
) -> tuple[float, int]:
    """Median time per committed step inside ``cause``'s intervals over the reference step,
    and the number of steps it is the median of (nan, 0 where none)."""
    gaps = []
    for (a, da), (b, db) in itertools.pairwise(rows):
        if db != da + 1:
            continue
        if any(s0 <= a and b <= s1 for s0, s1, c in spans if c == cause):
            gaps.append(b - a)
    gaps.sort()
    if not gaps or step_s <= 0:
        return float("nan"), 0
    return gaps[len(gaps) // 2] / step_s, len(gaps)
