"""A pipeline shape that wins only once sharded is found even where an unsharded plan fits.

One node of four devices with 0.53 GiB each and 10 GB/s links; the model has six ~0.19 GiB blocks
(fp32 Adam) between a small embedding and head, 8 planner layers of 10 ms forward and 20 ms
backward per sample, no optimizer time, a batch of 8 microbatches. Unsharded, half the model
(0.58 GiB) does not fit a device, so the only unsharded plans are one pipeline of three or four
stages (a four-stage pipeline: 7 x 60 + 240 = 660 ms). Two two-stage pipelines fit with their
optimizer state sharded across the pair (0.51 GiB a device) and take 3 x 120 + 240 = 600 ms:
fewer bubbles, and a shape whose unsharded form does not fit (their collectives add ~13 ms).
Whole replicas on all four devices sharding ``full`` layer by layer would also fit and compute
in 2 x 240 = 480 ms, but gather and reduce ~0.7 GB every microbatch round, ~0.14 s a step on
these links: slower than the two pipelines.
"""

from __future__ import annotations

from orchestrator.costmodel import CostTables, estimate_with_tables
from orchestrator.planner import make_plan
from orchestrator.planner.selection import SearchConfig
from orchestrator.spec import ModelSpec, TrainingSpec
from orchestrator.spec.plan import Sharding

from .toy import cluster, profiles

LAYERS = 8
MODEL = ModelSpec(
    name="toy",
    num_layers=6,
    hidden_size=1024,
    num_heads=16,
    sequence_length=4,
    vocab_size=1024,
    dtype="fp32",
)
TRAINING = TrainingSpec(global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=1)


def test_a_shape_that_fits_only_sharded_beats_the_unsharded_plan_that_fits() -> None:
    c = cluster(
        ("dev", 1, 4), memory_gib={"dev": 0.53}, intra_node_bandwidth_bytes_per_s=10e9
    ).resolve()
    p = profiles({"dev": 0.01}, LAYERS)
    chosen = make_plan(c, MODEL, TRAINING, p)
    plain = make_plan(c, MODEL, TRAINING, p, SearchConfig(sharded=False))
    # the best unsharded plan fits: one four-stage pipeline
    assert [len(r.stages) for r in plain.plan.replicas] == [4]
    assert plain.estimate.fits
    # chosen: two two-stage pipelines, every stage sharded across the pair, and faster
    assert [len(r.stages) for r in chosen.plan.replicas] == [2, 2]
    stages = [s for r in chosen.plan.replicas for s in r.stages]
    assert all(s.sharding is not Sharding.NONE for s in stages), stages
    assert chosen.estimate.fits
    assert chosen.estimate.step_time_s < plain.estimate.step_time_s * 0.95
    # the same shape with nothing sharded does not fit
    tables = CostTables.for_cluster(MODEL, TRAINING, c, p)
    whole = chosen.plan.with_stages(lambda s: s.model_copy(update={"sharding": Sharding.NONE}))
    assert not estimate_with_tables(whole, c, tables).fits
    # the plan output says why: a shape that fits only sharded, faster than the unsharded plan
    line = chosen.choices[0]
    assert "on 4 of 4 pipeline stages" in line, line
    assert "this shape fits only sharded" in line, line
    assert f"{chosen.estimate.step_time_s * 1e3:.1f} ms a step" in line, line
    assert f"against {plain.estimate.step_time_s * 1e3:.1f} ms for the best unsharded" in line
    # the elastic search keeps every layer whole where an unsharded plan fits
    elastic = make_plan(c, MODEL, TRAINING, p, SearchConfig(sharded_only_if_needed=True))
    assert elastic.plan == plain.plan
