"""Pipelines over three device types: one replica whose stages run on three types, each type's
stages contiguous, found where only it fits and where the cost model says it is fastest.

Three devices of three types ("a", "b", "c"), one each, free links. The model has six ~0.19 GiB
blocks (fp32 Adam: 16 bytes a parameter) between a small embedding and head: 1.16 GiB of training
state over 8 planner layers; activations are negligible (sequence 4).
"""

from __future__ import annotations

import itertools

import pytest

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.cluster import Cluster
from orchestrator.spec.plan import Plan, ReplicaSpec, StageSpec

from .toy import cluster, profiles

LAYERS = 8  # embedding, 6 blocks, head
MODEL = ModelSpec(
    name="toy",
    num_layers=6,
    hidden_size=1024,
    num_heads=16,
    sequence_length=4,
    vocab_size=1024,
    dtype="fp32",
)
# Seconds per layer and sample forward (twice that backward): "a" is the fastest.
SPEED = {"a": 0.001, "b": 0.002, "c": 0.003}
TRAINING = TrainingSpec(global_batch_size=8, microbatch_sizes=[1])


def _cluster(memory_gib: dict[str, float], bandwidth: float = 1e30) -> Cluster:
    return cluster(
        ("a", 1, 1),
        ("b", 1, 1),
        ("c", 1, 1),
        memory_gib=memory_gib,
        inter_node_bandwidth_bytes_per_s=bandwidth,
    ).resolve()


def _check_stages(plan: Plan, cluster_: Cluster, tables: CostTables) -> None:
    """One replica over all three types: each type's stages contiguous, layers contiguous and
    covering, every device's estimated memory under its capacity."""
    assert len(plan.replicas) == 1, plan
    stages = plan.replicas[0].stages
    types = [s.device_type for s in stages]
    assert sorted(set(types)) == ["a", "b", "c"], types
    runs = [t for t, _ in itertools.groupby(types)]
    assert len(runs) == 3, types  # each type's stages in one run
    assert stages[0].layers[0] == 0 and stages[-1].layers[1] == LAYERS
    for prev, nxt in itertools.pairwise(stages):
        assert prev.layers[1] == nxt.layers[0], [s.layers for s in stages]
    assert all(s.layers[0] < s.layers[1] for s in stages)
    est = estimate_with_tables(plan, cluster_, tables)
    assert est.fits
    for d in est.devices:
        assert d.memory_bytes <= d.memory_capacity_bytes, d


def test_a_model_that_fits_only_over_three_types_is_planned_over_all_three() -> None:
    # 0.40 + 0.45 + 0.50 GiB: no two devices hold the 1.16 GiB of state, all three do (two
    # blocks each); whole replicas fully sharded over the three, layer by layer, hold a third
    # of the state plus one block's whole weights and gradients (0.48 GiB), more than "a" or "b".
    c = _cluster({"a": 0.40, "b": 0.45, "c": 0.50})
    p = profiles(SPEED, LAYERS)
    result = make_plan(c, MODEL, TRAINING, p)
    _check_stages(result.plan, c, CostTables.for_cluster(MODEL, TRAINING, c, p))
    # without three-type replicas nothing fits
    with pytest.raises(InfeasibleError):
        make_plan(c, MODEL, TRAINING, p, SearchConfig(max_triple_depth_each=0))


def _one_and_two_type_plans(c: Cluster) -> list[Plan]:
    """Every plan of one or two device types on the three single devices: with one device a
    type, a plan is one pipeline over one or two of them (with every contiguous split), or
    holds a whole-model replica on one device (checked not to fit on its own)."""
    plans = []
    for n in (1, 2):
        for order in itertools.permutations(sorted(c.device_types), n):
            for cuts in itertools.combinations(range(1, LAYERS), n - 1):
                bounds = (0, *cuts, LAYERS)
                stages = tuple(
                    StageSpec(
                        layers=(bounds[i], bounds[i + 1]),
                        device_type=t,
                        node=c.nodes_of_type(t)[0].name,
                    )
                    for i, t in enumerate(order)
                )
                replica = ReplicaSpec(batch_size=TRAINING.global_batch_size, stages=stages)
                plans.append(
                    Plan(
                        global_batch_size=TRAINING.global_batch_size,
                        microbatch_size=1,
                        replicas=(replica,),
                    )
                )
    return plans


def test_a_three_type_pipeline_faster_than_every_one_and_two_type_plan_is_chosen() -> None:
    # 0.65 GiB each: any two devices hold the model, none alone. A pipeline over all three
    # types shares the compute three ways. Links of 10 GB/s: whole replicas fully sharded over
    # the three would fit (0.48 GiB) but gather and reduce ~0.6 GB in each microbatch round
    # (5 a step: "a" takes 5 of the 8 samples), slower than the pipeline.
    c = _cluster({"a": 0.65, "b": 0.65, "c": 0.65}, bandwidth=10e9)
    p = profiles(SPEED, LAYERS)
    tables = CostTables.for_cluster(MODEL, TRAINING, c, p)
    result = make_plan(c, MODEL, TRAINING, p)
    _check_stages(result.plan, c, tables)
    others = [estimate_with_tables(plan, c, tables) for plan in _one_and_two_type_plans(c)]
    # no device holds a whole replica, so every other one- or two-type plan is one of these
    assert not any(e.fits for e in others[:3])
    fitting = [e.step_time_s for e in others if e.fits]
    assert fitting, "some two-type pipeline fits"
    assert result.estimate.step_time_s < min(fitting) * 0.9, (result.estimate, min(fitting))
    # the search without three-type replicas plans one of the slower two-type pipelines
    without = make_plan(c, MODEL, TRAINING, p, SearchConfig(max_triple_depth_each=0))
    assert len({s.device_type for r in without.plan.replicas for s in r.stages}) <= 2
    assert without.estimate.step_time_s >= min(fitting) * (1 - 1e-9)


def test_two_type_clusters_plan_as_without_three_type_replicas() -> None:
    # Two types: the three-type candidates are never built, the plan is the same.
    c = cluster(("a", 1, 2), ("b", 1, 1), memory_gib={"a": 0.65, "b": 0.65}).resolve()
    p = profiles({"a": 0.001, "b": 0.002}, LAYERS)
    t = TrainingSpec(global_batch_size=8, microbatch_sizes=[1, 2])
    result = make_plan(c, MODEL, t, p)
    without = make_plan(c, MODEL, t, p, SearchConfig(max_triple_depth_each=0))
    assert result.plan == without.plan
    assert result.estimate.step_time_s == without.estimate.step_time_s
