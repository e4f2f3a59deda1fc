"""Exact layer splits and water-filled batch shares on literal numbers."""

from __future__ import annotations

import pytest

from orchestrator.costmodel import CostTables
from orchestrator.planner.batching import Group, assign_microbatches
from orchestrator.planner.partition import StageCosts, split_layers
from orchestrator.planner.templates import build_template, type_infos

from .toy import cluster, model, profiles, training


def _tables(blocks: int, speeds: dict[str, float], batch: int = 8):
    groups = [(t, 1, 8) for t in sorted(speeds)]
    c = cluster(*groups).resolve()
    m = model(blocks)
    t = training(batch)
    return c, m, t, CostTables.for_cluster(m, t, c, profiles(speeds, m.num_planner_layers))


def _stages(tables, types, cap=float("inf")):
    return [
        StageCosts(tables.table(t, 1, 1), 0.0, len(types) - i, cap) for i, t in enumerate(types)
    ]


def test_even_split_of_equal_layers() -> None:
    # 6 planner layers of 3 s each over 3 stages: 2 layers per stage, bottleneck 6 s.
    _, _, _, tables = _tables(4, {"fast": 1.0})
    split = split_layers(_stages(tables, ["fast"] * 3), 6)
    assert split is not None
    assert split.boundaries == (0, 2, 4, 6)
    assert split.bottleneck_s == pytest.approx(6.0)


def test_uneven_split_follows_speed() -> None:
    # 6 layers; fast costs 3 s/layer, slow 6 s/layer. Fast takes 4 (12 s), slow 2 (12 s):
    # bottleneck 12 s. Any other split is slower (fast 3 + slow 3 -> 18 s).
    _, _, _, tables = _tables(4, {"fast": 1.0, "slow": 2.0})
    split = split_layers(_stages(tables, ["fast", "slow"]), 6)
    assert split is not None
    assert split.boundaries == (0, 4, 6)
    assert split.bottleneck_s == pytest.approx(12.0)


def test_memory_cap_forces_a_slower_split() -> None:
    # Same 6 layers of 3 s on 2 stages; a cap of 2.5 layers' worth of memory (state + in-flight
    # activations) on stage 0 forbids its 3-layer share: the best feasible is 2 + 4 -> 12 s.
    _, _, _, tables = _tables(4, {"fast": 1.0})
    t = tables.table("fast", 1, 1)
    # Stage 0 holds 2 microbatches in flight; budget just above its first two layers.
    cap0 = t.memory_bytes(0, 2, 2) * 1.0001
    stages = [StageCosts(t, 0.0, 2, cap0), StageCosts(t, 0.0, 1, float("inf"))]
    split = split_layers(stages, 6)
    assert split is not None
    assert split.boundaries == (0, 2, 6)
    assert split.bottleneck_s == pytest.approx(12.0)


def test_no_split_when_nothing_fits() -> None:
    _, _, _, tables = _tables(2, {"fast": 1.0})
    assert split_layers(_stages(tables, ["fast", "fast"], cap=1.0), 4) is None
    assert split_layers(_stages(tables, ["fast"] * 5), 4) is None  # more stages than layers


def test_water_filling_gives_fast_replicas_more() -> None:
    # Whole-model replicas: fast 12 s per microbatch, slow 36 s. 8 microbatches:
    # fast gets 6 (72 s), slow 2 (72 s) -- both finish together.
    c, m, t, tables = _tables(2, {"fast": 1.0, "slow": 3.0})
    infos = type_infos(c, m, t)
    fast = build_template(tables, infos, (("fast", 1),), 1)
    slow = build_template(tables, infos, (("slow", 1),), 1)
    assert fast and slow
    counts = assign_microbatches([Group(fast, 1), Group(slow, 1)], 8)
    assert counts == [[6], [2]]
    # Two fast, one slow, 14 microbatches: fast 6 + 6, slow 2 (each finishes by 72 s).
    assert assign_microbatches([Group(fast, 2), Group(slow, 1)], 14) == [[6, 6], [2]]


def test_water_filling_adds_up_exactly() -> None:
    c, m, t, tables = _tables(2, {"fast": 1.0, "slow": 3.0})
    infos = type_infos(c, m, t)
    fast = build_template(tables, infos, (("fast", 1),), 1)
    slow = build_template(tables, infos, (("slow", 1),), 1)
    for total in range(3, 40):
        counts = assign_microbatches([Group(fast, 2), Group(slow, 1)], total)
        assert sum(map(sum, counts)) == total
        assert all(c >= 1 for row in counts for c in row)
