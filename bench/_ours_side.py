"""Our side of bench/recovery.py: the elastic controller actor through one crash, one join and
one posted drain.

The controller actor (``orchestrator.runtime.elastic``) trains on the benchmark's cluster; this
driver polls it, SIGKILLs a node that hosts a worker once ``crash_at_step`` steps are committed
(``None``: no crash), adds a node once training has gone on after the recovery, posts a
preemption notice for a worker's node once the new plan has run, and reads the figures from the
controller's events (wall-clock times: the recovery event is recorded when the first step after
the failure completes) and its typed step updates.

The join is split into its parts: the node starting until Ray lists it, until the controller's
probe sees it, the switch decision, the warm-up of the joiner's actor (training goes on under
the old plan meanwhile), and the switch itself (training paused: re-formation and the first
step of the new plan). The drain: the notice posted -> the evacuation decided (the step in
flight finishes first) -> the first step of the plan without the node.
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
    crash_at_step: int | None,
    steps_before_join: int,
    join_kind: Any,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train the job with our controller actor; crash a worker's node (unless
    ``crash_at_step`` is None), later add a node, then drain one."""
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
    crash_at_step: int | None,
    steps_before_join: int,
    join_kind: Any,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if crash_at_step is not None:
        crashed = _crash(f, cluster, crash_at_step, limit_s, log)
        if "error" in crashed:
            return crashed
        figures.update(crashed)
    resumed = f.steps
    f.wait_until(lambda: f.steps >= resumed + steps_before_join, limit_s)
    joined = _join(f, cluster, join_kind, limit_s, log)
    figures.update(joined)
    if "join_to_step_s" in joined:
        figures.update(_drain(f, cluster, limit_s, log))
    return figures


def _crash(
    f: _Follower, cluster: Any, crash_at_step: int, limit_s: float, log: Callable[[str], None]
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
    figures["recovery_parts"] = _recovery_parts(f.status, crashed_at_s, event["time_s"])
    log(f"  ours: resumed {figures['recovery_s']:.1f} s after the crash")
    return figures


def _recovery_parts(
    status: Mapping[str, Any], crashed_s: float, first_step_s: float
) -> dict[str, Any]:
    """Seconds of each part of the recovery, from the controller's events (wall clock): the
    kill until the failure is seen, until the restore is chosen, the re-plan, the re-formation
    (its own parts from the launch event) and the first step."""
    seen = _first(status, crashed_s, "failure")
    chosen = _first(status, crashed_s, "recovery", "restore from")
    planned = _first(status, crashed_s, "plan_chosen", "plan chosen")
    launched = _first(status, crashed_s, "plan_chosen", "launched")
    parts: dict[str, Any] = {
        "events": [
            (round(e["time_s"] - crashed_s, 3), e["kind"], e["message"][:160])
            for e in status.get("events", [])
            if crashed_s <= e["time_s"] <= first_step_s + 0.01
        ]
    }
    marks = [("detect_s", seen), ("restore_chosen_s", chosen), ("replan_s", planned),
             ("reform_s", launched)]  # fmt: skip
    last = crashed_s
    for name, e in marks:
        if e is not None:
            parts[name] = e["time_s"] - last
            last = e["time_s"]
    parts["first_step_s"] = first_step_s - last
    if launched is not None:
        parts["reform"] = {
            k.removeprefix("reform_"): v
            for k, v in launched["data"].items()
            if k.startswith("reform_")
        }
    return parts


def _join(
    f: _Follower, cluster: Any, join_kind: Any, limit_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    joined_at_s = time.time()
    figures["samples_per_s_before"] = _median_rate([r for r in f.rates if r[0] < joined_at_s][-15:])
    cluster.add(join_kind)  # returns once Ray lists the node
    registered_s = time.time()
    log(f"  ours: added a node at step {f.steps}")
    f.wait_until(lambda: bool(_switches(f.status, joined_at_s)) or _skipped(f.status, joined_at_s),
                 limit_s)  # fmt: skip
    switched = _switches(f.status, joined_at_s)
    if not switched:
        decisions = _join_decisions(f.status, joined_at_s)
        figures["join_note"] = decisions[0]["message"] if decisions else "no join decision seen"
        return figures
    first_step_s = switched[0]["time_s"]
    figures["join_to_step_s"] = first_step_s - joined_at_s
    figures["join_lost_steps"] = 0.0  # a resize reads every layer from the running group
    figures["join_moved"] = _moved(f.status, joined_at_s)
    figures["join_parts"] = _join_parts(f.status, joined_at_s, registered_s, first_step_s, f.rates)
    at = f.steps
    f.wait_until(lambda: f.steps >= at + 15, 120.0)
    figures["samples_per_s_after"] = _median_rate([r for r in f.rates if r[0] > first_step_s][1:])
    return figures


def _first(status: Mapping[str, Any], since_s: float, kind: str, text: str = "") -> Any:
    for e in status.get("events", []):
        if e["kind"] == kind and e["time_s"] >= since_s and text in e["message"]:
            return e
    return None


def _join_parts(
    status: Mapping[str, Any],
    added_s: float,
    registered_s: float,
    first_step_s: float,
    rates: list[tuple[float, int, float]],
) -> dict[str, Any]:
    """Seconds of each part of the join, from the controller's events."""
    seen = _first(status, added_s, "node_joined")
    decided = next(iter(_join_decisions(status, added_s)), None)
    warming = _first(status, added_s, "warming")
    ready = _first(status, added_s, "warm_ready")
    launched = _first(status, added_s, "plan_chosen", "launched")
    parts: dict[str, Any] = {"node_start_s": registered_s - added_s}
    parts["join_events"] = [
        (round(e["time_s"] - added_s, 3), e["kind"], e["message"])
        for e in status.get("events", [])
        if e["time_s"] >= added_s and e["time_s"] <= first_step_s + 1.0
    ]
    if seen is not None:
        parts["probe_sees_s"] = seen["time_s"] - registered_s  # < 0: seen before add() returned
        parts["start_to_seen_s"] = seen["time_s"] - added_s
        if decided is not None:
            parts["decide_s"] = decided["time_s"] - seen["time_s"]
            parts["switch_rule"] = decided["message"]
            parts["switch_cost_used_s"] = decided["data"].get("switch_cost_s")
    start_of_switch_s = None
    if warming is not None and ready is not None:
        parts["warm_s"] = ready["time_s"] - warming["time_s"]
        parts["warm_parts"] = {
            k: ready["data"].get(k) for k in ("start_s", "import_s", "build_s", "total_s")
        }
        parts["steps_while_warming"] = sum(
            1 for t, _, _ in rates if warming["time_s"] < t < ready["time_s"]
        )
        start_of_switch_s = ready["time_s"]
    elif decided is not None:
        start_of_switch_s = decided["time_s"]
    if start_of_switch_s is not None:
        parts["switch_to_step_s"] = first_step_s - start_of_switch_s  # training paused
        if seen is not None:
            parts["seen_to_step_s"] = first_step_s - seen["time_s"]
    if launched is not None:
        parts["reform"] = {
            k.removeprefix("reform_"): v
            for k, v in launched["data"].items()
            if k.startswith("reform_")
        }
        parts["actors_started_at_switch"] = launched["data"].get("actors_started")
        parts["actors_warm"] = launched["data"].get("actors_warm")
        if start_of_switch_s is not None:
            parts["switch_to_launched_s"] = launched["time_s"] - start_of_switch_s
            parts["first_step_s"] = first_step_s - launched["time_s"]
    return parts


def _drain(
    f: _Follower, cluster: Any, limit_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """Post a preemption notice for a worker's node during a step; time the reaction."""
    at = f.steps
    f.wait_until(lambda: f.steps >= at + 5, limit_s)
    hosts = set(_worker_nodes())
    working = [n.node_id for n in cluster.alive_nodes() if n.node_id in hosts]
    if len(working) < 2:
        return {"drain_note": "fewer than two worker nodes: no drain measured"}
    victim = working[0]
    time.sleep(0.03)  # into the step in flight (a step takes about a tenth of a second here)
    posted_s = time.time()
    f.handle.actor.post_node_event.remote(victim, "preemption_notice", posted_s + 120.0)
    log(f"  ours: posted a preemption notice for {victim[:8]} at step {f.steps}")
    f.wait_until(lambda: _first(f.status, posted_s, "plan_chosen", "overhead") is not None,
                 limit_s)  # fmt: skip
    evacuating = _first(f.status, posted_s, "preemption_notice", "evacuating")
    first = _first(f.status, posted_s, "plan_chosen", "overhead")
    if evacuating is None:
        return {"drain_note": "no evacuation seen"}
    steps = [r for r in f.rates if r[0] < evacuating["time_s"]][-10:]
    figures: dict[str, Any] = {
        "drain_to_action_s": evacuating["time_s"] - posted_s,
        "step_s_at_drain": (
            (steps[-1][0] - steps[0][0]) / (steps[-1][1] - steps[0][1])
            if len(steps) >= 2 and steps[-1][1] > steps[0][1]
            else float("nan")
        ),
    }
    if first is not None:
        figures["drain_to_step_s"] = first["time_s"] - posted_s
        figures["drain_moved"] = _moved(f.status, posted_s)
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
