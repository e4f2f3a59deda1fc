"""The search chooses sharded data parallel only where the cost model says it pays, and says
why in the plan's choices.

Cephalo's example (GPT-2.7B, sequence 512, fp16 weights, one each of L4, L4, A6000, P40, global
batch 64, the shipped Cephalo profiles): no whole replica fits any GPU unsharded; among
pipelines over at most two types the best is a pair of pipelines, and with gradients and
optimizer state sharded over the four every GPU holds a whole replica and the step is shorter;
one pipeline over the three types is shorter still. On a cluster of devices with memory to
spare, sharding saves nothing the step needs and its extra optimizer traffic is never faster, so
the plan stays unsharded.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.costmodel import estimate_plan
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.profiles.builtin import builtin_model, builtin_profiles
from orchestrator.spec import ClusterSpec, Dtype, Plan, TrainingSpec
from orchestrator.spec.plan import Sharding

from .toy import cluster, model, profiles, training

DEVICES = ["L4", "L4", "A6000", "P40"]


def _cephalo() -> tuple[object, object, TrainingSpec, object]:
    m = builtin_model("GPT-2.7B-s512").model_copy(update={"dtype": Dtype.FP16})
    c = ClusterSpec(
        node_groups=[
            {"name": f"n{i}-{d.lower()}", "device_type": d, "num_nodes": 1, "devices_per_node": 1}
            for i, d in enumerate(DEVICES)
        ]
    ).resolve()
    t = TrainingSpec(global_batch_size=64, microbatch_sizes=[1, 2, 4, 8])
    return m, c, t, builtin_profiles("GPT-2.7B-s512")


def test_cephalo_example_shards_uses_every_gpu_and_beats_cephalos_split() -> None:
    m, c, t, p = _cephalo()
    # Pipelines over two types at most: sharded over the four beats every pipeline.
    two = SearchConfig(max_triple_depth_each=0)
    sharded = make_plan(c, m, t, p, two)
    unsharded = make_plan(c, m, t, p, replace(two, sharded=False))
    assert sharded.plan.num_devices == 4
    assert all(s.sharding is not Sharding.NONE for r in sharded.plan.replicas for s in r.stages)
    assert sharded.estimate.step_time_s < unsharded.estimate.step_time_s
    level = sharded.plan.replicas[0].stages[0].sharding.value
    assert sharded.choices[0].startswith(f"sharding: {level} over 4 devices"), sharded.choices
    assert f"{unsharded.estimate.step_time_s:.3f} s for the best unsharded" in sharded.choices[0]
    # The default search also builds pipelines over three types: one over A6000, P40 and the
    # two L4s is faster still, unsharded, and the output says the sharded split was slower.
    chosen = make_plan(c, m, t, p)
    assert chosen.plan.num_devices == 4
    assert chosen.estimate.step_time_s < sharded.estimate.step_time_s
    assert len(chosen.plan.replicas) == 1
    assert {s.device_type for s in chosen.plan.replicas[0].stages} == {"A6000", "L4", "P40"}
    assert not any(s.sharding is not Sharding.NONE for s in chosen.plan.replicas[0].stages)
    assert (
        f"over every device would take {sharded.estimate.step_time_s:.3f} s a step, not faster"
        in chosen.choices[0]
    ), chosen.choices
    # Cephalo's own split [13, 12, 34, 5], costed by the same model at each level that fits
    layers = m.num_planner_layers
    splits = []
    for level in ("optimizer", "gradients", "full"):
        for mbs in (1, 2, 4):
            plan = Plan(
                global_batch_size=64,
                microbatch_size=mbs,
                replicas=[
                    {
                        "batch_size": b,
                        "stages": [
                            {
                                "layers": [0, layers],
                                "device_type": d,
                                "node": n.name,
                                "sharding": level,
                            }
                        ],
                    }
                    for b, d, n in zip([13, 12, 34, 5], DEVICES, c.nodes, strict=True)
                ],
            )
            est = estimate_plan(plan, c, m, t, p)
            if est.fits:
                splits.append(est.step_time_s)
    assert splits and chosen.estimate.step_time_s <= min(splits)


def test_a_slow_network_keeps_the_plan_unsharded_and_the_output_says_why() -> None:
    # Four 1-device nodes with memory to spare on a very slow network: sharding would save 3/4
    # of the 2 s update, but a whole replica per device must all-reduce (and, sharded, gather)
    # every layer over the network, far longer than the pipelined plan the search keeps.
    c = cluster(("fast", 4, 1), inter_node_bandwidth_bytes_per_s=1e1).resolve()
    result = make_plan(c, model(2), training(8), profiles({"fast": 1.0}, 4, 0.5))
    assert all(s.sharding is Sharding.NONE for r in result.plan.replicas for s in r.stages)
    assert result.choices[0].startswith("sharding: none (sharded data parallel at"), result.choices
    assert "not faster" in result.choices[0]
    assert result.choices[1].startswith("tp: 1 on every stage")


def test_fp16_training_is_not_planned_sharded() -> None:
    m, c, t, p = _cephalo()
    fp16 = t.model_copy(update={"precision": Dtype.FP16})
    result = make_plan(c, m, fp16, p)
    assert all(s.sharding is Sharding.NONE for r in result.plan.replicas for s in r.stages)
    assert "fp16 loss scaling" in result.choices[0]


def test_an_elastic_search_keeps_layers_whole_where_an_unsharded_plan_fits() -> None:
    # The controller's planner asks for sharding only where memory forces it: on Cephalo's
    # example the pipelines fit, so the elastic run keeps every layer whole on some rank.
    m, c, t, p = _cephalo()
    elastic = make_plan(c, m, t, p, SearchConfig(sharded_only_if_needed=True))
    unsharded = make_plan(c, m, t, p, SearchConfig(sharded=False))
    assert all(s.sharding is Sharding.NONE for r in elastic.plan.replicas for s in r.stages)
    assert elastic.plan == unsharded.plan
    assert "keeps every layer whole on a survivor" in elastic.choices[0], elastic.choices
