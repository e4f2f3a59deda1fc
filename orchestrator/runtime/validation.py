"""Checks that run before any actor starts: does the plan fit the model and the live cluster?"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.runtime.actor import WorkerJob
from orchestrator.runtime.discovery import RayNode, check_one_backend, cluster_from_nodes
from orchestrator.runtime.placement import bundle_requests, slots_for_plan
from orchestrator.spec.plan import Plan
from orchestrator.worker.model_api import build_model, check_layer_count
from orchestrator.worker.topology import check_supported


def validate_plan_for_cluster(
    plan: Plan, nodes: Sequence[RayNode], num_planner_layers: int | None = None
) -> None:
    """Raise a one-line :class:`~orchestrator.errors.SpecError` if the plan cannot run here.

    Checks: sharding levels the workers execute (``full`` is planned only; sharded stages at
    tp 1), one backend (no stages on both CPU and GPU nodes), device types known to the catalog,
    the layer count (when given), enough devices of every type, and pinned nodes that exist.
    """
    check_supported(plan)
    check_one_backend(plan, nodes)
    cluster = cluster_from_nodes(nodes)
    plan.check_against(
        plan.num_layers if num_planner_layers is None else num_planner_layers,
        cluster.device_counts,
    )
    bundle_requests(slots_for_plan(plan), nodes)


def validate_model(job: WorkerJob, num_planner_layers: int) -> None:
    """Import and call the model factory here; its layer count must be ``num_planner_layers``.

    Building the model object is cheap: a layered model builds layers only on request
    (``build_layer``), so no parameters are allocated in the driver. Token data is checked
    here too; a Hugging Face dataset is tokenized into its cache here, once, for every worker.
    """
    model = build_model(job.model_factory, dict(job.model_kwargs))
    check_layer_count(model, num_planner_layers)
    if job.data.get("token_file") is not None or job.data.get("hf_dataset") is not None:
        from orchestrator.worker.data import DataConfig, check_data

        check_data(DataConfig(**job.data), job.seed)


def validate_model_for_plan(job: WorkerJob, plan: Plan) -> int:
    """:func:`validate_model` against the plan's layer count; returns that count."""
    validate_model(job, plan.num_layers)
    return plan.num_layers
