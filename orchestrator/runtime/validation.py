"""Checks that run before any actor starts: does the plan fit the model and the live cluster?"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.runtime.discovery import RayNode, cluster_from_nodes
from orchestrator.runtime.placement import bundle_requests, slots_for_plan
from orchestrator.spec.plan import Plan
from orchestrator.worker.topology import check_supported


def validate_plan_for_cluster(
    plan: Plan, nodes: Sequence[RayNode], num_planner_layers: int | None = None
) -> None:
    """Raise a one-line :class:`~orchestrator.errors.SpecError` if the plan cannot run here.

    Checks: tensor-parallel degree, device types known to the catalog, the layer count (when
    given), enough devices of every type, and pinned nodes that exist.
    """
    check_supported(plan)
    cluster = cluster_from_nodes(nodes)
    plan.check_against(
        plan.num_layers if num_planner_layers is None else num_planner_layers,
        cluster.device_counts,
    )
    bundle_requests(slots_for_plan(plan), nodes)
