"""Placement: one bundle per worker, each on a node of its type; one placement group per plan
(:func:`place`) or one per worker (:func:`place_each`, so a lost node leaves the others valid).

Every bundle carries a label selector naming its device type (by the label key the discovery found
on that type's nodes), and, where the plan pins a stage to a node, that node's id. A bundle asks for
one ``GPU`` on GPU nodes and one ``CPU`` on CPU nodes: one worker per device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import SpecError, TransientError
from orchestrator.runtime.discovery import RayNode
from orchestrator.spec.labels import DEVICE_TYPE_LABEL, NODE_ID_LABEL
from orchestrator.spec.plan import Plan
from orchestrator.worker.topology import ranks_for_plan


@dataclass(frozen=True)
class WorkerSlot:
    """Where one rank must run: its device type and, if the plan pins it, a node name."""

    rank: int
    device_type: str
    node: str | None


def slots_for_plan(plan: Plan) -> list[WorkerSlot]:
    """One slot per rank, in the worker side's rank order (replica-major, then stage, then
    tensor-parallel position: a stage at tp ``n`` is ``n`` slots)."""
    return [WorkerSlot(s.rank, s.device_type, s.node) for s in ranks_for_plan(plan)]


@dataclass(frozen=True)
class BundleRequest:
    """The resources and the label selector of one bundle."""

    resources: dict[str, float]
    label_selector: dict[str, str]
    uses_gpus: bool


def bundle_requests(slots: Sequence[WorkerSlot], nodes: Sequence[RayNode]) -> list[BundleRequest]:
    """Bundles for ``slots`` on the live ``nodes``; an unknown type or node is a clear error."""
    by_type: dict[str, list[RayNode]] = {}
    for n in nodes:
        by_type.setdefault(n.device_type, []).append(n)
    by_name = {n.name: n for n in nodes}
    by_id = {n.node_id: n for n in nodes}
    out: list[BundleRequest] = []
    for slot in slots:
        typed = by_type.get(slot.device_type)
        if not typed:
            raise SpecError(
                f"rank {slot.rank} needs a {slot.device_type} device; the Ray cluster has "
                f"{', '.join(sorted(by_type)) or 'none'}",
                field="plan.replicas[].stages[].device_type",
                fix="re-plan for this cluster, or add nodes labelled "
                f"{DEVICE_TYPE_LABEL}={slot.device_type}",
            )
        selector = _type_selector(slot.device_type, typed)
        if slot.node is not None:
            # Plan files pin by node name; the controller's plans pin by Ray node id.
            node = by_name.get(slot.node) or by_id.get(slot.node)
            if node is None or node.device_type != slot.device_type:
                raise SpecError(
                    f"rank {slot.rank} is pinned to node {slot.node!r}, which is not a live "
                    f"{slot.device_type} node (live: {', '.join(sorted(by_name))})",
                    field="plan.replicas[].stages[].node",
                    fix="drop the node field or re-plan for this cluster",
                )
            selector[NODE_ID_LABEL] = node.node_id
        uses_gpus = any(n.uses_gpus for n in typed)
        resources = {"GPU": 1.0} if uses_gpus else {"CPU": 1.0}
        out.append(BundleRequest(resources, selector, uses_gpus))
    return out


def _type_selector(device_type: str, typed: Sequence[RayNode]) -> dict[str, str]:
    keys = {n.type_label for n in typed}
    if keys == {None}:
        return {}  # unlabelled CPU nodes: no label to select by; the CPU resource places them
    # One key for all nodes of the type if they agree; else the project's own label.
    key = next(iter(keys)) if len(keys) == 1 else DEVICE_TYPE_LABEL
    return {str(key): device_type}


@dataclass
class PlacedGroup:
    """A ready placement group and the node id each bundle landed on."""

    placement_group: Any
    bundle_node_ids: tuple[str, ...]
    requests: tuple[BundleRequest, ...]

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.placement_group)


class PlacementTimeoutError(TransientError):
    """The cluster could not host every worker in time (busy, or nodes are missing)."""


def _not_ready(requests: Sequence[BundleRequest], timeout_s: float) -> PlacementTimeoutError:
    """The error of a placement not ready in time, naming the bundles it asked for."""
    wanted = ", ".join(f"{r.resources}@{r.label_selector}" for r in requests)
    return PlacementTimeoutError(
        f"placement of {len(requests)} workers not ready after {timeout_s:.0f} s "
        f"(bundles: {wanted}); the cluster is busy or lacks matching nodes"
    )


def place(requests: Sequence[BundleRequest], timeout_s: float, name: str = "") -> PlacedGroup:
    """Create the placement group and wait until it is ready, or raise PlacementTimeoutError."""
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    pg = placement_group(
        [dict(r.resources) for r in requests],
        strategy="PACK",
        name=name,
        bundle_label_selector=[dict(r.label_selector) for r in requests],
    )
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise _not_ready(requests, timeout_s)
    # The table fills a moment after ready(); poll briefly rather than trusting the first read.
    deadline = time.monotonic() + 10.0
    while True:
        table = placement_group_table(pg)
        by_bundle = table.get("bundles_to_node_id", {})
        if len(by_bundle) == len(requests) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    node_ids = tuple(str(by_bundle.get(i, "")) for i in range(len(requests)))
    return PlacedGroup(pg, node_ids, tuple(requests))


def place_each(requests: Sequence[BundleRequest], timeout_s: float) -> list[PlacedGroup]:
    """One single-bundle placement group per request, created together; all ready or none.

    Raises PlacementTimeoutError (after removing the groups made) when one is not ready in time.
    """
    import ray
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    pgs = [
        placement_group(
            [dict(r.resources)], strategy="PACK", bundle_label_selector=[dict(r.label_selector)]
        )
        for r in requests
    ]
    if not pgs:
        return []
    ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=timeout_s)
    if len(ready) < len(pgs):
        for pg in pgs:
            remove_placement_group(pg)
        raise _not_ready(requests, timeout_s)
    out = []
    deadline = time.monotonic() + 10.0
    for pg, request in zip(pgs, requests, strict=True):
        while True:  # the table fills a moment after ready()
            node_id = placement_group_table(pg).get("bundles_to_node_id", {}).get(0)
            if node_id or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        out.append(PlacedGroup(pg, (str(node_id or ""),), (request,)))
    return out
