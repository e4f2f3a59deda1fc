"""A device type measured at tp 1 only is costed at tp 2 from that measurement, not from its
datasheet: otherwise a type measured far below its datasheet speed (an emulated device, a
throttled one, a slow software stack) looks many times faster at tp 2 than at tp 1, and the
planner picks a tensor-parallel plan that the devices then run many times slower."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import CostTables
from orchestrator.costmodel.compute import analytic_layer_time
from orchestrator.planner import make_plan
from orchestrator.spec import ModelSpec, TrainingSpec

from .toy import cluster, profiles

MODEL = ModelSpec(
    name="toy",
    num_layers=4,
    hidden_size=128,
    num_heads=4,
    sequence_length=64,
    vocab_size=256,
    dtype="fp32",
)
# Seconds per layer pass measured at tp 1: far above what the datasheet gives this shape.
MEASURED_S = 0.01


def _tables(training: TrainingSpec) -> tuple[CostTables, object]:
    c = cluster(("slow", 1, 2)).resolve()
    measured = profiles({"slow": MEASURED_S}, MODEL.num_planner_layers)
    return CostTables.for_cluster(MODEL, training, c, measured), c


def test_tp_2_times_are_the_measured_tp_1_times_scaled() -> None:
    training = TrainingSpec(global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=2)
    tables, _ = _tables(training)
    one, two = tables.table("slow", 1, 1), tables.table("slow", 1, 2)
    device = tables.device_types["slow"]
    datasheet = analytic_layer_time(MODEL, training, device, 2, 1, 2, 0.0)
    assert datasheet.forward_s < MEASURED_S / 20  # the datasheet is far off this measurement
    # A block at tp 2: about half its measured tp-1 time (plus its all-reduce), on the same scale.
    ratio = two.times[2].forward_s / one.times[2].forward_s
    assert 0.45 < ratio < 1.0
    assert two.times[2].estimated and not one.times[2].estimated
    assert two.compute_s(0, MODEL.num_planner_layers) > 0.45 * one.compute_s(
        0, MODEL.num_planner_layers
    )


def test_the_planner_does_not_pick_tp_for_a_datasheet_it_never_measured() -> None:
    # Two measured devices on one node: two tp-1 replicas and one tp-2 replica cost about the
    # same; with the tp-2 times from the datasheet the tp-2 replica looked ~20x faster.
    training = TrainingSpec(global_batch_size=8, microbatch_sizes=[1], max_tensor_parallel=2)
    _, c = _tables(training)
    measured = profiles({"slow": MEASURED_S}, MODEL.num_planner_layers)
    result = make_plan(c, MODEL, training, measured)
    tp1_step = 8 / 2 * MODEL.num_planner_layers * 3 * MEASURED_S  # 4 samples x 6 layers x 3 s
    assert result.estimate.step_time_s == pytest.approx(tp1_step, rel=0.5)
