"""Our side of bench/recovery.py: the elastic controller actor through one crash and one join.

The controller actor (``orchestrator.runtime.elastic``) trains on the benchmark's cluster; this
driver polls it, SIGKILLs a node that hosts a worker once ``crash_at_step`` steps are committed,
adds a node once training has gone on after the recovery, and reads the figures from the
controller's events (wall-clock times: the recovery event is recorded when the first step after
the failure completes) and its typed step updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def _worker_nodes() -> list[str]:
    """Node ids whose CPU is taken (by a worker's placement bundle); private Ray state API."""
    from ray._private.state import available_resources_per_node

    return [
        node_id
        for node_id, free in available_resources_per_node().items()
        if free.get("CPU", 0.0) < 1.0
    ]


class _Follower:
    """Follows the run's handle: typed step updates, committed steps, events."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.rates: list[tuple[float, int, float]] = []  # (wall time, steps done, samples/s)
        self.status: dict[str, Any] = {}

    def poll(self) -> bool:
        """One poll; True when the run ended."""
        from orchestrator.runtime.elastic.updates import StepDone

        done = self.handle.wait(0.1)
        now_s = time.time()
        for update in self.handle.updates():
            if isinstance(update, StepDone):
                rate = update.report.throughput_samples_per_s
                self.rates.append((now_s, update.report.step + 1, rate))
        self.status = self.handle.status().to_json()
        return bool(done)

    @property
    def steps(self) -> int:
        return int(self.status.get("steps", 0))

    def wait_until(self, predicate: Callable[[], bool], limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.poll():
                return predicate()
            if predicate():
                return True
        return False


def _median_rate(rows: list[tuple[float, int, float]]) -> float:
    rates = sorted(r for _, _, r in rows)
    return rates[len(rates) // 2] if rates else float("nan")


def run_ours(
    cluster: Any,
    job_file: Path,
    *,
    crash_at_step: int,
    steps_before_join: int,
    join_kind: Any,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train the job with our controller actor; crash a worker's node, later add a node."""
    from orchestrator.runtime.elastic.controller_actor import RunHandle
    from orchestrator.runtime.elastic.session import ElasticJob

    spec = ElasticJob.from_file(job_file)
    job = spec.job
    handle = RunHandle.start(spec)
    try:
        follower = _Follower(handle)
        return _drive(follower, cluster, job, crash_at_step, steps_before_join, join_kind,
                      limit_s, log)  # fmt: skip
    finally:
        handle.stop()


def _drive(
    f: _Follower,
    cluster: Any,
    job: Any,
    crash_at_step: int,
    steps_before_join: int,
    join_kind: Any,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    if not f.wait_until(lambda: f.steps >= crash_at_step, limit_s):
        return {"error": f"ours did not reach step {crash_at_step}: {f.status.get('reason')}"}
    hosts = set(_worker_nodes())
    alive = cluster.alive_nodes()
    victim = next((n for n in reversed(alive) if n.node_id in hosts), alive[-1])
    steps_at_crash = f.steps
    crashed_at_s = cluster.crash(victim)
    log(f"  ours: crashed node {victim.node_id[:8]} after step {steps_at_crash}")
    if not f.wait_until(lambda: bool(_recoveries(f.status, crashed_at_s)), limit_s):
        return {"error": f"ours did not recover: {f.status.get('reason')}"}
    event = _recoveries(f.status, crashed_at_s)[0]
    figures: dict[str, Any] = {
        "recovery_s": event["time_s"] - crashed_at_s,
        "detected_to_step_s": event["data"]["recovery_s"],
        "lost_steps": float(event["data"]["lost_steps"]),
        "last_step_before": float(steps_at_crash),
        "samples_per_s_before_crash": _median_rate(
            [r for r in f.rates if r[0] < crashed_at_s][-20:]
        ),
    }
    figures["recovery_moved"] = _moved(f.status, crashed_at_s)
    log(f"  ours: resumed {figures['recovery_s']:.1f} s after the crash")
    resumed = f.steps
    f.wait_until(lambda: f.steps >= resumed + steps_before_join, limit_s)
    joined_at_s = time.time()
    figures["samples_per_s_before"] = _median_rate([r for r in f.rates if r[0] < joined_at_s][-15:])
    cluster.add(join_kind)
    log(f"  ours: added a node at step {f.steps}")
    f.wait_until(lambda: bool(_switches(f.status, joined_at_s)) or _skipped(f.status, joined_at_s),
                 limit_s)  # fmt: skip
    switched = _switches(f.status, joined_at_s)
    if switched:
        figures["join_to_step_s"] = switched[0]["time_s"] - joined_at_s
        figures["join_lost_steps"] = 0.0  # a resize reads every layer from the running group
        figures["join_moved"] = _moved(f.status, joined_at_s)
        at = f.steps
        f.wait_until(lambda: f.steps >= at + 15, 120.0)
        figures["samples_per_s_after"] = _median_rate(
            [r for r in f.rates if r[0] > switched[0]["time_s"]][1:]
        )
    else:
        decisions = _join_decisions(f.status, joined_at_s)
        figures["join_note"] = decisions[0]["message"] if decisions else "no join decision seen"
    return figures


def _moved(status: Mapping[str, Any], since_s: float) -> str:
    """What the first launch since ``since_s`` kept and moved (ports that keep survivors)."""
    for e in status.get("events", []):
        if e["kind"] == "plan_chosen" and "bytes_moved" in e["data"] and e["time_s"] >= since_s:
            message = str(e["message"])
            return message.split("re-formed in place: ")[-1] if "re-formed" in message else "fresh"
    return "n/a"


def _recoveries(status: Mapping[str, Any], since_s: float) -> list[dict[str, Any]]:
    return [
        e
        for e in status.get("events", [])
        if e["kind"] == "recovery" and "recovery_s" in e["data"] and e["time_s"] >= since_s
    ]


def _join_decisions(status: Mapping[str, Any], since_s: float) -> list[dict[str, Any]]:
    return [
        e
        for e in status.get("events", [])
        if e["kind"] in ("replan", "replan_skipped")
        and e["data"].get("trigger") == "join"
        and e["time_s"] >= since_s
    ]


def _skipped(status: Mapping[str, Any], since_s: float) -> bool:
    return any(e["kind"] == "replan_skipped" for e in _join_decisions(status, since_s))


def _switches(status: Mapping[str, Any], since_s: float) -> list[dict[str, Any]]:
    """The first step of the plan chosen after a join: the event that measures its cost."""
    decisions = [e for e in _join_decisions(status, since_s) if e["kind"] == "replan"]
    if not decisions:
        return []
    return [
        e
        for e in status.get("events", [])
        if e["kind"] == "plan_chosen"
        and "switch_cost_s" in e["data"]
        and e["time_s"] >= decisions[0]["time_s"]
    ]
