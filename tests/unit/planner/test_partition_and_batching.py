"""Exact layer splits and water-filled batch shares on literal numbers."""

from __future__ import annotations

import itertools

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


def _literal_table(costs: list[float], mems: list[float] | None = None):
    from orchestrator.costmodel.compute import LayerTime
    from orchestrator.costmodel.layer_table import LayerTable, _prefix

    mems = mems or [0.0] * len(costs)
    zeros = [0.0] * len(costs)
    return LayerTable(
        device_type="x",
        microbatch_size=1,
        tp=1,
        times=tuple(LayerTime(c / 3, 2 * c / 3, 0.0, False) for c in costs),
        compute_prefix_s=_prefix(costs),
        update_prefix_s=_prefix(zeros),
        state_prefix_bytes=_prefix(mems),
        activation_prefix_bytes=_prefix(zeros),
        estimated_layers=(),
    )


def _brute_force(stages: list[StageCosts], num_layers: int) -> float | None:
    import itertools

    best = None
    for cuts in itertools.combinations(range(1, num_layers), len(stages) - 1):
        b = (0, *cuts, num_layers)
        if any(
            st.table.memory_bytes(b[i], b[i + 1], st.in_flight) > st.memory_cap_bytes
            for i, st in enumerate(stages)
        ):
            continue
        value = max(st.table.compute_s(b[i], b[i + 1]) + st.comm_s for i, st in enumerate(stages))
        best = value if best is None else min(best, value)
    return best


def test_split_is_exact_when_a_middle_layer_is_slow_on_one_device() -> None:
    # 4 layers of 1 s on 3 stages, except that stage 1's device takes 50 s for layer 2. Filling
    # stage 0 first ([0, 2) within 2 s) forces layer 2 onto stage 1: 50 s. The optimum gives
    # stage 0 one layer, stage 1 layer 1, stage 2 layers 2..3: bottleneck 2 s.
    fast = StageCosts(_literal_table([1.0, 1.0, 1.0, 1.0]), 0.0, 1, float("inf"))
    slow_at_2 = StageCosts(_literal_table([1.0, 1.0, 50.0, 1.0]), 0.0, 1, float("inf"))
    split = split_layers([fast, slow_at_2, fast], 4)
    assert split is not None
    assert split.boundaries == (0, 1, 2, 4)
    assert split.bottleneck_s == pytest.approx(2.0)


def test_split_equals_brute_force_on_random_non_uniform_layers() -> None:
    import random

    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(2, 8)
        p = rng.randint(1, min(4, n))
        stages = [
            StageCosts(
                _literal_table(
                    [rng.choice([0.1, 1.0, 50.0]) * rng.random() for _ in range(n)],
                    [rng.random() for _ in range(n)],
                ),
                rng.choice([0.0, 0.5]),
                1,
                rng.choice([float("inf"), 2.0, 1.0]),
            )
            for _ in range(p)
        ]
        split = split_layers(stages, n)
        want = _brute_force(stages, n)
        assert (split is None) == (want is None)
        if split is not None and want is not None:
            assert split.bottleneck_s == pytest.approx(want, rel=1e-6)
            b = split.boundaries
            assert b[0] == 0 and b[-1] == n
            assert all(x < y for x, y in itertools.pairwise(b))
