"""Tensor parallelism inside a two-type pipeline: a type's stages may run at the tp of its best
pipeline alone, within a node, where the cost model says the mix is faster.

Two "big" devices on one node (tp 2 possible) and one "small" device with 0.25 GiB: the model
(~0.8 GiB of fp32 Adam state over 6 planner layers) fits the big pair at tp 2 but not the small
device alone. A pipeline of the big pair at tp 2 for the first four layers and the small device
for the last two uses all three devices and beats tp 2 on the big pair alone.
"""

from __future__ import annotations

from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec

from .toy import cluster

MODEL = ModelSpec(
    name="m",
    num_layers=4,
    hidden_size=1024,
    num_heads=16,
    sequence_length=256,
    vocab_size=1024,
    dtype="fp32",
)


def _cluster() -> object:
    return cluster(
        ("big", 1, 2),
        ("small", 1, 1),
        memory_gib={"big": 0.5, "small": 0.25},
        inter_node_bandwidth_bytes_per_s=1e10,
    ).resolve()


def test_a_two_type_pipeline_takes_a_tp_2_stage() -> None:
    t = TrainingSpec(global_batch_size=8, microbatch_sizes=[1, 2], max_tensor_parallel=2)
    result = make_plan(_cluster(), MODEL, t, config=SearchConfig(sharded=False))
    shapes = [[(s.device_type, s.tp) for s in r.stages] for r in result.plan.replicas]
    assert [("big", 2), ("small", 1)] in shapes, shapes
    assert result.plan.num_devices == 3
    assert result.choices[1].startswith("tp: big tp 2"), result.choices
    # the big pair alone at tp 2 is slower (the plan uses the small device too)
    alone = result.baselines["fastest_type_only"]
    assert alone.estimate is not None
    assert result.estimate.step_time_s < alone.estimate.step_time_s


def test_without_tensor_parallelism_the_mix_is_not_planned_at_tp_2() -> None:
    t = TrainingSpec(global_batch_size=8, microbatch_sizes=[1, 2], max_tensor_parallel=1)
    result = make_plan(_cluster(), MODEL, t, config=SearchConfig(sharded=False))
    assert all(s.tp == 1 for r in result.plan.replicas for s in r.stages)
