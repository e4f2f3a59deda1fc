"""A straggler on a real run: one emulated node throttled mid-run, then cooled down again.

The controller actor trains the tiny GPT with the real planner on two one-GPU pool nodes of one
type (a replica each, the batch split evenly). Mid-run the test throttles one node three times
slower through the actor (``emulate_slowdown``, emulation only): the controller must find it in
the step reports, re-plan with the measured speed and give that node less work (fewer samples,
or fewer layers of each sample in a pipeline); when the node runs at its labelled speed again,
it must notice from the step reports and give the node its share back (or, when the re-plan
left the node without work, try it again at its labelled speed after the cool-down). Nothing here
is a timing assertion: the order of events and the plans are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import ray
from elastic_helpers import add_pool_node, elastic_spec, remove_pool, tiny_job_spec

from orchestrator.control.events import RunEvent
from orchestrator.runtime.discovery import discover_nodes
from orchestrator.runtime.elastic.controller_actor import RunHandle
from orchestrator.runtime.elastic.updates import PlanApplied, StepDone
from orchestrator.runtime.jobs import worker_job
from orchestrator.runtime.profiling import profile_device_types
from orchestrator.spec.plan import Plan

THROTTLE = 3.0


def _work_on(plan: Plan, node_id: str) -> int:
    """Layer-samples per step on ``node_id``: each sample times the layers it runs there.

    Samples alone would miss a pipeline: a re-plan may put both nodes in one replica and give
    the slow node fewer layers of every sample instead of fewer samples.
    """
    return sum(
        r.batch_size * s.num_layers for r in plan.replicas for s in r.stages if s.node == node_id
    )


class _Follow:
    """The run's typed updates, gathered while waiting for a condition."""

    def __init__(self, handle: RunHandle) -> None:
        self.handle = handle
        self.plans: list[PlanApplied] = []
        self.events: list[RunEvent] = []
        self.steps: list[int] = []

    def until(self, predicate: Callable[[], bool], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            for u in self.handle.updates():
                if isinstance(u, PlanApplied):
                    self.plans.append(u)
                elif isinstance(u, StepDone):
                    self.steps.append(u.report.step)
                else:
                    self.events.append(u)
            if predicate():
                return
            if self.handle.wait(0.3):
                break
        seen = [f"{e.kind}: {e.message}" for e in self.events][-10:]
        raise AssertionError(f"not reached in {limit_s:.0f} s (or the run ended); events {seen}")

    def of_kind(self, kind: str) -> list[RunEvent]:
        return [e for e in self.events if e.kind == kind]


@pytest.mark.slow
def test_a_throttled_node_gets_less_work_and_gets_it_back_when_it_cools_down(
    ray_cluster, tmp_path: Path
):
    pool = "straggler"
    nodes = [add_pool_node(ray_cluster, pool) for _ in range(2)]
    # The planner plans from profiles measured on these nodes (emulated speed): the catalog's
    # T4 would compute this tiny model in microseconds, so no split of the batch would matter.
    job = tiny_job_spec(
        "elastic-straggler",
        2000,  # ended by the test once it has seen both changes
        elasticity={"switch_threshold": 0.0, "straggler_window_steps": 3},
        profiles=str(tmp_path / "profiles"),
    )
    ids = {n.node_id for n in nodes}
    pool_nodes = [n for n in discover_nodes() if n.node_id in ids]
    profile_device_types(
        worker_job(job, str(tmp_path / "job.yaml")), pool_nodes, [2], tmp_path / "profiles",
        tmp_path / "cache", out=lambda line: None, warmup=1, repeats=3,
    )  # fmt: skip
    handle = RunHandle.start(elastic_spec(job, pool))
    f = _Follow(handle)
    slow, other = nodes[1].node_id, nodes[0].node_id
    try:
        f.until(lambda: len(f.plans) >= 1 and len(f.steps) >= 6, 240.0)
        first = f.plans[0].plan
        assert _work_on(first, slow) == _work_on(first, other) > 0
        told = ray.get(handle.actor.emulate_slowdown.remote(slow[:12], THROTTLE))
        assert told["node_id"] == slow and told["ranks"], told

        f.until(lambda: len(f.plans) >= 2, 180.0)
        straggler = f.of_kind("straggler")
        seen = [f"{e.kind}: {e.message}" for e in f.events]
        assert straggler and {e.data["node"] for e in straggler} == {slow}, seen
        assert straggler[0].data["slowdown_factor"] > 1.3  # measured from the step reports
        assert f.plans[1].reason == "straggler"
        throttled = f.plans[1].plan
        assert _work_on(throttled, slow) < _work_on(first, slow)
        # The node stays throttled for a while under the new plan (its speed there is measured
        # over the first window after the launch), then cools down.
        at = len(f.steps)
        f.until(lambda: len(f.steps) >= at + 8, 120.0)
        assert f.of_kind("speedup") == [] and len(f.plans) == 2  # no flapping while slow

        ray.get(handle.actor.emulate_slowdown.remote(slow, 1.0))
        f.until(lambda: len(f.plans) >= 3, 180.0)
        seen = [f"{e.kind}: {e.message}" for e in f.events]
        if _work_on(throttled, slow) > 0:
            # Still working, so its step reports show it fast again.
            speedup = f.of_kind("speedup")
            assert speedup, seen
            assert speedup[0].data["node"] == slow and speedup[0].data["factor"] < 1.0
            assert f.plans[2].reason == "speedup", seen
        else:
            # Left without work (its share did not pay for its update), no step reports: it is
            # tried again at its labelled speed after the cool-down.
            readmit = f.of_kind("readmit")
            assert readmit and readmit[0].data["node"] == slow, seen
            assert f.plans[2].reason == "readmit", seen
        assert _work_on(f.plans[2].plan, slow) > _work_on(throttled, slow)
        # Each change went on from the step it reached: nothing lost or trained twice.
        assert f.steps == list(range(len(f.steps)))
        assert not f.of_kind("failure") and not f.of_kind("recovery")
    finally:
        handle.stop()
        remove_pool(ray_cluster, nodes)
