"""Invariants of the planner over random small clusters and models (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costmodel import estimate_plan
from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.spec import ClusterSpec, ModelSpec, Plan, TrainingSpec

TYPES = ["H100", "A100-40", "L4", "T4", "V100-16", "RTX-3090"]


@st.composite
def setups(draw):
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
    groups = [
        {
            "name": f"g{i}",
            "device_type": t,
            "num_nodes": draw(st.integers(1, 2)),
            "devices_per_node": draw(st.sampled_from([1, 2, 4])),
            "inter_node_bandwidth_bytes_per_s": draw(st.sampled_from([1e9, 12.5e9, 50e9])),
        }
        for i, t in enumerate(types)
    ]
    heads = draw(st.sampled_from([4, 8, 16]))
    model = ModelSpec(
        name="prop",
        num_layers=draw(st.integers(1, 24)),
        hidden_size=heads * draw(st.sampled_from([32, 64, 128])),
        num_heads=heads,
        sequence_length=draw(st.sampled_from([128, 512, 2048])),
        vocab_size=draw(st.sampled_from([256, 32000, 50257])),
        dtype=draw(st.sampled_from(["fp32", "bf16", "fp16"])),
    )
    batch = draw(st.integers(1, 96))
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3, unique=True))
    training = TrainingSpec(
        global_batch_size=batch,
        microbatch_sizes=[m for m in sizes if m <= batch] or [1],
        optimizer=draw(st.sampled_from(["adam", "sgd"])),
    )
    return ClusterSpec(node_groups=groups).resolve(), model, training


def _maybe_plan(cluster, model, training):
    try:
        return make_plan(cluster, model, training)
    except InfeasibleError:
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_plan_invariants(setup) -> None:
    cluster, model, training = setup
    result = _maybe_plan(cluster, model, training)
    if result is None:
        return
    plan, est = result.plan, result.estimate
    # The estimate never beats the physical bound.
    assert est.step_time_s >= result.bound.step_time_s * (1 - 1e-9)
    # Memory never exceeds any device's capacity.
    assert all(d.memory_bytes <= d.memory_capacity_bytes for d in est.devices)
    # Batch shares add up to the global batch, every replica covers every layer.
    assert sum(r.batch_size for r in plan.replicas) == training.global_batch_size
    assert all(r.num_layers == model.num_planner_layers for r in plan.replicas)
    # The plan uses no more devices of a type than exist.
    for name, n in plan.device_counts().items():
        assert n <= cluster.device_counts[name]
    # The JSON round-trips and re-costs to the same estimate.
    again = Plan.model_validate_json(plan.to_json())
    assert estimate_plan(again, cluster, model, training).step_time_s == est.step_time_s
    # Deterministic: the same inputs give the same bytes.
    assert make_plan(cluster, model, training).plan.to_json() == plan.to_json()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups(), st.data())
def test_any_plan_costs_at_least_the_bound(setup, data) -> None:
    """Random (not chosen) plans: the estimate of any plan is above the fluid bound."""
    cluster, model, training = setup
    layers = model.num_planner_layers
    devices = [(n.name, n.device_type.name) for n in cluster.nodes for _ in range(n.num_devices)]
    replicas, used = [], 0
    while used < len(devices) and len(replicas) < training.global_batch_size:
        depth = data.draw(st.integers(1, min(layers, len(devices) - used)))
        cuts = (
            sorted(
                data.draw(
                    st.lists(
                        st.integers(1, layers - 1),
                        min_size=depth - 1,
                        max_size=depth - 1,
                        unique=True,
                    )
                )
            )
            if depth > 1
            else []
        )
        bounds = [0, *cuts, layers]
        stages = [
            {
                "layers": [bounds[i], bounds[i + 1]],
                "device_type": devices[used + i][1],
                "node": devices[used + i][0],
            }
            for i in range(len(bounds) - 1)
        ]
        used += len(stages)
        replicas.append({"batch_size": 1, "stages": stages})
        if data.draw(st.booleans()):
            break
    extra = training.global_batch_size - len(replicas)
    replicas[0]["batch_size"] += extra
    plan = Plan(
        global_batch_size=training.global_batch_size,
        microbatch_size=min(training.microbatch_sizes),
        replicas=replicas,
    )
    from orchestrator.costmodel import CostTables, fluid_bound
    from orchestrator.planner.templates import type_infos

    est = estimate_plan(plan, cluster, model, training)
    tables = CostTables.for_cluster(model, training, cluster)
    infos = type_infos(cluster, model, training)
    bound = fluid_bound(
        tables,
        cluster.device_counts,
        {d: list(i.tp_options) for d, i in infos.items()},
        training.global_batch_size,
    )
    assert est.step_time_s >= bound.step_time_s * (1 - 1e-9)
