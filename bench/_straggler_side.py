"""The straggler part of bench/recovery.py: one node throttled mid-run, then cooled down.

The controller actor trains on the benchmark's cluster. Once ``steady_steps`` steps are
committed, this driver throttles one worker's node ``factor`` times slower through the actor's
``emulate_slowdown`` (emulation: it stands in for thermal throttling); once the controller has
re-planned and the new plan has run ``steady_steps`` steps, it cools the node down again.
Measured (wall clock, samples/s as the median over single steps):

- throttle -> the straggler event (detection) and -> the first step of the new plan;
- throughput before the throttle, throttled under the old plan, under the new plan, and the new
  plan's expected figure (its cost-model prediction times the run's calibration);
- cool-down -> the speed-up event and -> the first step of the plan that gives the node its work
  back, and the throughput after it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class _Follow:
    """The run's typed updates, with the wall time each was seen."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.steps: list[tuple[float, int, float]] = []  # (time seen, step, samples/s)
        self.plans: list[Any] = []  # PlanApplied
        self.events: list[Any] = []  # RunEvent (time_s: wall clock)

    def poll(self) -> bool:
        from orchestrator.runtime.elastic.updates import PlanApplied, StepDone

        done = self.handle.wait(0.05)
        now_s = time.time()
        for u in self.handle.updates():
            if isinstance(u, StepDone):
                self.steps.append((now_s, u.report.step, u.report.throughput_samples_per_s))
            elif isinstance(u, PlanApplied):
                self.plans.append(u)
            else:
                self.events.append(u)
        return bool(done)

    def until(self, predicate: Callable[[], bool], limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.poll():
                return predicate()
            if predicate():
                return True
        return False

    def first(self, kind: str, since_s: float) -> Any | None:
        return next((e for e in self.events if e.kind == kind and e.time_s >= since_s), None)

    def rate(self, start_s: float, end_s: float, skip: int = 1) -> float:
        """Median samples/s of the steps seen in [start_s, end_s), the first ``skip`` left out."""
        rates = [r for t, _, r in self.steps if start_s <= t < end_s][skip:]
        return statistics.median(rates) if rates else float("nan")

    def steps_since(self, since_s: float) -> int:
        return sum(1 for t, _, _ in self.steps if t >= since_s)


def run_straggler(
    job_file: Path,
    *,
    factor: float,
    steady_steps: int,
    global_batch: int,
    limit_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Train the job with our controller actor; throttle one worker's node, later cool it."""
    import ray

    from orchestrator.runtime.elastic.controller_actor import RunHandle
    from orchestrator.runtime.elastic.session import ElasticJob

    handle = RunHandle.start(ElasticJob.from_file(job_file))
    f = _Follow(handle)
    try:
        if not f.until(lambda: len(f.steps) >= 2 * steady_steps and bool(f.plans), limit_s):
            return {"error": "ours did not reach its steady steps"}
        node = _a_worker_node(f.plans[-1].plan)
        throttled_at_s = time.time()
        ray.get(handle.actor.emulate_slowdown.remote(node, factor))
        log(f"  straggler: node {node[:8]} throttled x{factor:g} at step {f.steps[-1][1]}")
        plans_before = len(f.plans)
        if not f.until(lambda: len(f.plans) > plans_before, limit_s):
            return {"error": "no re-plan after the throttle", **_events(f, throttled_at_s)}
        replanned = f.plans[-1]
        f.until(lambda: f.steps_since(replanned.time_s) >= steady_steps, limit_s)
        cooled_at_s = time.time()
        ray.get(handle.actor.emulate_slowdown.remote(node, 1.0))
        log(f"  straggler: node {node[:8]} back to its labelled speed at step {f.steps[-1][1]}")
        plans_throttled = len(f.plans)
        f.until(lambda: len(f.plans) > plans_throttled, limit_s)
        given_back = f.plans[-1] if len(f.plans) > plans_throttled else None
        if given_back is not None:
            f.until(lambda: f.steps_since(given_back.time_s) >= steady_steps, limit_s)
        end_s = time.time()
    finally:
        handle.stop()
    detected = f.first("straggler", throttled_at_s)
    replan = f.first("replan", throttled_at_s)
    calibration = float(replan.data["calibration"]) if replan is not None else float("nan")
    figures: dict[str, Any] = {
        "factor": factor,
        "detect_s": detected.time_s - throttled_at_s if detected else float("nan"),
        "measured_slowdown": float(detected.data["slowdown_factor"]) if detected else float("nan"),
        "throttle_to_new_plan_s": _first_step_after(f, replanned.time_s) - throttled_at_s,
        "samples_per_s_before": f.rate(throttled_at_s - 3600.0, throttled_at_s, skip=steady_steps),
        "samples_per_s_throttled": f.rate(throttled_at_s, replanned.time_s),
        "samples_per_s_new_plan": f.rate(replanned.time_s, cooled_at_s),
        "samples_per_s_expected": global_batch / (replanned.predicted_step_s * calibration),
        "switch_rule": (
            f"current {replan.data['current_step_s']:.3f} s/step, expected "
            f"{replan.data['expected_new_step_s']:.3f} (calibration {calibration:.2f})"
            if replan is not None
            else "n/a"
        ),
        "node_samples": f"{_samples_on(f.plans[0].plan, node)} -> "
        f"{_samples_on(replanned.plan, node)}",
    }
    sped_up = f.first("speedup", cooled_at_s)
    figures["cool_detect_s"] = sped_up.time_s - cooled_at_s if sped_up else float("nan")
    # A node the new plan left without work has no measurements: it is tried again after a
    # cool-down (policies/readmit.py); the try and its verdict are readmit events.
    readmits = [e for e in f.events if e.kind == "readmit" and e.time_s >= replanned.time_s]
    if readmits:
        figures["readmit_after_drop_s"] = readmits[0].time_s - replanned.time_s
        figures["readmit_events"] = [e.message for e in readmits]
    if given_back is not None:
        figures["cool_to_new_plan_s"] = _first_step_after(f, given_back.time_s) - cooled_at_s
        figures["samples_per_s_given_back"] = f.rate(given_back.time_s, end_s)
        figures["node_samples"] += f" -> {_samples_on(given_back.plan, node)}"
    return figures


def _a_worker_node(plan: Any) -> str:
    """The node of the plan's last replica (a worker's node, by Ray node id)."""
    node = plan.replicas[-1].stages[0].node
    assert node is not None, "the planner pins every stage to a node"
    return str(node)


def _samples_on(plan: Any, node: str) -> int:
    return sum(r.batch_size for r in plan.replicas if any(s.node == node for s in r.stages))


def _first_step_after(f: _Follow, since_s: float) -> float:
    return next((t for t, _, _ in f.steps if t >= since_s), float("nan"))


def _events(f: _Follow, since_s: float) -> dict[str, Any]:
    seen = [f"{e.kind}: {e.message}" for e in f.events if e.time_s >= since_s]
    return {"events": seen[-6:]}
