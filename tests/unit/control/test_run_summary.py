"""A run's typed summary, built from a controller stepped on fakes, and its JSON form."""

from __future__ import annotations

import json

from control_fakes import make_harness

from orchestrator.control.events import ControllerStateName
from orchestrator.runtime.elastic.summary import summarise


class _Reports:
    """Collects committed steps as the session's progress callback does."""

    def __init__(self) -> None:
        self.reports: list = []

    def on_step(self, report, predicted_step_s) -> None:  # type: ignore[no-untyped-def]
        self.reports.append(report)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return lambda *args: None  # every other hook: nothing to do


def test_summary_of_a_run_with_one_crash():
    collected = _Reports()
    h = make_harness(
        [("a", "A100-80", 2), ("b", "A100-80", 2)],
        callbacks=(collected,),
        total_steps=12,
        checkpoint_interval_steps=4,
    )
    h.states_until(lambda c: c.next_step == 6)
    h.cluster.kill("b")
    h.states_until(lambda c: c.done)
    summary = summarise(h.controller, collected.reports, emulated=False, store=h.store)
    assert summary.finished and summary.state is ControllerStateName.FINISHED
    assert summary.steps == 12 and summary.steps_run == 12 and summary.failure_count == 1
    assert summary.step_indices == tuple(range(12))  # a surviving replica: no step lost
    assert len(summary.recoveries) == 1 and summary.recoveries[0].lost_steps == 0
    assert summary.checkpoint_step == 12
    data = json.loads(json.dumps(summary.to_json()))
    assert data["state"] == "finished" and data["recoveries"][0]["lost_steps"] == 0
    assert {"failure", "recovery", "finished"} <= {e["kind"] for e in data["events"]}
