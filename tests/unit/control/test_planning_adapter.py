"""The controller's planner port on the real planner (pure: no Ray, no torch)."""

from __future__ import annotations

import pytest

from orchestrator.control.planning import MakePlanPlanner, derate, restore_type_names
from orchestrator.spec.model import ModelSpec, TrainingSpec
from orchestrator.spec.profiles import LayerTiming, ProfileEntry, ProfileFile, ProfileSet
from orchestrator.spec.snapshot import ClusterSnapshot, NodeInfo

MODEL = ModelSpec(
    name="gpt-small",
    num_layers=4,
    hidden_size=256,
    num_heads=4,
    sequence_length=128,
    vocab_size=1000,
)
TRAINING = TrainingSpec(global_batch_size=16, microbatch_sizes=[1, 2, 4])
SNAPSHOT = ClusterSnapshot.of(
    1, [NodeInfo("n-a100", "A100-80", 2), NodeInfo("n-t4a", "T4", 1), NodeInfo("n-t4b", "T4", 1)]
)


def test_plans_on_the_snapshot_with_the_real_planner():
    proposal = MakePlanPlanner(MODEL, TRAINING)(SNAPSHOT, {})
    plan = proposal.plan
    assert plan.num_layers == MODEL.num_planner_layers
    assert plan.global_batch_size == 16
    assert set(plan.device_counts()) <= {"A100-80", "T4"}
    assert proposal.predicted_step_s >= proposal.bound_step_s > 0
    nodes = {s.node for r in plan.replicas for s in r.stages}
    assert nodes <= SNAPSHOT.node_ids
    # Every stage's predicted busy seconds (the readmit verdict compares stages by them).
    assert set(proposal.predicted_stage_s) == {(r, s) for r, s, _ in plan.ranked_stages()}
    assert all(0 < v <= proposal.predicted_step_s for v in proposal.predicted_stage_s.values())


def test_a_slowed_node_is_planned_as_a_derated_type_and_named_back():
    cluster = SNAPSHOT.to_cluster()
    slowed, _ = derate(cluster, None, {"n-t4a": 4.0, "gone": 2.0})
    by_name = slowed.node_by_name
    assert by_name["n-t4a"].device_type.name == "T4~slow4.00"
    assert by_name["n-t4a"].device_type.flops_per_s(MODEL.dtype) == pytest.approx(
        cluster.node_by_name["n-t4a"].device_type.flops_per_s(MODEL.dtype) / 4
    )
    assert by_name["n-t4a"].device_type.memory_bytes == by_name["n-t4b"].device_type.memory_bytes
    assert by_name["n-t4b"].device_type.name == "T4"
    proposal = MakePlanPlanner(MODEL, TRAINING)(SNAPSHOT, {"n-t4a": 4.0})
    assert all("~" not in s.device_type for r in proposal.plan.replicas for s in r.stages)
    fast = MakePlanPlanner(MODEL, TRAINING)(SNAPSHOT, {})
    assert proposal.predicted_step_s >= fast.predicted_step_s


def test_profiles_of_a_slowed_type_are_stretched():
    timing = LayerTiming(forward_s=0.01, backward_s=0.02, update_s=0.001)
    profile = ProfileFile(
        model="gpt-small",
        device_type="T4",
        entries=[ProfileEntry(microbatch_size=1, layers=dict.fromkeys(range(6), timing))],
    )
    _, profiles = derate(SNAPSHOT.to_cluster(), ProfileSet([profile]), {"n-t4a": 3.0})
    entry = profiles.lookup("T4~slow3.00", 1, 1)
    assert entry is not None and entry.layers[2].backward_s == pytest.approx(0.06)
    assert profiles.lookup("T4", 1, 1).layers[2].backward_s == pytest.approx(0.02)


def test_restore_type_names_is_identity_on_plain_plans():
    plan = MakePlanPlanner(MODEL, TRAINING)(SNAPSHOT, {}).plan
    assert restore_type_names(plan) == plan


def test_the_running_plan_is_costed_as_the_search_costs_it_and_slower_on_a_slowed_node():
    planner = MakePlanPlanner(MODEL, TRAINING)
    proposal = planner(SNAPSHOT, {})
    assert planner.estimate(proposal.plan, SNAPSHOT, {}) == pytest.approx(
        proposal.predicted_step_s
    )
    used = sorted({s.node for r in proposal.plan.replicas for s in r.stages if s.node})
    slowed = planner.estimate(proposal.plan, SNAPSHOT, {used[0]: 4.0})
    assert slowed > proposal.predicted_step_s
    # A slowdown on a node the plan does not use changes nothing.
    assert planner.estimate(proposal.plan, SNAPSHOT, {"elsewhere": 4.0}) == pytest.approx(
        proposal.predicted_step_s
    )
