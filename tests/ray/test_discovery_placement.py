"""Discovery rules (from ray.nodes() rows) and placement of workers on nodes of their type.

The rule tests read literal rows shaped like ``ray.nodes()``; the placement tests run on the
shared multi-node cluster and check where Ray actually put each actor.
"""

from __future__ import annotations

import pytest
import ray
from ray_plans import A100, L4, plan, tiny_job

from orchestrator.errors import SpecError
from orchestrator.runtime.discovery import (
    cluster_from_nodes,
    emulated_reference_speed,
    nodes_from_rows,
    slowdown_factor,
)
from orchestrator.runtime.group import WorkerGroup
from orchestrator.runtime.placement import bundle_requests, slots_for_plan
from orchestrator.spec.labels import ACCELERATOR_LABEL, DEVICE_TYPE_LABEL, NODE_ID_LABEL


def row(node_id: str, gpus: int = 0, cpus: int = 2, alive: bool = True, **labels: str) -> dict:
    resources = {"CPU": float(cpus)} | ({"GPU": float(gpus)} if gpus else {})
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": resources,
        "Labels": {k.replace("__", "/").replace("_", "-"): v for k, v in labels.items()},
    }


def test_device_type_from_project_label_then_ray_label_then_cpu() -> None:
    rows = [
        row("b", gpus=2, **{"orchestrator.io__device_type": "A100-80"}),
        row("a", gpus=4, **{"ray.io__accelerator_type": "L4"}),
        row("c", cpus=8),
        row("d", cpus=0),  # a head without work: no devices
        row("e", gpus=2, alive=False, **{"orchestrator.io__device_type": "A100-80"}),
    ]
    nodes = nodes_from_rows(rows)
    assert [(n.name, n.device_type, n.num_devices, n.uses_gpus) for n in nodes] == [
        ("A100-80-0", "A100-80", 2, True),
        ("L4-0", "L4", 4, True),
        ("cpu-0", "cpu", 8, False),
    ]
    assert [n.type_label for n in nodes] == [DEVICE_TYPE_LABEL, ACCELERATOR_LABEL, None]
    assert cluster_from_nodes(nodes).device_counts == {"A100-80": 2, "L4": 4, "cpu": 8}


def test_emulated_speeds_become_slowdown_factors() -> None:
    speed = "orchestrator.io__emulated_speed"
    nodes = nodes_from_rows(
        [
            row("a", gpus=1, **{"orchestrator.io__device_type": "A100-80", speed: "1.0"}),
            row("b", gpus=1, **{"orchestrator.io__device_type": "T4", speed: "0.25"}),
        ]
    )
    reference = emulated_reference_speed(nodes)
    assert reference == 1.0
    assert [slowdown_factor(n, reference) for n in nodes] == [1.0, 4.0]


def test_bad_speed_label_and_unlabelled_gpus_are_clear_errors() -> None:
    with pytest.raises(SpecError, match="positive relative speed"):
        nodes_from_rows([row("a", gpus=1, **{"orchestrator.io__emulated_speed": "fast"})])
    with pytest.raises(SpecError, match="no device-type label"):
        cluster_from_nodes(nodes_from_rows([row("a", gpus=1)]))


def test_bundles_select_by_the_label_their_type_was_found_by() -> None:
    nodes = nodes_from_rows(
        [
            row("n1", gpus=2, **{"orchestrator.io__device_type": "A100-80"}),
            row("n2", gpus=2, **{"ray.io__accelerator_type": "L4"}),
        ]
    )
    pinned = plan((4, [(0, 3, A100), (3, 6, L4)]))
    requests = bundle_requests(slots_for_plan(pinned), nodes)
    assert [r.label_selector for r in requests] == [
        {DEVICE_TYPE_LABEL: A100},
        {ACCELERATOR_LABEL: L4},
    ]
    assert all(r.resources == {"GPU": 1.0} for r in requests)
    raw = pinned.model_dump(mode="json")
    raw["replicas"][0]["stages"][1]["node"] = "L4-0"
    requests = bundle_requests(slots_for_plan(type(pinned).model_validate(raw)), nodes)
    assert requests[1].label_selector == {ACCELERATOR_LABEL: L4, NODE_ID_LABEL: "n2"}


def test_workers_land_on_nodes_of_their_device_type(ray_cluster: object) -> None:
    mixed = plan((6, [(0, 2, A100), (2, 4, L4), (4, 6, A100)]), (2, [(0, 6, L4)]))
    labels_by_node = {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}
    group = WorkerGroup(tiny_job())
    try:
        workers = group.launch(mixed)
        report = group.step()
    finally:
        group.stop()
    assert [w.device_type for w in workers] == [A100, L4, A100, L4]
    for w in workers:
        labels = labels_by_node[w.node_id]
        found = labels.get(DEVICE_TYPE_LABEL) or labels.get(ACCELERATOR_LABEL)
        assert found == w.device_type, (w, labels)
    # L4 nodes are labelled at half the A100 speed: their workers stretch compute 2x.
    assert [w.slowdown_factor for w in workers] == [1.0, 2.0, 1.0, 2.0]
    assert group.emulated and all(w.emulated for w in workers)
    assert len(report.stage_timings) == 4 and report.samples == 8


def test_pinned_stage_lands_on_its_node(ray_cluster: object) -> None:
    raw = plan((4, [(0, 6, A100)])).model_dump(mode="json")
    raw["replicas"][0]["stages"][0]["node"] = "A100-80-1"
    pinned = type(plan((4, [(0, 6, A100)]))).model_validate(raw)
    group = WorkerGroup(tiny_job())
    try:
        workers = group.launch(pinned)
    finally:
        group.stop()
    assert workers[0].node_name == "A100-80-1"
