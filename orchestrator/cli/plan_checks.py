"""Checks of a plan file against the cluster, model and training it is estimated or run with.

Each refusal is one :class:`~orchestrator.errors.SpecError` naming the plan's field and the fix.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpecError


def check_plan_fits(plan: Any, cluster: Any, model: Any, training: Any | None) -> None:
    """The global batch agrees with a training file (None: none given); tp fits the nodes and
    divides the heads; pinned nodes are of the stage's device type. (A replica batch below the
    microbatch size is not a mistake: that replica runs one smaller microbatch; a microbatch
    larger than every replica's batch is.)"""
    check_microbatch(plan)
    if training is not None:
        check_plan_precision(plan, training)
    if training is not None and plan.global_batch_size != training.global_batch_size:
        raise SpecError(
            f"the plan's global_batch_size ({plan.global_batch_size}) differs from the "
            f"training file's ({training.global_batch_size})",
            field="plan.global_batch_size",
            fix="make them equal, or re-plan with `orchestrator plan`",
        )
    max_devices: dict[str, int] = {}
    for node in cluster.nodes:
        name = node.device_type.name
        max_devices[name] = max(max_devices.get(name, 0), node.num_devices)
    for r, rep in enumerate(plan.replicas):
        for s, stage in enumerate(rep.stages):
            where = f"plan.replicas[{r}].stages[{s}]"
            if model.num_heads % stage.tp:
                raise SpecError(
                    f"tp {stage.tp} does not divide num_heads ({model.num_heads})",
                    field=f"{where}.tp",
                    fix="use a tensor-parallel degree that divides the number of heads",
                )
            most = max_devices.get(stage.device_type, 0)
            if most and stage.tp > most:
                raise SpecError(
                    f"tp {stage.tp} is above the {most} devices of a {stage.device_type} node",
                    field=f"{where}.tp",
                    fix="tensor parallelism stays inside one node; lower tp",
                )
            node = cluster.node_by_name.get(stage.node) if stage.node else None
            if node is not None and node.device_type.name != stage.device_type:
                raise SpecError(
                    f"pinned to node {stage.node}, a {node.device_type.name} node, but the stage "
                    f"is planned for {stage.device_type}",
                    field=f"{where}.node",
                    fix="pin it to a node of its device type, or drop the node field",
                )


def check_plan_precision(plan: Any, training: Any, field: str = "plan.precision") -> None:
    """A plan's recorded precision agrees with a ``training.precision`` that names a format
    (unset or ``auto``: the plan's is run)."""
    plan.check_precision(training.explicit_precision, field)


def check_microbatch(plan: Any, field: str = "plan.microbatch_size") -> None:
    """A microbatch no replica can fill: no replica would run it, and the plan's memory and time
    would be costed for microbatches that never exist."""
    largest = max(r.batch_size for r in plan.replicas)
    if plan.microbatch_size > largest:
        raise SpecError(
            f"microbatch_size {plan.microbatch_size} is larger than every replica's batch "
            f"(the largest is {largest})",
            field=field,
            fix=f"set microbatch_size to {largest} or less, or re-plan with `orchestrator plan`",
        )
