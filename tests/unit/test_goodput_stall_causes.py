"""The goodput benchmark's attribution of lost time (bench/_stall_causes.py) on a made-up run."""

from __future__ import annotations

from typing import Any

import pytest

from bench._stall_causes import breakdown, intervals


def _event(time_s: float, kind: str, **data: Any) -> dict[str, Any]:
    return {"time_s": time_s, "kind": kind, "message": kind, "data": data}


# A kill at 10 s: seen at 10.5, recovered at 11; the replacement seen and warming at 15, warm at
# 18, the switch's overhead measured at 19.
EVENTS = [
    _event(10.5, "failure"),
    _event(10.5, "failure", backoff_s=0.0),
    _event(11.0, "recovery", recovery_s=0.5),
    _event(15.0, "node_joined"),
    _event(15.0, "replan", trigger="join"),
    _event(15.0, "warming"),
    _event(18.0, "warm_ready"),
    _event(19.0, "plan_chosen", switch_cost_s=1.0),
]


def test_the_survivors_wait_for_the_replacement_is_boot() -> None:
    spans = intervals(EVENTS, [10.0])
    assert (11.0, 15.0, "boot") in spans
    assert (15.0, 18.0, "warm-up") in spans
    assert (18.0, 19.0, "switch") in spans


def test_boot_ends_at_the_next_kill_when_no_joiner_warms_first() -> None:
    events = [e for e in EVENTS if e["time_s"] < 12.0]
    spans = intervals(events, [10.0, 13.0])
    assert (11.0, 13.0, "boot") in spans


def test_slow_steps_while_waiting_for_the_replacement_count_as_boot_not_other() -> None:
    # One step a second at the reference; between 11 and 15 steps take 2 s (one node fewer).
    rows = [(float(t), t) for t in range(1, 11)] + [(11.0, 11), (13.0, 12), (15.0, 13)]
    rows += [(16.0 + i, 14 + i) for i in range(5)]
    lost = breakdown(rows, intervals(EVENTS, [10.0]), 11.0, 20.0, 1.0)
    assert lost["boot"] == pytest.approx(2.0)
    assert lost["other"] == pytest.approx(0.0)
