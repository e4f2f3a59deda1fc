"""Measure the elastic runtime's recovery and join figures on a local multi-node Ray cluster.

    .venv/bin/python tests/ray/elastic_measure.py [--steps 24] [--kill-at 6] [--join-at 14]

Starts its own cluster (head plus three one-GPU T4 nodes, fake GPUs, emulated speed; Ray's fast
health checks), trains the tests' tiny GPT with every layer replicated on every device, SIGKILLs
one node and later adds one, and prints: crash to the first completed step after it, the parts of
that time (failure seen, states read, relaunch), steps lost, join to the first step of the new
plan, and the mean step time before and after the join. Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from orchestrator.runtime.elastic.summary import RunSummary
from orchestrator.runtime.local_nodes import FAST_HEALTH_CHECKS, crash_node

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill-at", type=int, default=6)
    parser.add_argument("--join-at", type=int, default=14)
    args = parser.parse_args()
    os.environ.update(FAST_HEALTH_CHECKS)
    import ray
    from elastic_helpers import ReplicaPerDevice, add_pool_node, drive, elastic_spec, tiny_job_spec
    from ray.cluster_utils import Cluster

    from orchestrator.control.callbacks import ControllerCallback
    from orchestrator.runtime.elastic.session import build_session

    class Clocked(ControllerCallback):
        def __init__(self) -> None:
            self.steps: list[tuple[float, int, float]] = []  # (time, step, duration)
            self.plans: list[tuple[float, str]] = []
            self.events: list[tuple[float, str]] = []

        def on_step(self, report, predicted_step_s) -> None:  # type: ignore[no-untyped-def]
            self.steps.append((time.time(), report.step, report.step_duration_s))

        def on_plan(self, plan, predicted_step_s, bound_step_s, reason) -> None:  # type: ignore[no-untyped-def]
            self.plans.append((time.time(), reason))

        def on_event(self, event) -> None:  # type: ignore[no-untyped-def]
            self.events.append((time.time(), event.kind.value))

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    pool = "measure"
    nodes = [add_pool_node(cluster, pool) for _ in range(3)]
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    marks: dict[str, float] = {}
    try:
        job = tiny_job_spec(
            "elastic-measure",
            args.steps,
            elasticity={"switch_threshold": 0.0, "initial_backoff_s": 0.0, "poll_interval_s": 0.3},
        )
        session = build_session(elastic_spec(job, pool), serve=False)
        session.controller.planner = ReplicaPerDevice()
        clocked = Clocked()
        session.controller.journal.callbacks.append(clocked)

        def kill() -> None:
            marks["kill"] = time.time()
            crash_node(cluster, nodes[0])

        def join() -> None:
            add_pool_node(cluster, pool)
            marks["join"] = time.time()  # the node is registered with Ray when add_node returns

        drive(session, {args.kill_at: kill, args.join_at: join})
        summary = session.summary()
    finally:
        ray.shutdown()
        cluster.shutdown()
    report(summary, clocked, marks)


def first_after(times: list[tuple[float, str]], t0: float, kind: str) -> float:
    return next(t for t, k in times if t >= t0 and k == kind)


def report(summary: RunSummary, clocked, marks: dict[str, float]) -> None:  # type: ignore[no-untyped-def]
    kill_s, join_s = marks["kill"], marks["join"]
    after_kill = next(
        t for t, _, _ in clocked.steps if t > first_after(clocked.events, kill_s, "failure")
    )
    seen_s = first_after(clocked.events, kill_s, "failure") - kill_s
    restored_s = first_after(clocked.events, kill_s, "recovery") - kill_s
    relaunch = next(t for t, reason in clocked.plans if t > kill_s and reason == "failure")
    join_plan = next(t for t, reason in clocked.plans if t > join_s and reason == "join")
    after_join = next(t for t, _, _ in clocked.steps if t > join_plan)
    before = [d for t, _, d in clocked.steps if kill_s < t < join_s][1:]
    after = [d for t, _, d in clocked.steps if t > join_plan][1:]
    print(f"state: {summary.state}, steps {summary.steps}, failures {summary.failure_count}")
    print(f"crash -> first completed step after it: {after_kill - kill_s:.2f} s")
    print(
        f"  failure seen {seen_s:.2f} s after the crash; restore chosen at {restored_s:.2f} s; "
        f"new plan launched at {relaunch - kill_s:.2f} s"
    )
    print(f"steps lost: {summary.lost_steps_total}")
    print(f"join -> first step of the new plan: {after_join - join_s:.2f} s")
    print(
        f"mean step before the join (2 devices): {statistics.fmean(before):.3f} s; "
        f"after (3 devices): {statistics.fmean(after):.3f} s (emulated)"
    )
    print(f"measured switch costs: {[round(c, 2) for c in summary.switch_costs_s]} s")


if __name__ == "__main__":
    main()
