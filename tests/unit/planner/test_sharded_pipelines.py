"""Sharding inside pipelines: a stage's replicas shard its state where the cost model says it
pays or where the pipeline fits only sharded, and nowhere else.

A 4-block model of ~0.2 GiB blocks (fp32 Adam: 16 bytes a parameter) on one node of four
devices with free links, each planner layer taking 10 ms forward and 20 ms
backward per sample, so the arithmetic stays on compute, update and memory.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import InfeasibleError
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Plan, Sharding

from .toy import cluster, profiles

LAYERS = 6  # embedding, 4 blocks, head
MODEL = ModelSpec(
    name="toy",
    num_layers=4,
    hidden_size=1024,
    num_heads=16,
    sequence_length=4,
    vocab_size=1024,
    dtype="fp32",
)


def _levels(plan: Plan) -> list[list[str]]:
    return [[s.sharding.value for s in r.stages] for r in plan.replicas]


def test_a_pipeline_whose_update_sets_the_step_shards_across_its_replicas() -> None:
    # Two 2-stage pipelines (at most 2 stages; a batch of 2 rules out whole replicas over all
    # four devices): each stage spends 3 x 1 s on its optimizer step. Sharding a stage's state
    # across the two pipelines halves that for the same traffic.
    c = cluster(("dev", 1, 4)).resolve()
    t = TrainingSpec(
        global_batch_size=2, microbatch_sizes=[1], max_pipeline_stages=2, max_tensor_parallel=1
    )
    p = profiles({"dev": 0.01}, LAYERS, update_s=1.0)
    chosen = make_plan(c, MODEL, t, p)
    plain = make_plan(c, MODEL, t, p, SearchConfig(sharded=False))
    assert [len(r.stages) for r in plain.plan.replicas] == [2, 2]
    assert all(v == "none" for row in _levels(plain.plan) for v in row)
    assert [len(r.stages) for r in chosen.plan.replicas] == [2, 2]
    assert any(v != "none" for row in _levels(chosen.plan) for v in row), _levels(chosen.plan)
    # the optimizer step of a sharded stage is half the unsharded one's
    assert chosen.estimate.update_s < plain.estimate.update_s * 0.75
    assert chosen.estimate.step_time_s < plain.estimate.step_time_s
    line = chosen.choices[0]
    assert "pipeline stages (each across its pipeline's replicas)" in line, line
    assert f"{plain.estimate.step_time_s:.3f} s for the best unsharded plan" in line, line
    # the elastic search keeps every layer whole where an unsharded plan fits
    elastic = make_plan(c, MODEL, t, p, SearchConfig(sharded_only_if_needed=True))
    assert elastic.plan == plain.plan


def test_without_an_optimizer_step_to_save_the_pipelines_stay_unsharded() -> None:
    # Same cluster and shape, no update time: sharding the stages saves nothing, so the plan is
    # unsharded and the output names the sharded pipeline it costed.
    c = cluster(("dev", 1, 4)).resolve()
    t = TrainingSpec(
        global_batch_size=2, microbatch_sizes=[1], max_pipeline_stages=2, max_tensor_parallel=1
    )
    chosen = make_plan(c, MODEL, t, profiles({"dev": 0.01}, LAYERS, update_s=0.0))
    assert all(v == "none" for row in _levels(chosen.plan) for v in row)
    assert "sharded pipeline stages would take" in chosen.choices[0], chosen.choices
    assert "not faster" in chosen.choices[0]


def test_a_pipeline_that_fits_only_sharded_is_planned_sharded() -> None:
    # 0.36 GiB a device, at most 2 stages: half the model unsharded (~0.39 GiB) does not fit a
    # device, so no plan fits unsharded; a batch of 2 leaves no sample for whole replicas on
    # all four devices (fully sharded layer by layer, they would fit: test_layerwise_sharded).
    # Two 2-stage pipelines sharding optimizer state (and the fp32 copy it steps) over their
    # pair fit; sharding gradients too would save nothing at the peak on our runtime (a
    # pipeline's stages reduce after the backward), so the lighter level wins.
    c = cluster(("dev", 1, 4), memory_gib={"dev": 0.36}).resolve()
    t = TrainingSpec(
        global_batch_size=2,
        microbatch_sizes=[1],
        activation_recompute=False,
        max_tensor_parallel=1,
        max_pipeline_stages=2,
    )
    p = profiles({"dev": 0.01}, LAYERS, update_s=0.0)
    with pytest.raises(InfeasibleError):
        make_plan(c, MODEL, t, p, SearchConfig(sharded=False))
    for config in (SearchConfig(), SearchConfig(sharded_only_if_needed=True)):
        chosen = make_plan(c, MODEL, t, p, config)
        assert [len(r.stages) for r in chosen.plan.replicas] == [2, 2], _levels(chosen.plan)
        assert all(
            s.sharding is Sharding.OPTIMIZER for r in chosen.plan.replicas for s in r.stages
        ), _levels(chosen.plan)
        assert chosen.estimate.fits
        line = chosen.choices[0]
        assert "on 4 of 4 pipeline stages" in line and "no unsharded plan fits" in line, line
