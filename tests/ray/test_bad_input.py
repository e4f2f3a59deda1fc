"""A plan that cannot run is refused with one clear line before any actor or placement starts."""

from __future__ import annotations

import dataclasses

import pytest
import ray
from ray_plans import A100, L4, plan, tiny_job

from orchestrator.errors import SpecError
from orchestrator.runtime.group import WorkerGroup


def _cluster_objects() -> tuple[int, int]:
    """Actors and placement groups the cluster has ever had (dead ones included)."""
    # GCS tables, readable without the dashboard (private API, stable across Ray 2.x).
    actors = ray._private.state.state.actor_table(None)
    return len(actors), len(ray.util.placement_group_table())


@pytest.mark.parametrize(
    ("bad_plan", "job_changes", "message"),
    [
        (plan((4, [(0, 6, "H100")])), {}, "plan needs 1 H100 devices, the cluster has 0"),
        (
            plan(*[(1, [(0, 6, A100)]) for _ in range(5)]),
            {},
            "plan needs 5 A100-80 devices, the cluster has 4",
        ),
        (plan((4, [(0, 3, L4), (3, 5, L4)])), {}, "plan covers 5 planner layers"),
        (
            plan((4, [(0, 6, A100)])),
            {"model_factory": "no_such_package.models:make"},
            "cannot import module 'no_such_package.models'",
        ),
        (
            plan((4, [(0, 6, A100)])),
            {"model_factory": "orchestrator.models.gpt:no_such_factory"},
            "has no callable 'no_such_factory'",
        ),
    ],
    ids=["missing-type", "too-few-devices", "layer-count", "factory-module", "factory-name"],
)
def test_refused_before_any_actor_starts(
    ray_cluster: object, bad_plan: object, job_changes: dict[str, str], message: str
) -> None:
    before = _cluster_objects()
    group = WorkerGroup(dataclasses.replace(tiny_job(), **job_changes))
    with pytest.raises(SpecError) as info:
        group.launch(bad_plan)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and "fix:" in str(info.value)
    assert _cluster_objects() == before
